"""The recovery-log FSM: which recorded ops form the log's one valid history (sans-IO).

A recovery log may hold more than one history: a recorder that lost its shard (a *zombie*)
can append ops until the new primary's hand-off fences it, and an append retried after a lost
response is written twice. The FSM picks the valid history by two numbers every op carries:

- `seq_no`: the op's position in the history. The next op must carry `next_seq_no`.
- `checksum`: the CRC-32C chained over the serialized bytes of every op applied before it.
  The next op must carry `next_checksum`. Two recorders that start from the same state write
  ops with equal seq_nos but, after their first differing op, different checksums: whichever
  branch the reader applies first wins, and the other's ops no longer apply.

`apply(op, payload)` either steps the FSM (and returns an `Outcome`) or raises an `FSMError`
naming why the op does not belong to the history, changing nothing. The player skips such ops:
that is the normal fate of a zombie's or a duplicate's ops, not a failure.

Files. A file is an *fnode*, named by the seq_no of the Create op that made it; it has one or
more links (paths, relative to the recorded directory, starting with "/"). Link and Unlink
ops add and remove paths; Write ops (whose content follows them in the log) change bytes;
an fnode whose last link is removed is dead. *Properties* are small files tracked by content.

Hints. `build_hints` lists each live fnode with the log segments holding its ops, and the
properties. `FSM.from_hints` makes an FSM that accepts only those segments' ops (by author,
and resuming seq_no and checksum at each segment's start), so a player reads only the parts
of the log live files need and skips obsolete history. An op of a fnode that the hints say is
dead by then still steps the FSM, with Outcome.UNTRACKED: the player does not reenact it.

Segments of a long-lived file. Gazette extends a fnode's last segment over every later op of
the same author, so a file appended to for the store's whole life (RocksDB's MANIFEST and info
LOG) has one segment spanning the whole log, and a player reads every byte ever recorded,
compacted-away files included (2.8 GiB of log for 1 GiB of state, in the playback benchmark).
Here an op more than `SEGMENT_GAP_BYTES` of log past the end of the fnode's previous op
starts a new segment of the same author, so the player skips what lies between; past
`SEGMENTS_PER_FNODE_MAX` segments, the two of one author with the smallest gap between them
are merged again (reading that gap), which bounds the hints. Hints stay Gazette's format: its
FSM and player take same-author segments with gaps between them (SegmentSet, seeking to each),
though its FSM joins them again in the hints it makes. So `gazctl shards prune` keeps what lies
between a file's segments of one author (broker/cli/shards_prune.py): only players skip it.
"""

from __future__ import annotations

import enum
import secrets
from dataclasses import dataclass, field, replace

from broker.protocol.recorded_op_pb2 import FnodeSegments, FSMHints, Property, RecordedOp
from gazette_consumer.recoverylog.ops import checksum_update
from gazette_consumer.recoverylog.segments import InvalidHintsError, Segment, merge_segments

__all__ = [
    "FSM",
    "ChecksumMismatchError",
    "ExpectedHintedFnodeError",
    "FSMError",
    "FnodeState",
    "InvalidHintsError",
    "LinkExistsError",
    "NoSuchLinkError",
    "NotHintedAuthorError",
    "Outcome",
    "PropertyExistsError",
    "WrongSeqNoError",
    "new_random_author",
    "op_kind",
]

AUTHOR_MAX = 0xFFFFFFFF

SEGMENT_GAP_BYTES = 4 << 20
"""Log bytes between two ops of one fnode (and author) past which the later op begins a new
segment: a player skips what lies between rather than reading it (a skip costs one seek; 4 MiB
take a few milliseconds to read)."""

SEGMENTS_PER_FNODE_MAX = 32
"""Segments a fnode keeps: past it, the two of one author with the smallest gap are merged."""


def new_random_author() -> int:
    """A random recorder identity in [1, 2**32 - 1] (zero means "no author")."""
    return secrets.randbelow(AUTHOR_MAX) + 1


# --- Errors: an op that is not part of the history. Raising one changes nothing. -------------


class FSMError(Exception):
    """`op` does not apply to the FSM's history."""

    def __init__(self, op: RecordedOp, reason: str) -> None:
        where = f" at {op.log}:{op.first_offset}" if op.log else ""
        super().__init__(f"op seq_no={op.seq_no} author={op.author:#x}{where}: {reason}")
        self.op = op


class NotHintedAuthorError(FSMError):
    """Hints expect the next op from another author: this op is on a dead branch."""


class WrongSeqNoError(FSMError):
    """Not the next seq_no: a duplicate (lower) or a gap (higher)."""


class ChecksumMismatchError(FSMError):
    """The next seq_no, but written against another history (a zombie's branch)."""


class ExpectedHintedFnodeError(FSMError):
    """Hints say this seq_no creates a live fnode, but the op is not a Create."""


class LinkExistsError(FSMError):
    """The path is already linked."""


class NoSuchLinkError(FSMError):
    """The fnode is not linked at that path."""


class PropertyExistsError(FSMError):
    """The path is a property (with other content)."""


class Outcome(enum.Enum):
    APPLIED = "applied"
    """The FSM stepped; the player reenacts the op locally."""
    UNTRACKED = "untracked"
    """The FSM stepped, but the op names an fnode that is not live (one hints skipped as dead
    later): the player skips reenacting it. Gazette's ErrFnodeNotTracked."""


@dataclass
class FnodeState:
    links: set[str]
    segments: list[Segment] = field(default_factory=list)
    # Where the gap after each segment begins: the end of its last op when read (exact), else
    # that op's start (recorded: the write head before it, a lower bound).
    last_op_offsets: list[int] = field(default_factory=list)


class FSM:
    """See the module docstring. `log` is the log the FSM's ops are read from or recorded to."""

    def __init__(self, log: str) -> None:
        if not log:
            raise InvalidHintsError("log: must be set")
        self.log = log
        self.next_seq_no = 1
        self.next_checksum = 0
        self.properties: dict[str, str] = {}
        self.live_nodes: dict[int, FnodeState] = {}
        self.links: dict[str, int] = {}
        # Ordered segments still to apply, and the live fnodes they create, in order.
        self._hinted_segments: list[Segment] = []
        self._hinted_fnodes: list[int] = []

    @classmethod
    def from_hints(cls, hints: FSMHints) -> FSM:
        """An FSM that rebuilds the state `hints` describe. Raises InvalidHintsError."""
        fsm = cls(hints.log)
        fnodes: list[int] = []
        segments: list[Segment] = []
        for index, node in enumerate(hints.live_nodes):
            where = f"live_nodes[{index}]"
            if not node.segments or node.segments[0].first_seq_no != node.fnode:
                raise InvalidHintsError(f"{where}: first segment must begin at fnode {node.fnode}")
            if fnodes and node.fnode <= fnodes[-1]:
                raise InvalidHintsError(f"{where}: fnodes must be strictly increasing")
            fnodes.append(node.fnode)
            segments.extend(Segment.from_proto(s, hints.log) for s in node.segments)
        merged = merge_segments(segments)
        for segment in merged:
            if segment.log != hints.log:
                raise InvalidHintsError(f"segment {segment}: only the hints' own log is supported")
        fsm._hinted_fnodes = fnodes
        fsm._hinted_segments = merged
        if merged:
            fsm.next_seq_no = merged[0].first_seq_no
            fsm.next_checksum = merged[0].first_checksum
        for prop in hints.properties:
            fsm.properties[prop.path] = prop.content
        return fsm

    @property
    def has_remaining_hints(self) -> bool:
        return bool(self._hinted_segments or self._hinted_fnodes)

    @property
    def next_hinted_segment(self) -> Segment | None:
        """The next segment of the log a player must read, if hints remain."""
        return self._hinted_segments[0] if self._hinted_segments else None

    # --- Transitions -----------------------------------------------------------------------

    def apply(self, op: RecordedOp, payload: bytes) -> Outcome:
        """Step by `op`, whose serialized bytes are `payload`; raise FSMError if it does not
        belong to the history (nothing changes then)."""
        if self._hinted_segments and self._hinted_segments[0].author != op.author:
            raise NotHintedAuthorError(op, "hints expect another author for the next op")
        if op.seq_no != self.next_seq_no:
            raise WrongSeqNoError(op, f"expected seq_no {self.next_seq_no}")
        if op.checksum != self.next_checksum:
            raise ChecksumMismatchError(op, f"expected checksum {self.next_checksum:#010x}")

        kind = op_kind(op)
        if kind != "create" and self._hinted_fnodes and self._hinted_fnodes[0] == op.seq_no:
            raise ExpectedHintedFnodeError(op, "hints say this op creates a live fnode")
        tracked = _TRANSITIONS[kind](self, op)

        self.next_seq_no += 1
        self.next_checksum = checksum_update(self.next_checksum, payload)
        if self._hinted_segments and self._hinted_segments[0].last_seq_no < self.next_seq_no:
            self._hinted_segments.pop(0)
            if self._hinted_segments:
                # Jump over the history between hinted segments: it holds no live file's ops.
                self.next_seq_no = self._hinted_segments[0].first_seq_no
                self.next_checksum = self._hinted_segments[0].first_checksum
        return Outcome.APPLIED if tracked else Outcome.UNTRACKED

    # Each _apply_* checks everything before it mutates, and returns False if the op's fnode
    # is untracked (hinted as dead), in which case it mutated nothing and the FSM still steps.

    def _apply_noop(self, op: RecordedOp) -> bool:
        return True  # A hand-off or barrier op: it only sequences the history.

    def _apply_create(self, op: RecordedOp) -> bool:
        path = op.create.path
        self._check_free(op, path)
        fnode = op.seq_no
        if self._hinted_fnodes:
            if self._hinted_fnodes[0] != fnode:
                return False
            self._hinted_fnodes.pop(0)
        node = FnodeState(links={path})
        self._extend_segments(node, op)
        self.live_nodes[fnode] = node
        self.links[path] = fnode
        return True

    def _apply_link(self, op: RecordedOp) -> bool:
        self._check_free(op, op.link.path)
        node = self.live_nodes.get(op.link.fnode)
        if node is None:
            return self._untracked(op, op.link.fnode)
        node.links.add(op.link.path)
        self.links[op.link.path] = op.link.fnode
        self._extend_segments(node, op)
        return True

    def _apply_unlink(self, op: RecordedOp) -> bool:
        node = self.live_nodes.get(op.unlink.fnode)
        if node is None:
            return self._untracked(op, op.unlink.fnode)
        if op.unlink.path not in node.links:
            raise NoSuchLinkError(op, f"fnode {op.unlink.fnode} has no link {op.unlink.path!r}")
        node.links.discard(op.unlink.path)
        del self.links[op.unlink.path]
        self._extend_segments(node, op)
        if not node.links:
            del self.live_nodes[op.unlink.fnode]
        return True

    def _apply_write(self, op: RecordedOp) -> bool:
        node = self.live_nodes.get(op.write.fnode)
        if node is None:
            return self._untracked(op, op.write.fnode)
        self._extend_segments(node, op)
        return True

    def _apply_property(self, op: RecordedOp) -> bool:
        path, content = op.property.path, op.property.content
        if path in self.links:
            raise LinkExistsError(op, f"property path {path!r} is a linked file")
        if self.properties.get(path, content) != content:
            raise PropertyExistsError(op, f"property {path!r} exists with other content")
        self.properties[path] = content
        return True

    def _check_free(self, op: RecordedOp, path: str) -> None:
        if path in self.links:
            raise LinkExistsError(op, f"path {path!r} is already linked")
        if path in self.properties:
            raise PropertyExistsError(op, f"path {path!r} is a property")

    def _untracked(self, op: RecordedOp, fnode: int) -> bool:
        # The op is in sequence (seq_no and checksum matched), so it is part of the history;
        # its fnode is unknown because hints skipped it as dead by the time they were made.
        # As in Gazette, the FSM steps and the player does not reenact it.
        return False

    def _extend_segments(self, node: FnodeState, op: RecordedOp) -> None:
        segments, ends = node.segments, node.last_op_offsets
        log = op.log or self.log
        if (
            segments
            and segments[-1].author == op.author
            and segments[-1].log == log
            and op.first_offset - ends[-1] <= SEGMENT_GAP_BYTES
        ):
            segments[-1] = replace(segments[-1], last_seq_no=op.seq_no, last_offset=op.last_offset)
            ends[-1] = op.last_offset or op.first_offset
            return
        segments.append(
            Segment(
                author=op.author,
                first_seq_no=op.seq_no,
                first_offset=op.first_offset,
                first_checksum=op.checksum,
                last_seq_no=op.seq_no,
                last_offset=op.last_offset,
                log=log,
            )
        )
        ends.append(op.last_offset or op.first_offset)
        if len(segments) > SEGMENTS_PER_FNODE_MAX:
            _merge_closest(node)

    # --- Hints -----------------------------------------------------------------------------

    def build_hints(self) -> FSMHints:
        """Hints from which `FSM.from_hints` (and a player) rebuild this FSM's live files."""
        hints = FSMHints(log=self.log)
        for fnode in sorted(self.live_nodes):
            hints.live_nodes.append(
                FnodeSegments(
                    fnode=fnode,
                    segments=[s.to_proto(self.log) for s in self.live_nodes[fnode].segments],
                )
            )
        for path in sorted(self.properties):
            hints.properties.append(Property(path=path, content=self.properties[path]))
        return hints


def _merge_closest(node: FnodeState) -> None:
    """Merge the two adjacent segments of `node` of one author and log with the smallest gap
    of log between them (none if every neighbour is another author's: hand-offs, which bound
    themselves). The merged segment covers the ops between, as Gazette's segments do."""
    segments, ends = node.segments, node.last_op_offsets
    pairs = [
        i
        for i in range(len(segments) - 1)
        if segments[i].author == segments[i + 1].author and segments[i].log == segments[i + 1].log
    ]
    if not pairs:
        return
    i = min(pairs, key=lambda k: segments[k + 1].first_offset - ends[k])
    later = segments.pop(i + 1)
    segments[i] = replace(segments[i], last_seq_no=later.last_seq_no, last_offset=later.last_offset)
    ends[i] = ends.pop(i + 1)


def op_kind(op: RecordedOp) -> str:
    """Which operation `op` is: "create", "link", "unlink", "write", "property" or "noop"."""
    # RecordedOp has no oneof (Gazette's proto predates them): at most one field is set.
    for kind in ("create", "link", "unlink", "write", "property"):
        if op.HasField(kind):
            return kind
    return "noop"


_TRANSITIONS = {
    "noop": FSM._apply_noop,
    "create": FSM._apply_create,
    "link": FSM._apply_link,
    "unlink": FSM._apply_unlink,
    "write": FSM._apply_write,
    "property": FSM._apply_property,
}
