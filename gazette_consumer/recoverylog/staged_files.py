"""StagedFiles: the player's local files, staged by fnode until playback completes, then made
live and durable.

A Create makes `.fnodes/<fnode>`; Write content goes into it at its offset; an Unlink of an
fnode's last link removes it. At the end (`make_live`) every live fnode is hard-linked at its
paths, the properties are written, the staging directory is removed, and everything is on disk:
each file fdatasync'd, each directory fsync'd, before the player reports the log recovered. A
store then opens files that are as durable as the ones it writes itself (RocksDB syncs what it
writes and takes the rest as already synced).

Cost. A played file is written in the pieces the log holds it in (a recorder's writes, up to
hundreds of KiB), through a descriptor kept open (at most `OPEN_FILES_MAX`, least recently
written closed first), straight from the log's bytes (no copy). So that the final syncs do not
wait for the whole state to be written back — the page cache would otherwise hold it all until
then — each file written `writeback_bytes` (default `WRITEBACK_BYTES`) more since its last one gets an fdatasync in a worker
thread while playback goes on (at most `WRITEBACKS_IN_FLIGHT_MAX` at once; one that would exceed
it is left to the next): the disk writes back as the player plays, and the final syncs find
little left to write. A failed sync (an I/O error) fails the playback with it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Final

from gazette_consumer.recoverylog.fsm import FSM

__all__ = [
    "FNODES_DIR",
    "OPEN_FILES_MAX",
    "WRITEBACKS_IN_FLIGHT_MAX",
    "WRITEBACK_BYTES",
    "StagedFiles",
    "StagingError",
]

FNODES_DIR: Final = ".fnodes"
"""Sub-directory where files are staged, by fnode, until playback completes."""

OPEN_FILES_MAX: Final = 64
"""Descriptors of staged files kept open between writes."""

WRITEBACK_BYTES: Final = 32 << 20
"""Bytes written to a file after which it is fdatasync'd in the background."""

WRITEBACKS_IN_FLIGHT_MAX: Final = 2
"""Background fdatasyncs queued or running at once."""


class StagingError(Exception):
    """The staged files do not match the FSM's live files (a player bug); names them."""


class StagedFiles:
    """See the module docstring. Not thread-safe: one player drives it from its event loop."""

    def __init__(self, directory: Path, *, writeback_bytes: int = WRITEBACK_BYTES) -> None:
        if writeback_bytes < 1:
            raise ValueError(f"writeback_bytes: must be >= 1 (got {writeback_bytes})")
        self.directory = directory
        self._writeback_bytes = writeback_bytes
        self.staging = directory / FNODES_DIR
        self._fds: OrderedDict[int, int] = OrderedDict()  # fnode -> fd, least recent first.
        self._unsynced: dict[int, int] = {}  # fnode -> bytes written since its last sync.
        self._syncs: list[Future[None]] = []
        self._executor: ThreadPoolExecutor | None = None

    def prepare(self) -> None:
        """An empty directory with an empty staging directory."""
        shutil.rmtree(self.directory, ignore_errors=True)
        self.staging.mkdir(parents=True)

    def create(self, fnode: int) -> None:
        self._path(fnode).touch(exist_ok=False)

    def write(self, fnode: int, data: bytes | memoryview, offset: int) -> None:
        fd = self._fd(fnode)
        written = os.pwrite(fd, data, offset)
        if written != len(data):  # A regular file takes a whole pwrite, or fails (ENOSPC).
            raise OSError(f"{self._path(fnode)}: wrote {written} of {len(data)} bytes")
        unsynced = self._unsynced.get(fnode, 0) + written
        if unsynced >= self._writeback_bytes and self._start_writeback(fd):
            unsynced = 0
        self._unsynced[fnode] = unsynced

    def unlink(self, fnode: int) -> None:
        self._close(fnode)
        self._unsynced.pop(fnode, None)
        self._path(fnode).unlink()

    async def make_live(self, fsm: FSM) -> None:
        """Link staged files at their paths, write properties, drop the staging directory, and
        sync it all (see the module docstring)."""
        self._check_writebacks()
        await asyncio.to_thread(self._make_live, fsm)
        self._check_writebacks()

    def close(self) -> None:
        """Close every descriptor; background syncs finish on their own. Idempotent."""
        for fnode in list(self._fds):
            self._close(fnode)
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False)

    # --- Internals ---------------------------------------------------------------------------

    def _path(self, fnode: int) -> Path:
        return self.staging / str(fnode)

    def _fd(self, fnode: int) -> int:
        fd = self._fds.get(fnode)
        if fd is not None:
            self._fds.move_to_end(fnode)
            return fd
        if len(self._fds) >= OPEN_FILES_MAX:
            self._close(next(iter(self._fds)))
        fd = os.open(self._path(fnode), os.O_WRONLY | os.O_CLOEXEC)
        self._fds[fnode] = fd
        return fd

    def _close(self, fnode: int) -> None:
        fd = self._fds.pop(fnode, None)
        if fd is not None:
            os.close(fd)

    def _start_writeback(self, fd: int) -> bool:
        """fdatasync the file of `fd` in the background, unless too many already run."""
        self._check_writebacks()
        if len(self._syncs) >= WRITEBACKS_IN_FLIGHT_MAX:
            return False
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="playback-sync")
        own = os.dup(fd)  # The player may close `fd` (an unlink) before the sync runs.
        self._syncs.append(self._executor.submit(_sync_and_close, own))
        return True

    def _check_writebacks(self) -> None:
        """Forget finished background syncs; raise the first one's error."""
        running = []
        for future in self._syncs:
            if future.done():
                future.result()
            else:
                running.append(future)
        self._syncs = running

    def _make_live(self, fsm: FSM) -> None:
        for future in self._syncs:
            future.result()
        self._syncs = []
        directories = {self.directory}
        for fnode, node in fsm.live_nodes.items():
            staged = self._path(fnode)
            fd = self._fds.pop(fnode, None)
            if fd is None:
                fd = os.open(staged, os.O_RDONLY | os.O_CLOEXEC)
            _sync_and_close(fd)
            for link in sorted(node.links):
                target = self.directory / link.lstrip("/")
                target.parent.mkdir(parents=True, exist_ok=True)
                directories.update(self._up_to_top(target.parent))
                os.link(staged, target)
            staged.unlink()
        leftover = sorted(p.name for p in self.staging.iterdir())
        if leftover:
            raise StagingError(f"staged files {leftover} are not live in the FSM (a player bug)")
        self.staging.rmdir()
        for path, content in fsm.properties.items():
            target = self.directory / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            directories.update(self._up_to_top(target.parent))
            with open(target, "x", encoding="utf-8") as out:
                out.write(content)
                out.flush()
                os.fdatasync(out.fileno())
        for directory in sorted(directories):  # Each one's entries (links, sub-directories).
            fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _up_to_top(self, directory: Path) -> list[Path]:
        """`directory` and its parents up to the played directory: each got a new entry."""
        out = [directory]
        while directory != self.directory:
            directory = directory.parent
            out.append(directory)
        return out


def _sync_and_close(fd: int) -> None:
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)
