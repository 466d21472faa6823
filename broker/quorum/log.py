"""ReplicaLog: what one member keeps of a journal across restarts.

The model of a member's durable state. The broker records every change of it (log_change.py)
in an append-only log file under its data directory and replays that file on restart
(quorum_shell/log_file.py); the simulation keeps the object across a simulated crash:

  term          the highest term this member was fenced into; it never accepts a message of an
                older term again. Written (synced) before the member answers NewTerm.
  aligned_term  the term whose leader has aligned this log (Truncate or Snapshot): from then on,
                in that term, the log is a prefix of the leader's log. A restarted follower
                therefore needs no second truncation, and a re-delivered Truncate is a no-op.
  aligned_head  the head of the leader that aligned this log, when it did (sent with Truncate
                and Snapshot). A member back from a lost disk votes again only once it holds
                it durably (Rules.may_vote): every entry it acknowledged before the loss that
                counted toward a commit is in that leader's log at or below it.
  led_term      the last term this member led. Leading is once per term: a leader that
                restarts has lost its unsynced entries, which followers may hold, so a
                re-delivered BecomeLeader must not make it lead that term again.
  commit_index  the highest entry this member knows to be committed. Persisted before readers
                may see it, so it never goes back, not even across a restart.
  base          the last entry dropped after reaching the snapshot store (compaction).
  entries       the entries after `base`, in index order; each [begin, end) continues the last.
  registers     the journal's registers as of any index (`registers_at`): carried by the
                entries that changed them and by the base (entry.py).
  synced_index  how far the entries are durable. Followers sync before they acknowledge; a
                leader writes first and syncs asynchronously, counting itself in a majority
                only up to here. `crash()` drops what was never synced.

Entries' terms never decrease along the log, and within a term indices and offsets both grow:
a term opens with an empty barrier entry at the previous end offset.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

from broker.quorum.entry import EMPTY_BASE, ORIGIN, Entry, EntryId, LogBase, Registers
from broker.quorum.errors import (
    LogContiguityError,
    QuorumInvariantError,
    TruncateBelowCommitError,
)
from broker.quorum.log_change import (
    AlignedHeadSet,
    AlignedTermSet,
    CommitSet,
    CompactedThrough,
    EntryAppended,
    LedTermSet,
    LogChange,
    ResetTo,
    TermSet,
    TruncatedAfter,
)


class ReplicaLog:
    """See the module docstring. Mutators check their preconditions first and raise a typed
    error having changed nothing."""

    __slots__ = (
        "_aligned_head",
        "_aligned_term",
        "_entries",
        "_led_term",
        "_register_indices",
        "_term",
        "base",
        "changes",
        "commit_index",
        "drops",
        "synced_index",
    )

    def __init__(self) -> None:
        # Every durable change, in order, while a shell records them (log_change.py): the
        # broker appends them to its log file before anything the change allows is sent.
        # None: not recorded (the simulation keeps the object itself across a crash).
        self.changes: list[LogChange] | None = None
        self._term = 0
        self._aligned_term = 0
        self._aligned_head = ORIGIN
        self._led_term = 0
        self.commit_index = 0
        self.base: LogBase = EMPTY_BASE
        self._entries: list[Entry] = []
        # The indices of the entries that carry registers, ascending (registers_at's index).
        self._register_indices: list[int] = []
        self.synced_index = 0
        # How many times entries were dropped other than by compaction (truncation, snapshot,
        # crash): observers that track what a log holds re-check when it changes.
        self.drops = 0

    def _record(self, change: LogChange) -> None:
        if self.changes is not None:
            self.changes.append(change)

    # --- The terms (each change durable, hence recorded) ---------------------------------------

    @property
    def term(self) -> int:
        return self._term

    @term.setter
    def term(self, term: int) -> None:
        if term != self._term:
            self._term = term
            self._record(TermSet(term))

    @property
    def aligned_term(self) -> int:
        return self._aligned_term

    @aligned_term.setter
    def aligned_term(self, term: int) -> None:
        if term != self._aligned_term:
            self._aligned_term = term
            self._record(AlignedTermSet(term))

    @property
    def aligned_head(self) -> EntryId:
        return self._aligned_head

    @aligned_head.setter
    def aligned_head(self, head: EntryId) -> None:
        if head != self._aligned_head:
            self._aligned_head = head
            self._record(AlignedHeadSet(head))

    @property
    def led_term(self) -> int:
        return self._led_term

    @led_term.setter
    def led_term(self, term: int) -> None:
        if term != self._led_term:
            self._led_term = term
            self._record(LedTermSet(term))

    # --- Reading -----------------------------------------------------------------------------

    @property
    def head(self) -> EntryId:
        if self._entries:
            last = self._entries[-1]
            return EntryId(last.term, last.index)
        return self.base.id

    @property
    def head_index(self) -> int:
        return self._entries[-1].index if self._entries else self.base.index

    @property
    def head_end(self) -> int:
        return self._entries[-1].end if self._entries else self.base.end

    @property
    def entry_count(self) -> int:
        return len(self._entries)

    @property
    def entries(self) -> tuple[Entry, ...]:
        """The entries after the base, in order."""
        return tuple(self._entries)

    @property
    def held_bytes(self) -> int:
        """Bytes of the entries after the base (what compaction bounds)."""
        return self.head_end - self.base.end

    def entry(self, index: int) -> Entry | None:
        """The entry at `index`, or None when compacted or beyond the head."""
        pos = index - self.base.index - 1
        if 0 <= pos < len(self._entries):
            return self._entries[pos]
        return None

    def term_at(self, index: int) -> int | None:
        """The term of the entry at `index`: the base's at the base, None when compacted away
        (below the base) or beyond the head."""
        if index == self.base.index:
            return self.base.term
        found = self.entry(index)
        return found.term if found is not None else None

    def end_at(self, index: int) -> int:
        """The end offset of the entry at `index`, for `index` from the base to the head."""
        if index == self.base.index:
            return self.base.end
        found = self.entry(index)
        if found is None:
            raise IndexError(f"entry {index} is outside [{self.base.index}, {self.head_index}]")
        return found.end

    def has(self, entry_id: EntryId) -> bool:
        """Whether this log holds `entry_id` (at the base counts; below it does not: the term
        of a compacted entry is unknown here)."""
        return self.term_at(entry_id.index) == entry_id.term

    def holds_durably(self, entry_id: EntryId) -> bool:
        """Whether `entry_id` survives a crash here: held and synced, or compacted into the
        snapshot store (everything below the base is committed and stored)."""
        if entry_id.index < self.base.index:
            return True
        return entry_id.index <= self.synced_index and self.has(entry_id)

    def entries_after(self, index: int, entries_max: int, bytes_max: int) -> tuple[Entry, ...]:
        """Entries from `index` + 1 on: at most `entries_max`, and at most `bytes_max` bytes of
        content unless the first entry alone is larger. `index` must not be below the base."""
        pos = index - self.base.index
        if pos < 0:
            raise IndexError(f"entries after {index} are compacted (base {self.base.index})")
        out: list[Entry] = []
        size = 0
        for entry in self._entries[pos : pos + entries_max]:
            size += entry.end - entry.begin
            if out and size > bytes_max:
                break
            out.append(entry)
        return tuple(out)

    def last_of_term(self, term: int) -> EntryId | None:
        """The last entry of exactly `term` held here (the base counts), or None."""
        pos = bisect_right(self._entries, term, key=lambda e: e.term)
        if pos > 0 and self._entries[pos - 1].term == term:
            return self._entries[pos - 1].id
        if self.base.term == term and self.base.index > 0:
            return self.base.id
        return None

    def term_summary(self, after_index: int) -> tuple[EntryId, ...]:
        """The last entry of each term among the entries after `after_index`, oldest first.
        Every term opens with a barrier entry, so this is never longer than the entries it
        summarises (bounded with the log). It must be complete: a shortened summary could make
        a leader truncate entries the follower shares with it, committed ones included."""
        out: list[EntryId] = []
        for entry in reversed(self._entries):
            if entry.index <= after_index:
                break
            if not out or out[-1].term != entry.term:
                out.append(entry.id)
        out.reverse()
        return tuple(out)

    def read(self, begin: int, end: int) -> bytes:
        """Content of [begin, end), for base.end <= begin <= end <= head_end."""
        if not self.base.end <= begin <= end <= self.head_end:
            raise IndexError(f"[{begin}, {end}) is outside [{self.base.end}, {self.head_end})")
        if begin == end:
            return b""
        pos = bisect_right(self._entries, begin, key=lambda e: e.end)
        parts: list[bytes] = []
        while pos < len(self._entries):
            entry = self._entries[pos]
            if entry.begin >= end:
                break
            lo = max(begin, entry.begin) - entry.begin
            hi = min(end, entry.end) - entry.begin
            parts.append(entry.data[lo:hi])
            pos += 1
        return b"".join(parts)

    def registers_at(self, index: int) -> Registers:
        """The journal's registers as of the entry at `index` (from the base to the head):
        those of the last entry at or before it that changed them, or the base's."""
        if not self.base.index <= index <= self.head_index:
            raise IndexError(f"entry {index} is outside [{self.base.index}, {self.head_index}]")
        pos = bisect_right(self._register_indices, index)
        if pos == 0:
            return self.base.registers
        found = self.entry(self._register_indices[pos - 1])
        if found is None or found.registers is None:
            raise QuorumInvariantError(f"register index {self._register_indices[pos - 1]} stale")
        return found.registers

    @property
    def head_registers(self) -> Registers:
        """The registers as of the head: every entry written applied, committed or not."""
        return self.registers_at(self.head_index)

    def index_covering(self, offset: int) -> int:
        """The index of the last entry ending at or before `offset` (the base at least)."""
        pos = bisect_right(self._entries, offset, key=lambda e: e.end)
        return self._entries[pos - 1].index if pos > 0 else self.base.index

    # --- Changing ----------------------------------------------------------------------------

    def append(self, entry: Entry) -> None:
        head = self.head
        if entry.index != head.index + 1 or entry.begin != self.head_end:
            raise LogContiguityError(
                f"entry {entry!r} does not continue the log (head {head} at offset {self.head_end})"
            )
        if entry.term < head.term or entry.end - entry.begin != len(entry.data):
            raise LogContiguityError(f"entry {entry!r}: term below {head.term} or bad length")
        self._entries.append(entry)
        if entry.registers is not None:
            self._register_indices.append(entry.index)
        self._record(EntryAppended(entry))

    def sync(self) -> None:
        """Everything written is durable."""
        self.synced_index = self.head_index

    def truncate_after(self, index: int) -> None:
        """Drop the entries after `index` (durably). Never below the commit index or base."""
        if index < self.commit_index:
            raise TruncateBelowCommitError(
                f"truncation after {index} would drop committed entries (commit {self.commit_index})"
            )
        if index < self.base.index:
            raise TruncateBelowCommitError(f"truncation after {index} is below the base")
        del self._entries[index - self.base.index :]
        del self._register_indices[bisect_right(self._register_indices, index) :]
        self.synced_index = min(self.synced_index, index)
        self.drops += 1
        self._record(TruncatedAfter(index))

    def compact_through(self, index: int) -> None:
        """Drop the entries through `index`, which must be committed (their content is in the
        snapshot store: the caller checks)."""
        if index <= self.base.index:
            return
        if index > self.commit_index:
            raise TruncateBelowCommitError(
                f"compaction through {index} is beyond the commit index {self.commit_index}"
            )
        last = self.entry(index)
        if last is None:
            raise IndexError(f"no entry {index} to compact through")
        registers = self.registers_at(index)
        del self._entries[: index - self.base.index]
        del self._register_indices[: bisect_right(self._register_indices, index)]
        self.base = LogBase(last.term, last.index, last.end, registers)
        self._record(CompactedThrough(index))

    def reset_to(self, base: LogBase) -> None:
        """Replace the whole log by `base` (a snapshot): nothing after it is held."""
        if base.index < self.commit_index:
            raise TruncateBelowCommitError(
                f"snapshot at {base.index} is below the commit index {self.commit_index}"
            )
        self._entries.clear()
        self._register_indices.clear()
        self.base = base
        self.synced_index = base.index
        self.drops += 1
        self._record(ResetTo(base))

    def set_commit(self, index: int) -> bool:
        """Raise the commit index (durably) to `index`, but not past what is synced here: a
        leader may learn of a commit before its own write is durable, and a restarted member
        must still hold every entry up to its commit index. True if it moved."""
        index = min(index, self.synced_index)
        if index <= self.commit_index:
            return False
        self.commit_index = index
        self._record(CommitSet(index))
        return True

    def crash(self) -> None:
        """A process crash (the simulation's): entries never synced are gone."""
        pos = max(self.synced_index - self.base.index, 0)
        del self._entries[pos:]
        del self._register_indices[bisect_right(self._register_indices, self.base.index + pos) :]
        self.drops += 1
        # A recording log models a file whose unsynced tail the crash lost.
        self._record(TruncatedAfter(self.base.index + pos))

    def first_index_at_or_after(self, offset: int) -> int:
        """The index of the first entry ending after `offset` (head_index + 1 if none)."""
        pos = bisect_left(self._entries, offset + 1, key=lambda e: e.end)
        return self._entries[pos].index if pos < len(self._entries) else self.head_index + 1
