"""Buffers of queued appends: in memory up to a bound, then in temporary files, then full.

An AppendService holds the content of every append that was released but has not yet
committed. Most of the time that is little (one batch in flight per journal, the next one
filling), but a journal whose brokers are unreachable accumulates content for as long as the
outage lasts. Content therefore lives in memory while the service's total stays under
`memory_bytes_max`, and beyond that in a temporary file per batch (as Gazette's AppendService
keeps all of it in files: an outage then costs disk, not heap). Past `spill_bytes_max` of files
the budget is *full*, and the service makes writers wait until appends commit.

A batch's content is the bytes written to it, in order: first those that fit in memory, then,
once it has spilled, all later ones in its file (never back to memory, which would reorder
them). Spill files are anonymous (`tempfile.TemporaryFile`), so nothing is left behind on disk
even if the process dies.

Everything here is synchronous: a write to a spill file goes to the OS page cache, as Gazette's
buffered file writes do. Only writing can fail (a full disk): dropping content and closing a
buffer never do I/O that can, so the cleanup of a failing writer never hides its error.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from typing import IO, Final

# Defaults of an AppendService's budget: memory enough for a few full batches of every busy
# journal; disk enough to ride out an outage of minutes at tens of MB/s.
memory_bytes_max_default: Final = 32 << 20
spill_bytes_max_default: Final = 1 << 30
# Spill files are read back in pieces of this size when an append is sent.
spill_read_bytes: Final = 1 << 20
# Writes to a spill file are gathered in memory up to this size (a larger one goes at once).
spill_write_bytes: Final = 64 << 10


class AppendBufferError(RuntimeError):
    """A buffer was used after it was closed."""


class BufferBudget:
    """Bytes held by the buffers of one AppendService, in memory and in spill files.

    Buffers charge the budget as they are written and refund it when closed. `full` says
    whether a new writer must wait; a writer already admitted may overshoot by what it writes
    before it releases (writes are synchronous and cannot wait).
    """

    __slots__ = (
        "bytes_max",
        "memory_bytes",
        "memory_bytes_max",
        "spill_bytes",
        "spill_bytes_max",
        "spill_dir",
    )

    def __init__(
        self,
        *,
        memory_bytes_max: int = memory_bytes_max_default,
        spill_bytes_max: int = spill_bytes_max_default,
        spill_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if memory_bytes_max < 0:
            raise ValueError(f"memory_bytes_max: must be >= 0 (got {memory_bytes_max})")
        if spill_bytes_max < 0:
            raise ValueError(f"spill_bytes_max: must be >= 0 (got {spill_bytes_max})")
        if memory_bytes_max + spill_bytes_max < 1:
            raise ValueError("memory_bytes_max + spill_bytes_max: must be >= 1 (nothing fits)")
        self.memory_bytes_max = memory_bytes_max
        self.spill_bytes_max = spill_bytes_max
        self.spill_dir = spill_dir
        self.bytes_max = memory_bytes_max + spill_bytes_max
        self.memory_bytes = 0
        self.spill_bytes = 0

    @property
    def full(self) -> bool:
        """Whether memory and spill files together hold their combined bound."""
        return self.memory_bytes + self.spill_bytes >= self.bytes_max

    @property
    def spill_full(self) -> bool:
        return self.spill_bytes >= self.spill_bytes_max

    def new_buffer(self) -> AppendBuffer:
        return AppendBuffer(self)


class AppendBuffer:
    """The content of one batch: a bytearray, then (once memory is short) a spill file.

    `size` is the content length and `spilled` whether it has a spill file (plain attributes:
    the service reads them for every write). `checkpoint()` marks the end of released content;
    `rollback()` drops what was written after the mark (an aborted writer). `chunks()` yields
    the content for sending; `close()` refunds the budget and deletes the file.

    A spilled buffer's content is the memory part, then the file's first `_flushed` bytes,
    then `_pending` (writes gathered up to `spill_write_bytes`, so that a publisher's small
    messages do not cost a system call each). Writes go to explicit offsets (`os.pwrite`) of
    an unbuffered file, so only `write` ever does fallible I/O: `rollback`, `chunks` and
    `close` never write, and a full disk cannot make them fail. Bytes of the file past
    `_flushed` (a partial write, a rollback) are never read, and are overwritten by later
    writes.
    """

    __slots__ = (
        "_budget",
        "_closed",
        "_file",
        "_file_bytes",
        "_flushed",
        "_mark",
        "_memory",
        "_pending",
        "size",
        "spilled",
    )

    def __init__(self, budget: BufferBudget) -> None:
        self._budget = budget
        self._memory = bytearray()
        self._file: IO[bytes] | None = None
        self._file_bytes = 0  # _flushed + len(_pending): the spilled part of the content.
        self._flushed = 0
        self._pending = bytearray()
        self._mark = 0
        self._closed = False
        self.size = 0
        self.spilled = False

    def __len__(self) -> int:
        return self.size

    @property
    def memory_bytes(self) -> int:
        return len(self._memory)

    @property
    def spill_bytes(self) -> int:
        return self._file_bytes

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Append `data`: to memory if it fits the budget and nothing was spilled yet, else to
        this buffer's spill file. An OSError from the file leaves the content as it was."""
        if self._closed:
            raise AppendBufferError("append buffer is closed")
        size = len(data)
        budget = self._budget
        if not self.spilled and budget.memory_bytes + size <= budget.memory_bytes_max:
            self._memory += data
            budget.memory_bytes += size
            self.size += size
            return
        if self._file is None:
            self._file = tempfile.TemporaryFile(
                buffering=0, prefix="gazette-append-", dir=budget.spill_dir
            )
            self.spilled = True
        if len(self._pending) + size > spill_write_bytes:
            self._flush_pending()
        if size > spill_write_bytes:
            self._pwrite(data, self._flushed)
            self._flushed += size
        else:
            self._pending += data
        self._file_bytes += size
        budget.spill_bytes += size
        self.size += size

    def _flush_pending(self) -> None:
        """Write `_pending` at `_flushed`. On an error, what was written stays written (and
        counted as flushed), the rest stays pending: the content is unchanged either way."""
        assert self._file is not None
        fd = self._file.fileno()
        view = memoryview(self._pending)
        try:
            while view:
                written = os.pwrite(fd, view, self._flushed)
                self._flushed += written
                view = view[written:]
        finally:
            done = len(self._pending) - len(view)
            view.release()
            del self._pending[:done]

    def _pwrite(self, data: bytes | bytearray | memoryview, offset: int) -> None:
        """Write all of `data` at `offset` (a partial write continues; an error propagates)."""
        assert self._file is not None
        fd = self._file.fileno()
        with memoryview(data) as view:
            while view:
                written = os.pwrite(fd, view, offset)
                offset += written
                view = view[written:]

    def write_released(self, data: bytes | bytearray | memoryview) -> None:
        """`write(data)` then `checkpoint()`, for a writer that releases at once (nothing
        written before it may be unreleased). The in-memory case is inlined: it runs for every
        message a publisher appends."""
        size = len(data)
        budget = self._budget
        if (
            not self.spilled
            and not self._closed
            and budget.memory_bytes + size <= budget.memory_bytes_max
        ):
            self._memory += data
            budget.memory_bytes += size
            self.size = self._mark = self.size + size
            return
        self.write(data)
        self._mark = self.size

    def checkpoint(self) -> int:
        """Mark everything written so far as released; return how many bytes that added."""
        size = self.size
        added, self._mark = size - self._mark, size
        return added

    def rollback(self) -> None:
        """Drop content written since the last checkpoint. Does no I/O that can fail."""
        memory = len(self._memory)
        if self._mark >= memory:
            self._truncate_spill(self._mark - memory)
        else:
            self._truncate_spill(0)
            self._budget.memory_bytes -= memory - self._mark
            del self._memory[self._mark :]
        self.size = self._mark

    def _truncate_spill(self, size: int) -> None:
        """Keep the first `size` bytes of the spilled part (by dropping pending bytes, or by
        forgetting flushed ones: never by writing)."""
        if size >= self._flushed:
            del self._pending[size - self._flushed :]
        else:
            self._pending.clear()
            self._flushed = size
        dropped = self._file_bytes - size
        self._budget.spill_bytes -= dropped
        self.size -= dropped
        self._file_bytes = size

    def chunks(self, chunk_bytes_max: int) -> Iterator[bytes | memoryview]:
        """The content, in pieces of at most `chunk_bytes_max` bytes. May be iterated again
        (a retried append re-sends the same bytes)."""
        if chunk_bytes_max < 1:
            raise ValueError(f"chunk_bytes_max: must be >= 1 (got {chunk_bytes_max})")
        view = memoryview(self._memory)
        for start in range(0, len(view), chunk_bytes_max):
            yield view[start : start + chunk_bytes_max]
        if self._file is None:
            return
        step = min(chunk_bytes_max, spill_read_bytes)
        start = 0
        while start < self._flushed:
            piece = os.pread(self._file.fileno(), min(step, self._flushed - start), start)
            if not piece:
                raise AppendBufferError(f"spill file ended at {start} of {self._flushed} bytes")
            start += len(piece)
            yield piece
        pending = bytes(self._pending)  # A copy: the buffer stays writable meanwhile.
        for start in range(0, len(pending), chunk_bytes_max):
            yield pending[start : start + chunk_bytes_max]

    def close(self) -> None:
        """Refund the budget and delete the spill file. Idempotent, and never raises: it runs
        in the cleanup of a failing writer or service, whose own error must not be replaced
        (the file is unbuffered, so closing it writes nothing)."""
        if self._closed:
            return
        self._closed = True
        self._budget.memory_bytes -= len(self._memory)
        self._budget.spill_bytes -= self._file_bytes
        self._memory = bytearray()
        self._pending = bytearray()
        self._file_bytes = self._flushed = 0
        self.size = 0
        if self._file is not None:
            file, self._file = self._file, None
            with contextlib.suppress(OSError):  # close(2) releases the descriptor regardless.
                file.close()
