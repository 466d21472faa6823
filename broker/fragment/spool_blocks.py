"""Spool files in process memory, made of fixed-size blocks recycled across fragments.

A broker writes every appended byte into a spool. On a file (even on tmpfs) each new fragment's
bytes land in pages the kernel has just allocated, and on a virtual machine pages touched for the
first time are costly: profiles of a broker at R=3 showed the kernel's copy into fresh tmpfs
pages (`copy_folio_from_iter_atomic`) taking a third of a primary's CPU and over half of a
replica's. `BlockSpoolFile` keeps content in `block_bytes` blocks taken from a `BlockPool`;
a closed spool gives its blocks back, and the next fragment writes into pages that are already
resident (a copy into a warm block runs several times faster than into fresh memory).

Memory: a spool holds its content in blocks, as a tmpfs spool holds it in pages: up to a
fragment's target length (plus one append) per journal replicated here, until the fragment is
persisted and the spool closed. On top of that the pool keeps up to `free_blocks_max` free
blocks for re-use (the rest go back to the allocator). `gazette serve --spool-memory` uses these;
the default remains unlinked temporary files (spool_file.TempSpoolFile), whose pages the kernel
can write out under memory pressure when the spool directory is on a disk.

Thread safety: the primary may write a spool on a worker thread while the event loop reads its
committed bytes; writes and reads touch disjoint byte ranges of the same blocks (a bytearray
slice assignment or copy holds the GIL throughout), and the pool is guarded by a lock.
"""

from __future__ import annotations

import errno
import threading
from typing import Final

from broker import metrics
from broker.fragment.spool_file import BytesLike, memory_file_bytes_max_default

block_bytes_default: Final = 2 << 20
"""Block size: large enough that an append of a MiB touches one or two, small enough that a
spool's last, partly filled block wastes little."""
free_blocks_max_default: Final = 128
"""Free blocks a pool keeps for re-use (256 MiB at the default block size)."""


_REUSED: Final = metrics.SPOOL_BLOCKS.labels(source="reused")
_ALLOCATED: Final = metrics.SPOOL_BLOCKS.labels(source="allocated")


class BlockPool:
    """Free blocks of `block_bytes` bytes, shared by the spool files of one broker."""

    __slots__ = ("_free", "_free_blocks_max", "_lock", "block_bytes", "created")

    def __init__(
        self,
        block_bytes: int = block_bytes_default,
        free_blocks_max: int = free_blocks_max_default,
    ) -> None:
        if block_bytes < 1:
            raise ValueError(f"block_bytes: must be >= 1 (got {block_bytes})")
        if free_blocks_max < 0:
            raise ValueError(f"free_blocks_max: must be >= 0 (got {free_blocks_max})")
        self.block_bytes = block_bytes
        self._free_blocks_max = free_blocks_max
        self._free: list[bytearray] = []
        self._lock = threading.Lock()
        self.created = 0  # Blocks allocated rather than re-used (observability, tests).

    def take(self) -> bytearray:
        """A block: a re-used one (holding stale bytes: callers track what they wrote) or a
        new, zeroed one."""
        with self._lock:
            if self._free:
                _REUSED.inc()
                return self._free.pop()
            self.created += 1
        _ALLOCATED.inc()
        return bytearray(self.block_bytes)

    def give(self, blocks: list[bytearray]) -> None:
        """Return blocks taken from this pool; those beyond `free_blocks_max` are dropped."""
        with self._lock:
            room = self._free_blocks_max - len(self._free)
            if room > 0:
                self._free.extend(blocks[:room])

    @property
    def free_blocks(self) -> int:
        return len(self._free)


class BlockSpoolFile:
    """A SpoolFile (spool_file.SpoolFile) in blocks of a BlockPool, bounded by `bytes_max`
    (ENOSPC beyond it, as a full disk would refuse)."""

    __slots__ = ("_blocks", "_bytes_max", "_closed", "_pool", "_size")

    def __init__(self, pool: BlockPool, bytes_max: int = memory_file_bytes_max_default) -> None:
        if bytes_max < 0:
            raise ValueError(f"bytes_max: must be >= 0 (got {bytes_max})")
        self._pool = pool
        self._bytes_max = bytes_max
        self._blocks: list[bytearray] = []
        self._size = 0
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("spool file: used after close()")

    def _reserve(self, end: int) -> None:
        """Blocks to hold bytes [0, end), within bytes_max."""
        if end > self._bytes_max:
            raise OSError(
                errno.ENOSPC,
                f"memory spool file would hold {end} bytes (bytes_max is {self._bytes_max})",
            )
        size = self._pool.block_bytes
        while len(self._blocks) * size < end:
            self._blocks.append(self._pool.take())

    def _copy_in(self, view: memoryview, offset: int) -> None:
        size, blocks = self._pool.block_bytes, self._blocks
        at, n = 0, len(view)
        while at < n:
            index, within = divmod(offset + at, size)
            take = min(size - within, n - at)
            blocks[index][within : within + take] = view[at : at + take]
            at += take

    def _zero(self, begin: int, end: int) -> None:
        # Blocks come back from the pool with stale bytes: a gap must read as zeros.
        if end > begin:
            self._copy_in(memoryview(bytes(end - begin)), begin)

    def pwrite(self, data: BytesLike, offset: int) -> None:
        self._check_open()
        if offset < 0:
            raise ValueError(f"offset: must be >= 0 (got {offset})")
        view = memoryview(data).cast("B")
        end = offset + len(view)
        self._reserve(end)
        self._zero(self._size, offset)
        self._copy_in(view, offset)
        if end > self._size:
            self._size = end

    def pread(self, length: int, offset: int) -> bytes:
        self._check_open()
        if length < 0 or offset < 0:
            raise ValueError(f"length and offset: must be >= 0 (got {length}, {offset})")
        end = min(offset + length, self._size)
        if end <= offset:
            return b""
        size, blocks = self._pool.block_bytes, self._blocks
        first, within = divmod(offset, size)
        if within + (end - offset) <= size:  # The common case: within one block.
            return bytes(memoryview(blocks[first])[within : within + end - offset])
        parts: list[bytes] = []
        at = offset
        while at < end:
            index, within = divmod(at, size)
            take = min(size - within, end - at)
            parts.append(memoryview(blocks[index])[within : within + take].tobytes())
            at += take
        return b"".join(parts)

    def size(self) -> int:
        self._check_open()
        return self._size

    def truncate(self, length: int) -> None:
        self._check_open()
        if length < 0:
            raise ValueError(f"length: must be >= 0 (got {length})")
        if length > self._size:
            self._reserve(length)
            self._zero(self._size, length)
        else:
            keep = -(-length // self._pool.block_bytes)
            if keep < len(self._blocks):
                self._pool.give(self._blocks[keep:])
                del self._blocks[keep:]
        self._size = length

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        blocks, self._blocks, self._size = self._blocks, [], 0
        self._pool.give(blocks)

    @property
    def closed(self) -> bool:
        return self._closed
