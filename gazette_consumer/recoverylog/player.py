"""Player: plays a recovery log from FSMHints into a local directory.

The player reads the log from the first hinted segment (from offset 0 without hints), skipping
to each next hinted segment, decodes ops (ops.py), applies them to an FSM (fsm.py) and reenacts
the applied ones (staged_files.py): a Create makes a staged file `.fnodes/<fnode>`, a Write's
content goes into it, an Unlink of a file's last link removes it. Ops the FSM rejects (a
zombie's, a duplicate, a dead branch) are skipped, their write content discarded; an op showing
that ops of the history are missing (a seq_no gap after the same author's last op, or a first
op beyond 1 from the log's start) fails playback instead (`_skips_history`). When playback
completes, every live fnode is hard-linked at its paths, the properties are written, and all of
it is synced to disk before `play()` returns.

The log's bytes come from a `LogSource` (log_source.py), which reads persisted fragments
straight from their store's files (verified against their names) and the rest through the
broker, ahead of the player: fetching and hashing overlap decoding and writing.

It runs as an explicit state machine (`PlayerState`):

    BACKFILL ──(read through the write head)──> TAIL            (hot standby: blocks for more)
    BACKFILL / TAIL ──finish_at_write_head()──> EXIT_AT_HEAD ──(at head)──> COMPLETE
    BACKFILL / TAIL ──inject_handoff(a)──> INJECT_HANDOFF_AT_HEAD ──(at head: append a no-op
        by `a`, setting the register author=a)──> READ_HANDOFF_BARRIER ──(the no-op applied)──>
        COMPLETE; if another author's op landed first, the no-op does not apply: inject again.

"The write head" is the end of a zero-byte append (a barrier) made when the request arrives:
everything committed before it is read. The hand-off no-op is sequenced after everything the
player read, and its append replaces the `author` register, so the previous recorder's next
append fails its register check (recorder.py): from then on, only `a` can extend the log.

Corruption fails playback with `CorruptLogError`, naming the log and offset: bytes that are not
an op (ops.py), and an op that runs past a write head the player knows (the barrier, or its
hand-off no-op): appends are atomic and recorders (ours and Gazette's) append whole ops, so every
write head is an op boundary. A frame header claiming more bytes than follow it would otherwise
leave the player waiting, in BACKFILL, for content that will never come.

Local writes go to the page cache inline, straight from the log's bytes; the disk writes them
back meanwhile (staged_files.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from broker.client.appender import append
from broker.client.route_cache import JournalClient
from broker.logging import get_logger
from broker.protocol import protocol_pb2 as pb
from broker.protocol.recorded_op_pb2 import FSMHints, RecordedOp
from gazette_consumer.recoverylog.fsm import FSM, FSMError, Outcome, WrongSeqNoError, op_kind
from gazette_consumer.recoverylog.log_source import LogChunk, LogSource
from gazette_consumer.recoverylog.ops import (
    Content,
    CorruptLogError,
    DecodedOp,
    OpDecoder,
    encode_op,
)
from gazette_consumer.recoverylog.recorder import author_fence
from gazette_consumer.recoverylog.staged_files import FNODES_DIR, StagedFiles, StagingError

__all__ = [
    "FNODES_DIR",
    "HandoffError",
    "PlaybackError",
    "Player",
    "PlayerState",
    "Recovered",
    "play_and_handoff",
]

log = get_logger(__name__)

HANDOFF_ATTEMPTS_MAX: Final = 16
"""Hand-off no-ops injected before giving up: each retry means another recorder appended
between our reading the head and our no-op, which a live zombie can do only until fenced."""


class PlayerState(enum.Enum):
    BACKFILL = "backfill"
    TAIL = "tail"
    EXIT_AT_HEAD = "exit_at_head"
    INJECT_HANDOFF_AT_HEAD = "inject_handoff_at_head"
    READ_HANDOFF_BARRIER = "read_handoff_barrier"
    COMPLETE = "complete"


class PlaybackError(Exception):
    """Playback cannot complete; the message names the log and offset."""


class HandoffError(PlaybackError):
    """The hand-off no-op did not apply in HANDOFF_ATTEMPTS_MAX attempts."""


@dataclass(frozen=True)
class Recovered:
    """The outcome of a completed playback: the FSM of the log as read through `write_head`,
    and the author the log was handed to (0 for finish_at_write_head)."""

    fsm: FSM
    directory: Path
    write_head: int
    author: int


class Player:
    """See the module docstring. Call `play()` once; request completion with
    `finish_at_write_head()` or `inject_handoff(author)` (before or while it plays). With
    `direct_reads` false, every byte of the log is read through the broker."""

    def __init__(
        self,
        client: JournalClient,
        hints: FSMHints,
        directory: str | os.PathLike[str],
        *,
        direct_reads: bool = True,
    ) -> None:
        self.client = client
        self.fsm = FSM.from_hints(hints)
        self.directory = Path(directory)
        self.state = PlayerState.BACKFILL
        self.tailing = asyncio.Event()  # Set once playback first reaches the write head.
        self._requested = asyncio.Event()
        self._handoff = 0
        self._handoff_attempts = 0
        self._handoff_applied = False
        self._read_through = 0
        self._next_read = 0  # Offset of the next byte to read.
        self._decoder = OpDecoder(self.fsm.log, 0)
        self._direct_reads = direct_reads
        self._files = StagedFiles(self.directory)
        self.source: LogSource | None = None  # Of the current reading position.
        # Log bytes read straight from fragment files, and through the broker (sources closed).
        self.direct_bytes = 0
        self.broker_bytes = 0
        self._read_task: asyncio.Task[LogChunk] | None = None
        self._reenact = False  # Whether content of the current write goes to its file.
        self._write_fnode = 0
        # Where playback began reading: the first hinted segment's offset (0 without hints).
        self.read_from = 0
        # Without hinted segments the history is played from its first op (seq_no 1).
        self._from_log_start = not self.fsm.has_remaining_hints
        self._last_author: int | None = None  # Of the last op applied (_skips_history).

    @property
    def log(self) -> str:
        return self.fsm.log

    @property
    def played_through(self) -> int:
        """The log offset read (and applied) so far."""
        return self._next_read

    def finish_at_write_head(self) -> None:
        self._request(0)

    def inject_handoff(self, author: int) -> None:
        if author == 0:
            raise ValueError("inject_handoff: author must be non-zero")
        self._request(author)

    def _request(self, author: int) -> None:
        if self._requested.is_set():
            raise RuntimeError("player: completion was already requested")
        self._handoff = author
        self._requested.set()

    async def play(self) -> Recovered:
        """Play until a requested completion; return what was recovered. On error the
        directory is removed (it holds a partial state)."""
        try:
            self._files.prepare()
            self._read_through = await self._barrier()
            self._check_hints_below(self._read_through)
            first = self.fsm.next_hinted_segment
            self.read_from = first.first_offset if first is not None else 0
            await self._seek(self.read_from)
            while self.state is not PlayerState.COMPLETE:
                await self._step()
            try:
                await self._files.make_live(self.fsm)
            except StagingError as err:
                raise PlaybackError(f"{self.log}: {err}") from err
            return Recovered(self.fsm, self.directory, self._next_read, self._handoff)
        except BaseException:
            shutil.rmtree(self.directory, ignore_errors=True)
            raise
        finally:
            await self._close_reader()
            self._files.close()

    # --- The state machine ---------------------------------------------------------------------

    async def _step(self) -> None:
        """One step: act on reaching the head, or take in one chunk or request."""
        segment = self.fsm.next_hinted_segment
        if segment is not None and self._decoder.at_op_boundary:
            if self._next_read < segment.first_offset:
                await self._seek(segment.first_offset)  # Skip obsolete history.
        if self._next_read >= self._read_through and self._decoder.at_op_boundary:
            if await self._on_head():
                return
        if self.state in (PlayerState.BACKFILL, PlayerState.TAIL) and self._requested.is_set():
            self.state = (
                PlayerState.INJECT_HANDOFF_AT_HEAD if self._handoff else PlayerState.EXIT_AT_HEAD
            )
            self._read_through = await self._barrier()
            if self._next_read >= self._read_through:
                self._check_op_boundary_at_head()  # Read up to the new head already.
            return
        await self._read_or_request()

    async def _on_head(self) -> bool:
        """At (or past) `_read_through`, on an op boundary. Returns True if the state moved."""
        if self.fsm.has_remaining_hints:
            raise PlaybackError(
                f"{self.log}: read through the write head {self._read_through} with hinted "
                "segments left unread: possible data loss"
            )
        self.tailing.set()
        if self.state is PlayerState.BACKFILL:
            self.state = PlayerState.TAIL
            return True
        if self.state is PlayerState.EXIT_AT_HEAD:
            self.state = PlayerState.COMPLETE
            return True
        if self.state is PlayerState.INJECT_HANDOFF_AT_HEAD:
            await self._inject()
            self.state = PlayerState.READ_HANDOFF_BARRIER
            return True
        if self.state is PlayerState.READ_HANDOFF_BARRIER:
            # Our no-op was read (it ends the append we read through): did it apply?
            self.state = (
                PlayerState.COMPLETE
                if self._handoff_applied
                else PlayerState.INJECT_HANDOFF_AT_HEAD
            )
            return True
        return False  # TAIL: wait for more.

    async def _inject(self) -> None:
        self._handoff_attempts += 1
        if self._handoff_attempts > HANDOFF_ATTEMPTS_MAX:
            raise HandoffError(
                f"{self.log}: hand-off to {self._handoff:#x} did not apply in "
                f"{HANDOFF_ATTEMPTS_MAX} attempts (another recorder keeps appending)"
            )
        noop = RecordedOp(
            seq_no=self.fsm.next_seq_no, checksum=self.fsm.next_checksum, author=self._handoff
        )
        request = pb.AppendRequest(journal=self.log, union_registers=author_fence(self._handoff))
        response = await append(self.client, request, encode_op(noop))
        self._read_through = response.commit.end

    async def _read_or_request(self) -> None:
        """Take in the next chunk; in BACKFILL or TAIL, a completion request may come first."""
        assert self.source is not None
        if self._read_task is None:
            self._read_task = asyncio.ensure_future(self.source.read_chunk())
        waits: set[asyncio.Future[Any]] = {self._read_task}
        request_wait: asyncio.Task[bool] | None = None
        if self.state in (PlayerState.BACKFILL, PlayerState.TAIL):
            request_wait = asyncio.ensure_future(self._requested.wait())
            waits.add(request_wait)
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if request_wait is not None:
                request_wait.cancel()
        if not self._read_task.done():
            return  # A request: _step handles it (the read stays pending for later).
        task, self._read_task = self._read_task, None
        offset, data = task.result()
        self._feed(offset, data)

    # --- Decoding and reenacting ---------------------------------------------------------------

    def _feed(self, offset: int, data: memoryview) -> None:
        if offset < self._next_read:
            # Read before the player skipped ahead (`_seek`): what lies below is not wanted.
            cut = self._next_read - offset
            if cut >= len(data):
                return
            offset, data = self._next_read, data[cut:]
        if offset != self._next_read:
            # Content between was deleted (an offset jump). Harmless between ops outside the
            # hinted segments; anything else loses history.
            segment = self.fsm.next_hinted_segment
            if not self._decoder.at_op_boundary or (
                segment is not None and segment.first_offset < offset
            ):
                raise CorruptLogError(
                    self.log, self._next_read, f"content missing up to offset {offset}"
                )
            log.warning("recovery log offset jump", log=self.log, at=self._next_read, to=offset)
            self._decoder = OpDecoder(self.log, offset)
        self._next_read = offset
        head = self._read_through
        if offset < head <= offset + len(data):
            # The chunk reaches the head the player knows: an op must end exactly there.
            self._take(data[: head - offset])
            self._check_op_boundary_at_head()
            data = data[head - offset :]
        self._take(data)

    def _take(self, data: memoryview) -> None:
        self._next_read += len(data)
        for event in self._decoder.feed(data):
            if isinstance(event, Content):
                if self._reenact:
                    self._files.write(self._write_fnode, event.data, event.file_offset)
            else:
                self._on_op(event)

    def _check_op_boundary_at_head(self) -> None:
        """Read exactly through `_read_through`, a write head: an op must not run past it (see
        the module docstring)."""
        if not self._decoder.at_op_boundary:
            raise CorruptLogError(
                self.log,
                self._decoder.offset,
                f"a recorded op runs past the write head {self._read_through} (its frame or"
                " write length claims bytes that no append wrote)",
            )

    def _on_op(self, decoded: DecodedOp) -> None:
        op = decoded.op
        try:
            outcome = self.fsm.apply(op, decoded.payload)
        except FSMError as err:
            if isinstance(err, WrongSeqNoError) and self._skips_history(op):
                raise CorruptLogError(
                    self.log,
                    op.first_offset,
                    f"ops {self.fsm.next_seq_no}..{op.seq_no - 1} of the history are missing"
                    f" from the log (op {op.seq_no} of author {op.author:#x} follows"
                    f" {self._history_so_far()}): content lost; the recorded state cannot be"
                    " recovered from this log",
                ) from err
            # A zombie's op, a duplicate, or a dead branch: not part of the history.
            log.debug("recovery log op skipped", log=self.log, error=str(err))
            self._reenact = False
            return
        self._last_author = op.author
        applied = outcome is Outcome.APPLIED
        if self._handoff and op.author == self._handoff and op_kind(op) == "noop":
            self._handoff_applied = applied or self._handoff_applied
        self._reenact = applied and op.HasField("write")
        if not applied:
            return
        if op.HasField("create"):
            self._files.create(op.seq_no)
        elif op.HasField("write"):
            self._write_fnode = op.write.fnode
        elif op.HasField("unlink") and op.unlink.fnode not in self.fsm.live_nodes:
            self._files.unlink(op.unlink.fnode)

    def _skips_history(self, op: RecordedOp) -> bool:
        """Whether `op`, refused for its seq_no, shows that ops of the history are missing
        (rather than being a zombie's, a duplicate, or a dead branch's, which are skipped).

        One author numbers its ops without a gap, so an op of the author of the last op
        applied whose seq_no is beyond the next one follows lost ops of the history. So does
        a first op beyond 1 where playback began at the log's start (no hints): the log's
        beginning is gone. Without this check such a gap is skipped like a zombie's ops and
        the state recovered is an older one, or empty (Gazette's player does skip it)."""
        if op.seq_no <= self.fsm.next_seq_no:
            return False
        if self._last_author is not None:
            return op.author == self._last_author
        return self._from_log_start and self.fsm.next_seq_no == 1

    def _history_so_far(self) -> str:
        if self._last_author is None:
            return "the log's start"
        return f"op {self.fsm.next_seq_no - 1} of author {self._last_author:#x}"

    # --- Reading -------------------------------------------------------------------------------

    async def _barrier(self) -> int:
        """The log's write head, as of a zero-byte append made now."""
        response = await append(self.client, pb.AppendRequest(journal=self.log))
        return response.commit.end

    async def _seek(self, offset: int) -> None:
        """Read on from `offset` (on an op boundary): a skip ahead over obsolete history keeps
        the source, which drops what lies below (a pending read's chunk too: `_feed`)."""
        if self.source is None or offset < self._next_read:
            await self._close_reader()
            self.source = LogSource(
                self.client,
                self.log,
                offset,
                direct_end=self._read_through,
                direct=self._direct_reads,
            )
            await self.source.start()
        else:
            self.source.skip_to(offset)
        self._next_read = offset
        self._decoder = OpDecoder(self.log, offset)

    async def _close_reader(self) -> None:
        task, self._read_task = self._read_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        source, self.source = self.source, None
        if source is not None:
            await source.close()
            self.direct_bytes += source.direct_bytes
            self.broker_bytes += source.broker_bytes

    def _check_hints_below(self, head: int) -> None:
        segment = self.fsm.next_hinted_segment
        if segment is not None and segment.first_offset >= head:
            raise PlaybackError(
                f"{self.log}: write head {head} is not past hinted segment {segment}: "
                "possible data loss"
            )


async def play_and_handoff(
    client: JournalClient, hints: FSMHints, directory: str | os.PathLike[str], author: int
) -> Recovered:
    """Play the log to its head and hand it off to `author` (what a new primary does)."""
    player = Player(client, hints, directory)
    player.inject_handoff(author)
    return await player.play()
