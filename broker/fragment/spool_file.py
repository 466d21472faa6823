"""Content files of a Spool: positional reads and writes, nothing else.

A Spool writes a fragment's content at explicit offsets (a content chunk lands at the fragment's
length plus the pending delta; a rolled-back chunk is simply overwritten by the next one), and
readers of the journal read committed bytes at explicit offsets while the spool keeps writing
beyond them. Positional I/O (`pwrite`/`pread`) is what makes that safe without a shared file
position, so the abstraction is exactly that, plus `size`, `truncate` and `close`.

Two implementations:

- `MemorySpoolFile`: a bytearray, for tests and the deterministic simulation. It has a byte bound
  and reports running out of it the way a full disk does (`OSError(ENOSPC)`), so fault tests can
  exercise the spool's I/O error paths with a real file-like value instead of a mock.
- `TempSpoolFile`: an unlinked temporary file, as Gazette's brokers use. Its directory entry is
  gone at creation, so the space is returned to the file system when the file is closed or the
  process dies, and a broker restart leaves no stale spool files to clean up. Used for scratch
  (compressed copies), and for spools when the broker has no data directory: their content then
  lives only as long as the process, until the BLOB store holds it.
- `spool_dir.NamedSpoolFile` (a `DurableSpoolFile`): a named file under the broker's data
  directory, which a restarted broker recovers (spool_dir.py, spool_recovery.py).
"""

from __future__ import annotations

import errno
import os
import tempfile
from typing import Final, Protocol, TypeAlias, runtime_checkable

# What a spool file writes: any contiguous bytes, so that callers may hand over slices
# (memoryviews) of larger buffers without copying them first.
BytesLike: TypeAlias = bytes | bytearray | memoryview

# MemorySpoolFile's default capacity. Spools hold up to a fragment's target length plus one
# append, so 1 GiB is far above what a test or simulation writes, yet stops a runaway writer
# before it exhausts the host's memory.
memory_file_bytes_max_default: Final = 1 << 30


class SpoolFile(Protocol):
    """A random-access byte file owned by one writer.

    Offsets and lengths are non-negative; implementations raise `ValueError` otherwise, and
    `ValueError` for any use after `close()`. I/O failures raise `OSError`.
    """

    def pwrite(self, data: BytesLike, offset: int) -> None:
        """Write all of `data` at `offset`, extending the file (zero-filling any gap)."""
        ...

    def pread(self, length: int, offset: int) -> bytes:
        """Read up to `length` bytes at `offset`: fewer only where the file ends."""
        ...

    def size(self) -> int:
        """The file's length in bytes."""
        ...

    def truncate(self, length: int) -> None:
        """Cut (or zero-extend) the file to exactly `length` bytes."""
        ...

    def close(self) -> None:
        """Release the file. Idempotent."""
        ...

    @property
    def closed(self) -> bool: ...


def _check_offset(name: str, value: int) -> None:
    if value < 0:
        raise ValueError(f"{name}: must be >= 0 (got {value})")


class MemorySpoolFile:
    """A SpoolFile held in memory, bounded by `bytes_max` (see the module docstring)."""

    __slots__ = ("_buf", "_bytes_max", "_closed")

    def __init__(self, bytes_max: int = memory_file_bytes_max_default) -> None:
        _check_offset("bytes_max", bytes_max)
        self._buf = bytearray()
        self._bytes_max = bytes_max
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("spool file: used after close()")

    def _check_capacity(self, length: int) -> None:
        if length > self._bytes_max:
            raise OSError(
                errno.ENOSPC,
                f"memory spool file would hold {length} bytes (bytes_max is {self._bytes_max})",
            )

    def pwrite(self, data: BytesLike, offset: int) -> None:
        self._check_open()
        _check_offset("offset", offset)
        end = offset + len(data)
        self._check_capacity(end)
        if offset > len(self._buf):
            self._buf.extend(bytes(offset - len(self._buf)))
        self._buf[offset:end] = data

    def pread(self, length: int, offset: int) -> bytes:
        self._check_open()
        _check_offset("length", length)
        _check_offset("offset", offset)
        return bytes(self._buf[offset : offset + length])

    def size(self) -> int:
        self._check_open()
        return len(self._buf)

    def truncate(self, length: int) -> None:
        self._check_open()
        _check_offset("length", length)
        self._check_capacity(length)
        if length < len(self._buf):
            del self._buf[length:]
        else:
            self._buf.extend(bytes(length - len(self._buf)))

    def close(self) -> None:
        self._closed = True
        self._buf = bytearray()

    @property
    def closed(self) -> bool:
        return self._closed


class FdSpoolFile:
    """A SpoolFile over an open file descriptor, which it owns (closes)."""

    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def _open_fd(self) -> int:
        if self._fd is None:
            raise ValueError("spool file: used after close()")
        return self._fd

    def pwrite(self, data: BytesLike, offset: int) -> None:
        fd = self._open_fd()
        _check_offset("offset", offset)
        view = memoryview(data)
        # pwrite may write less than asked (signals, quotas); loop until all of it is down.
        while view:
            written = os.pwrite(fd, view, offset)
            if written <= 0:
                raise OSError(errno.EIO, f"pwrite wrote {written} bytes at offset {offset}")
            view = view[written:]
            offset += written

    def pread(self, length: int, offset: int) -> bytes:
        fd = self._open_fd()
        _check_offset("length", length)
        _check_offset("offset", offset)
        parts: list[bytes] = []
        remaining = length
        while remaining:
            part = os.pread(fd, remaining, offset)
            if not part:
                break  # End of file.
            parts.append(part)
            remaining -= len(part)
            offset += len(part)
        return b"".join(parts)

    def size(self) -> int:
        return os.fstat(self._open_fd()).st_size

    def truncate(self, length: int) -> None:
        fd = self._open_fd()
        _check_offset("length", length)
        os.ftruncate(fd, length)

    def sync(self) -> None:
        """fdatasync: the content (and the size) reach the disk, not only the OS."""
        os.fdatasync(self._open_fd())

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    @property
    def closed(self) -> bool:
        return self._fd is None

    def __del__(self) -> None:
        # A spool file dropped without close() (e.g. a crashed task) must not leak its
        # descriptor, or an unlinked file's space would stay allocated until process exit.
        # (`_fd` is unset if __init__ failed before opening anything.)
        if getattr(self, "_fd", None) is not None:
            self.close()


class TempSpoolFile(FdSpoolFile):
    """A SpoolFile on an unlinked temporary file in `directory` (the system default if None)."""

    __slots__ = ()

    def __init__(self, directory: str | None = None) -> None:
        fd, path = tempfile.mkstemp(prefix="spool-", dir=directory)
        try:
            # Unlink at once: the open descriptor keeps the data alive for exactly as long as
            # we need it, and nothing is left behind if the process is killed.
            os.unlink(path)
        except BaseException:
            os.close(fd)
            raise
        super().__init__(fd)


@runtime_checkable
class DurableSpoolFile(SpoolFile, Protocol):
    """A SpoolFile with a name on disk that outlives the process (spool_dir.NamedSpoolFile):
    whoever is done with its content for good removes that name, or a restarted broker would
    recover the content again."""

    def unlink_durable(self) -> None:
        """Remove the file's names (content and commit record). Still readable until closed."""
        ...


def unlink_durable(file: SpoolFile) -> None:
    """`file.unlink_durable()` for a durable file; nothing for another (its content goes with
    it anyway)."""
    if isinstance(file, DurableSpoolFile):
        file.unlink_durable()
