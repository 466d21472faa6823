"""Recorder: turns file operations of a local directory into ops appended to a recovery log.

The Recorder records operations that already happened locally (the store made them): a file
created, written, linked, unlinked or renamed, a property set. Each is sequenced through the
recorder's FSM — which checks it against the directory's recorded state, so an impossible op
raises RecorderUsageError and records nothing — framed, and buffered. Buffered ops (with write
content) are appended in batches of about `batch_bytes_max`: when the buffer fills, and on
`flush()`, which returns once everything recorded before it is durable in the log.

Fencing (docs/architecture.md, Invariants). Every append checks the journal register `author=<this
recorder's
author>`. The player of a new primary sets that register to its own author with its hand-off
(see player.py), after which this recorder's appends fail with REGISTER_MISMATCH, and it raises
RecorderFencedError from then on: a zombie can no longer extend the log. Its ops that did land
before the hand-off are part of the history the new primary recovered. Any other failed append
leaves the FSM ahead of the log: the recorder is then unusable (RecorderFailedError); its
shard must recover anew.

An append retried after a lost response may land twice; the copy's ops carry the seq_nos of
the first, so players skip them (WrongSeqNoError), as in Gazette.

Paths are recorded relative to the directory, as "/a/b", so a log plays back anywhere.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path, PurePosixPath
from typing import Final

from broker.client.appender import append
from broker.client.route_cache import JournalClient
from broker.protocol import protocol_pb2 as pb
from broker.protocol.recorded_op_pb2 import FSMHints, Property, RecordedOp
from broker.protocol.status import RegisterMismatchError
from gazette_consumer.recoverylog.fsm import FSM, FSMError, Outcome
from gazette_consumer.recoverylog.ops import encode_op

__all__ = [
    "AUTHOR_REGISTER",
    "Recorder",
    "RecorderError",
    "RecorderFailedError",
    "RecorderFencedError",
    "RecorderUsageError",
    "author_fence",
]

AUTHOR_REGISTER: Final = "author"

BATCH_BYTES_MAX: Final = 1 << 20
"""Buffered bytes (frames and write content) past which a record call appends the batch."""

WRITE_CHUNK_BYTES_MAX: Final = 1 << 18
"""Largest content of one Write op: larger writes are recorded as several ops, so that a
batch stays near its bound and a player streams content in bounded pieces."""


def author_fence(author: int) -> pb.LabelSet:
    """The register value that fences appends to `author` (base 32, as Gazette spells it)."""
    if not 0 < author <= 0xFFFFFFFF:
        raise ValueError(f"author: must be in [1, 2**32-1] (got {author})")
    digits, value = "", author
    while value:
        value, digit = divmod(value, 32)
        digits = "0123456789abcdefghijklmnopqrstuv"[digit] + digits
    return pb.LabelSet(labels=[pb.Label(name=AUTHOR_REGISTER, value=digits)])


# A batch's append is retried (a broker restarting, a journal short of brokers) up to this
# many attempts, after back-offs doubling up to the cap: about half a minute in all, long enough
# to ride out a broker's restart, and a retry at least every second, so that the shard's
# transactions go on within a second of the log taking appends again (the append helper's
# 5 s cap could add up to 5 s to every recovery behind it).
append_attempts_max: Final = 32
append_backoff_cap_s: Final = 1.0


class RecorderError(Exception):
    """Base of the Recorder's errors."""


class RecorderFencedError(RecorderError):
    """Another author took over the log (a hand-off): this recorder may append no more."""


class RecorderFailedError(RecorderError):
    """An append failed: the log lacks ops the recorder's FSM has applied, so it is unusable."""


class RecorderUsageError(RecorderError, ValueError):
    """An operation that does not fit the recorded directory (unknown path, path outside the
    directory, a link over an existing path, ...). Nothing was recorded."""


class Recorder:
    """See the module docstring. `fsm` is the state the log holds (from a Player, which also
    injected the hand-off to `author`); `write_head` is the log offset it was read through."""

    def __init__(
        self,
        client: JournalClient,
        fsm: FSM,
        author: int,
        directory: str | os.PathLike[str],
        *,
        write_head: int,
        batch_bytes_max: int = BATCH_BYTES_MAX,
        write_chunk_bytes_max: int = WRITE_CHUNK_BYTES_MAX,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if batch_bytes_max < 1 or write_chunk_bytes_max < 1:
            raise ValueError("batch_bytes_max and write_chunk_bytes_max: must be >= 1")
        self.client = client
        self.fsm = fsm
        self.author = author
        self.directory = Path(directory).resolve()
        self.write_head = write_head
        self._check = pb.LabelSelector(include=author_fence(author))
        self._batch_bytes_max = batch_bytes_max
        self._write_chunk_bytes_max = write_chunk_bytes_max
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._lock = asyncio.Lock()  # One append at a time, in recording order.
        self._sleep = sleep  # Between attempts of an append.
        self._failed: RecorderError | None = None

    @property
    def log(self) -> str:
        return self.fsm.log

    # --- Recording ---------------------------------------------------------------------------

    async def create(self, path: str | os.PathLike[str]) -> int:
        """Record the creation (or truncation, if it exists) of the file at `path`; return its
        fnode."""
        rel = self._relative(path)
        if rel in self.fsm.links:
            self._process(RecordedOp(unlink=RecordedOp.Link(fnode=self.fsm.links[rel], path=rel)))
        self._process(RecordedOp(create=RecordedOp.Create(path=rel)))
        fnode = self.fsm.links[rel]
        await self._flush_if_full()
        return fnode

    async def write_at(self, fnode: int, data: bytes, offset: int) -> None:
        """Record that `data` was written at `offset` of the file `fnode`."""
        if offset < 0:
            raise RecorderUsageError(f"write_at: offset must be >= 0 (got {offset})")
        view = memoryview(data)
        for start in range(0, len(view), self._write_chunk_bytes_max):
            piece = bytes(view[start : start + self._write_chunk_bytes_max])
            write = RecordedOp.Write(fnode=fnode, offset=offset + start, length=len(piece))
            self._process(RecordedOp(write=write), piece)
            await self._flush_if_full()

    async def link(self, src: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
        """Record a hard link of the file at `src` at `target`."""
        fnode = self._fnode_at(src)
        self._process(RecordedOp(link=RecordedOp.Link(fnode=fnode, path=self._relative(target))))
        await self._flush_if_full()

    async def unlink(self, path: str | os.PathLike[str]) -> None:
        """Record the removal of the link at `path`."""
        rel = self._relative(path)
        self._process(RecordedOp(unlink=RecordedOp.Link(fnode=self._fnode_at(path), path=rel)))
        await self._flush_if_full()

    async def rename(self, src: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
        """Record an atomic rename of `src` to `target` (replacing any file at `target`)."""
        fnode, rel_src, rel_target = (
            self._fnode_at(src),
            self._relative(src),
            self._relative(target),
        )
        if rel_src == rel_target:
            return
        ops = []
        if rel_target in self.fsm.links:
            prev = self.fsm.links[rel_target]
            ops.append(RecordedOp(unlink=RecordedOp.Link(fnode=prev, path=rel_target)))
        ops.append(RecordedOp(link=RecordedOp.Link(fnode=fnode, path=rel_target)))
        ops.append(RecordedOp(unlink=RecordedOp.Link(fnode=fnode, path=rel_src)))
        for op in ops:
            self._process(op)
        await self._flush_if_full()

    async def set_property(self, path: str | os.PathLike[str], content: str) -> None:
        """Record a property: a small file tracked by content (set once; see fsm.py)."""
        prop = Property(path=self._relative(path), content=content)
        self._process(RecordedOp(property=prop))
        await self._flush_if_full()

    # --- Durability --------------------------------------------------------------------------

    async def flush(self) -> None:
        """Return once everything recorded so far is durable in the log. Raises
        RecorderFencedError if another author took over the log."""
        async with self._lock:
            self._check_usable()
            if not self._pending:
                return
            batch_bytes = self._pending_bytes
            batch, self._pending, self._pending_bytes = self._pending, [], 0
            try:
                response = await self._append_checked(batch, "; its pending ops were not appended")
            except RecorderFencedError:
                raise
            except Exception as err:
                self._failed = RecorderFailedError(
                    f"recorder {self.author:#x} of {self.log}: append failed: {err!r}"
                )
                raise self._failed from err
            except BaseException:
                # Cancelled while its batch was in flight: the ops left `_pending` and may or
                # may not be in the log, while the FSM holds them. A later flush would report
                # durable what it never appended (the player skips ops after a seq_no gap), so
                # the recorder is unusable from here, as after a failed append.
                self._failed = RecorderFailedError(
                    f"recorder {self.author:#x} of {self.log}: a flush was cancelled while its"
                    f" {batch_bytes} bytes of ops were being appended"
                )
                raise
            if response.commit.begin < self.write_head:
                # The log's head went back below what this recorder had read or appended
                # through: every replica lost the log's last content (a journal reset after
                # they all died). Ops this recorder made durable are gone from the log, and
                # these new ones follow a gap no player can cross: nothing recorded from here
                # on could be recovered. As Gazette's recorder ("broker data loss?").
                self._failed = RecorderFailedError(
                    f"recorder {self.author:#x} of {self.log}: its append landed at"
                    f" {response.commit.begin}, below the write head {self.write_head} it had"
                    " read or appended through: the log lost content (broker data loss?)"
                )
                raise self._failed
            self.write_head = max(self.write_head, response.commit.end)

    barrier = flush

    async def build_hints(self) -> FSMHints:
        """Hints of the recorded state, once every op they name is durable and this recorder
        is still the log's author (RecorderFencedError otherwise).

        The hints are taken first, then the ops recorded so far are flushed: ops recorded
        while the flush waits (a pipelined commit, say) are not named by these hints, so
        hints never name an op the log may lack. With nothing to flush, a zero-byte append
        checks the author register all the same (as Gazette's hints barrier): a zombie
        resumed after another primary took the log over is fenced here, rather than store
        its stale hints over the new primary's."""
        hints = self.fsm.build_hints()
        if self._pending:
            await self.flush()
        else:
            await self._fenced_barrier()
        return hints

    async def _fenced_barrier(self) -> None:
        async with self._lock:
            self._check_usable()
            await self._append_checked(b"", "")

    async def _append_checked(self, content: bytes | list[bytes], fenced: str) -> pb.AppendResponse:
        """Append `content` with the author register checked. RecorderFencedError (the
        recorder unusable from then on, `fenced` added to its message) if another author took
        over the log; other failures as `append` raises them."""
        request = pb.AppendRequest(journal=self.log, check_registers=self._check)
        try:
            return await append(
                self.client,
                request,
                content,
                attempts_max=append_attempts_max,
                backoff_cap_s=append_backoff_cap_s,
                sleep=self._sleep,
            )
        except RegisterMismatchError as err:
            self._failed = RecorderFencedError(
                f"recorder {self.author:#x} of {self.log}: fenced (another author took over "
                f"the log){fenced}"
            )
            raise self._failed from err

    # --- Internals ---------------------------------------------------------------------------

    def _process(self, op: RecordedOp, content: bytes = b"") -> None:
        """Sequence `op` through the FSM and buffer its frame and content."""
        self._check_usable()
        op.author, op.seq_no, op.checksum = (
            self.author,
            self.fsm.next_seq_no,
            self.fsm.next_checksum,
        )
        frame = encode_op(op)
        # The write head before our append lower-bounds the op's offset: hints built from the
        # FSM let a player skip to it.
        op.first_offset, op.log = self.write_head, self.log
        try:
            outcome = self.fsm.apply(op, frame[8:])
        except FSMError as err:
            raise RecorderUsageError(f"cannot record {op}: {err}") from err
        if outcome is not Outcome.APPLIED:
            raise RecorderUsageError(f"cannot record {op}: it names an fnode that is not live")
        self._pending.append(frame)
        self._pending_bytes += len(frame)
        if content:
            self._pending.append(content)
            self._pending_bytes += len(content)

    async def _flush_if_full(self) -> None:
        if self._pending_bytes >= self._batch_bytes_max:
            await self.flush()

    def _fnode_at(self, path: str | os.PathLike[str]) -> int:
        rel = self._relative(path)
        fnode = self.fsm.links.get(rel)
        if fnode is None:
            raise RecorderUsageError(f"no recorded file at {rel!r}")
        return fnode

    def _relative(self, path: str | os.PathLike[str]) -> str:
        """`path` (absolute, or relative to the directory) as a recorded path "/a/b"."""
        candidate = Path(path)
        if not candidate.is_absolute():
            candidate = self.directory / candidate
        try:
            rel = PurePosixPath(os.path.normpath(candidate)).relative_to(self.directory)
        except ValueError:
            raise RecorderUsageError(f"{path!s} is outside {self.directory}") from None
        if not rel.parts or rel.parts[0] == ".fnodes":
            raise RecorderUsageError(f"{path!s}: not a file path that can be recorded")
        return "/" + rel.as_posix()

    def _check_usable(self) -> None:
        if self._failed is not None:
            raise self._failed
