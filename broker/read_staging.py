"""Verifying a stored fragment whole before a broker serves any byte of it.

A fragment's SHA1 can only be checked at its end (verify.py). A read that streams a stored
fragment as it decodes it has served every byte of it by the time a mismatch shows: a consumer
shard has processed, and may have committed, whatever the damaged bytes decoded to before its
read fails with DATA_LOSS. FragmentContentReader verifies fragments up to 1 MiB in memory
before handing out their first byte; for longer ones (Gazette's default fragment length is
512 MiB) a broker does one of two things:

- **Staged** (`StagingArea`): it decodes the stored file into an unlinked scratch file (where
  the spools' scratch goes: the data directory, `--spool-dir`, or the system's temporary
  directory, which may be a memory-backed tmpfs: give such a broker `--spool-dir`; never the
  memory spools' blocks), verifies it, and serves the read from that file. Reads of one fragment at the same time share one copy (one download). The
  area holds at most `bytes_max` bytes of copies at once, and stages a copy only if the file
  system keeps a quarter of its size free after it, or 8 GiB on a larger one (spools write
  there too: a read must not make an append fail for want of disk).
- **Verified first** (read_serve.py): with no room for a copy now (other reads hold it, the
  fragment is longer than the whole room, or the disk is fuller than that), the read decodes and verifies the stored file once
  without keeping it, then reads it again and streams it (verified again as it streams). It
  costs a second download, not a wait: a client that stops reading and so holds its copy
  makes other reads slower, never unavailable. Its one gap: a file that changes between the
  two reads fails at its end, after its bytes were served (the error says how many).

What either costs: the first byte of a large stored fragment waits for its whole download and
decode (as long as reading it all would have taken). Reads near the write head read spools,
not stores, and are neither.

A staged copy lives while a read uses it: the last read to let go of it has its file closed and
its room freed (once a write in progress has ended); if no read wants it any more before it is
complete, the staging is cancelled. A staging that fails is not kept: the next read stages
afresh.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from types import TracebackType
from typing import Final, NamedTuple

from broker import metrics
from broker.client.reader import FragmentContentReader, verify_whole_bytes_max_default
from broker.fragment import naming
from broker.fragment.spool_file import SpoolFile
from broker.fragment.stores.base import FragmentReader, run_blocking_put
from broker.fragment.verify import FragmentIntegrityError
from broker.logging import get_logger
from broker.protocol import protocol_pb2 as pb

__all__ = [
    "DiskSpace",
    "OpenRaw",
    "StagedCopy",
    "StagingArea",
    "StagingError",
    "disk_space_of",
    "keep_free_fraction_default",
    "stage_bytes_max_default",
]

# Bytes of staged copies one broker holds at once: room for several reads of Gazette's default
# 512 MiB fragments, on the disk of the spools' scratch.
stage_bytes_max_default: Final = 4 << 30
# Pieces a staged file is written in, each by a worker thread (a full disk's write-back can
# block a write for long: never the event loop's).
_stage_piece_bytes: Final = 4 << 20

log = get_logger(__name__)

# A copy is staged only if its file system keeps this fraction of its size free after it, or
# keep_free_bytes_max on a larger one (spools write there too).
keep_free_fraction_default: Final = 0.25
keep_free_bytes_max: Final = 8 << 30

_STAGED: Final = metrics.READ_VERIFIED_WHOLE.labels(how="staged")


class DiskSpace(NamedTuple):
    """Bytes of a file system: free (to an unprivileged user) and its size."""

    free: int
    total: int


def disk_space_of(directory: str) -> Callable[[], DiskSpace]:
    """The space of the file system holding `directory`, asked each time (statvfs)."""

    def space() -> DiskSpace:
        st = os.statvfs(directory)
        return DiskSpace(st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize)

    return space


class StagingError(Exception):
    """A fragment could not be staged here (its scratch file failed): not the fragment's
    fault; the broker answers UNAVAILABLE and the read can be tried again."""


def _scratch_error(fragment: pb.Fragment, err: OSError) -> StagingError:
    return StagingError(
        f"staging fragment [{fragment.begin}, {fragment.end}) of {fragment.journal} to verify"
        f" it before serving it failed: its scratch file: {err}; read again"
    )


OpenRaw = Callable[[], Awaitable[FragmentReader]]


@dataclass(eq=False)
class _Entry:
    key: str
    fragment: pb.Fragment
    file: SpoolFile
    task: asyncio.Task[None] | None = None  # Filling the file: set as soon as it is made.
    users: int = 0
    released: bool = False

    @property
    def size(self) -> int:
        return self.fragment.end - self.fragment.begin


class StagingArea:
    """Where one broker stages stored fragments (see the module docstring). `new_file` makes
    the scratch files. Used on the event loop only."""

    def __init__(
        self,
        new_file: Callable[[], SpoolFile],
        *,
        bytes_max: int = stage_bytes_max_default,
        disk_space: Callable[[], DiskSpace] | None = None,
        keep_free_fraction: float = keep_free_fraction_default,
        whole_in_memory_bytes_max: int = verify_whole_bytes_max_default,
    ) -> None:
        if bytes_max < 0:
            raise ValueError(f"bytes_max: must be >= 0 (got {bytes_max})")
        if not 0 <= keep_free_fraction < 1:
            raise ValueError(f"keep_free_fraction: must be in [0, 1) (got {keep_free_fraction})")
        self._new_file = new_file
        self.bytes_max = bytes_max
        # The scratch files' file system (None: not looked at), and how much of it a copy
        # must leave free: spools write there too, and an append must not fail for a read.
        self._disk_space = disk_space
        self._keep_free_fraction = keep_free_fraction
        self.in_memory_bytes_max = whole_in_memory_bytes_max
        self._entries: dict[str, _Entry] = {}
        self.used = 0  # Bytes of live copies (files not yet closed).
        self.filling = 0  # Bytes of copies still being written (their disk not yet taken).
        self._disk_unknown_logged = False

    def claim(self, fragment: pb.Fragment, open_raw: OpenRaw) -> StagedCopy | None:
        """A share of `fragment`'s staged copy: joining the one staged or being staged, else
        staging it now (its file opened through `open_raw`). None if there is no room for it
        now. Enter the claim at once (``async with``): entering waits until the copy is
        complete and verified; leaving lets go of it. Raises StagingError if the scratch file
        cannot be made."""
        key = fragment.backing_store + "\0" + naming.content_path(fragment)
        entry = self._entries.get(key)
        if entry is None:
            size = fragment.end - fragment.begin
            if self.used + size > self.bytes_max or not self._disk_keeps_free(size):
                return None
            entry = self._start(key, fragment, open_raw)
        entry.users += 1
        return StagedCopy(self, entry)

    def _disk_keeps_free(self, size: int) -> bool:
        if self._disk_space is None:
            return True
        try:
            space = self._disk_space()
        except OSError as err:
            # Cannot tell: read twice rather than risk the spools' room; said once.
            if not self._disk_unknown_logged:
                self._disk_unknown_logged = True
                log.warning(
                    "staging: the scratch disk's space is unknown; reading twice", error=str(err)
                )
            return False
        keep = min(space.total * self._keep_free_fraction, keep_free_bytes_max)
        # Copies still being written will take the rest of their size: counted as taken.
        return space.free - (self.filling + size) >= keep

    def _start(self, key: str, fragment: pb.Fragment, open_raw: OpenRaw) -> _Entry:
        try:
            file = self._new_file()
        except OSError as err:
            raise _scratch_error(fragment, err) from err
        self.used += fragment.end - fragment.begin
        self.filling += fragment.end - fragment.begin
        metrics.READ_STAGED_BYTES.inc(fragment.end - fragment.begin)
        entry = _Entry(key, fragment, file)
        entry.task = asyncio.create_task(self._fill(entry, open_raw), name=f"stage {key}")
        self._entries[key] = entry
        return entry

    async def _fill(self, entry: _Entry, open_raw: OpenRaw) -> None:
        try:
            await self._decode_into(entry, open_raw)
        except FragmentIntegrityError as err:
            self._forget(entry)
            # Its bytes went to the scratch file, not to any reader.
            raise err.with_delivered(0) from err
        except BaseException:
            self._forget(entry)
            raise
        finally:
            self.filling -= entry.size
        _STAGED.inc()

    async def _decode_into(self, entry: _Entry, open_raw: OpenRaw) -> None:
        fragment = entry.fragment
        raw = await open_raw()
        try:
            # Streamed (not whole in memory): a mismatch shows at the end, nothing served.
            reader = FragmentContentReader(
                raw,
                fragment,
                fragment.begin,
                chunk_bytes_max=_stage_piece_bytes,
                verify_whole_bytes_max=0,
                store=fragment.backing_store,
            )
        except BaseException:
            await raw.aclose()
            raise
        try:
            position = 0
            while piece := await reader.read():
                try:
                    # Ends before a cancellation propagates: the file is closed after.
                    await run_blocking_put(partial(entry.file.pwrite, piece, position))
                except OSError as err:  # A full or failing disk: not the fragment's.
                    raise _scratch_error(fragment, err) from err
                position += len(piece)
        finally:
            await reader.aclose()

    def _forget(self, entry: _Entry) -> None:
        if self._entries.get(entry.key) is entry:
            del self._entries[entry.key]

    def _leave(self, entry: _Entry) -> None:
        entry.users -= 1
        if entry.users or entry.released:
            return
        entry.released = True
        self._forget(entry)
        if entry.task is None or entry.task.done():
            self._close(entry)
        else:
            # No read wants it any more. Closed once the task has ended (even one cancelled
            # before its first step), after any write of it in a worker thread.
            entry.task.cancel()
            entry.task.add_done_callback(lambda _task: self._close(entry))

    def _close(self, entry: _Entry) -> None:
        try:
            entry.file.close()
        finally:
            self.used -= entry.size
            metrics.READ_STAGED_BYTES.dec(entry.size)


class StagedCopy:
    """A read's share of a staged copy (StagingArea.claim): ``async with`` it for the file."""

    def __init__(self, area: StagingArea, entry: _Entry) -> None:
        self._area = area
        self._entry = entry
        self._left = False

    async def __aenter__(self) -> SpoolFile:
        task = self._entry.task
        assert task is not None
        try:
            # Shielded: a read that goes away does not cancel the staging others await.
            await asyncio.shield(task)
        except BaseException:
            self._leave()
            raise
        return self._entry.file

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._leave()

    def _leave(self) -> None:
        if not self._left:
            self._left = True
            self._area._leave(self._entry)
