"""Staging: a stored fragment is verified whole before a broker serves any byte of it.

A fragment's SHA1 can only be checked at its end (verify.py). A read that streams a stored
fragment as it decodes it has served every byte of it by the time a mismatch shows: a consumer
shard has processed, and may have committed, whatever the damaged bytes decoded to before its
read fails with DATA_LOSS. FragmentContentReader verifies fragments up to 1 MiB in memory
before handing out their first byte; a broker stages larger ones (Gazette's default fragment
length is 512 MiB): it decodes the stored file into a local scratch file on disk (unlinked: in
the spool directory, or the data directory's scratch; never in memory, even with memory
spools), verifies it, and serves the read from that file.

- Shared: reads of the same fragment at the same time share one staged copy (one download).
- Bounded: a broker holds at most `bytes_max` staged bytes at once. A read that needs room
  waits up to `wait_s` for other reads to finish with theirs, then fails StagingFullError (the
  broker answers UNAVAILABLE, which clients retry with back-off). A fragment longer than
  `bytes_max` is never staged: it streams, verified at its end as before, and its error then
  says how many bytes were served (`delivered`).
- What it costs: the first byte of a large stored fragment waits for its whole download and
  decode, and the broker's disk takes a write and a read of it (the page cache's, usually).
  Reads near the write head read spools, not stores, and are not staged.

A staged copy lives while a read uses it: the last read to let go of it closes its file and
frees its room; if no read wants it any more before it is complete, the staging is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final

from broker import metrics
from broker.client.reader import FragmentContentReader, verify_whole_bytes_max_default
from broker.fragment import naming
from broker.fragment.spool_file import SpoolFile
from broker.fragment.stores.base import FragmentReader
from broker.fragment.verify import FragmentIntegrityError
from broker.protocol import protocol_pb2 as pb

__all__ = [
    "StagingArea",
    "StagingError",
    "StagingFullError",
    "stage_bytes_max_default",
    "stage_wait_s_default",
]

# Staged bytes one broker holds at once: room for several reads of Gazette's default 512 MiB
# fragments, on the disk of the spools.
stage_bytes_max_default: Final = 4 << 30
# How long a read waits for room before UNAVAILABLE: long enough for a read of a staged
# fragment to finish, short enough that a client hears of a broker that stays full.
stage_wait_s_default: Final = 30.0
# Pieces a staged file is written in (the decoded stream's; a write per piece).
_stage_piece_bytes: Final = 1 << 20


class StagingError(Exception):
    """A fragment could not be staged here (no room, a failing scratch file): not the
    fragment's fault; the broker answers UNAVAILABLE and the read can be tried again."""


class StagingFullError(StagingError):
    """No room to stage a fragment came free within the wait: read again later."""

    def __init__(self, fragment: pb.Fragment, size: int, used: int, bytes_max: int, wait_s: float):
        super().__init__(
            f"no room to verify fragment [{fragment.begin}, {fragment.end}) of"
            f" {fragment.journal} before serving it: {size} bytes wanted, {used} of {bytes_max}"
            f" staged for other reads after waiting {wait_s:g}s; read again"
        )
        self.fragment = fragment


def _scratch_error(fragment: pb.Fragment, err: OSError) -> StagingError:
    return StagingError(
        f"staging fragment [{fragment.begin}, {fragment.end}) of {fragment.journal} to verify"
        f" it before serving it failed: its scratch file: {err}; read again"
    )


OpenRaw = Callable[[], Awaitable[FragmentReader]]


@dataclass(eq=False)
class _Staged:
    key: str
    fragment: pb.Fragment
    file: SpoolFile
    task: asyncio.Task[None] | None = None
    users: int = 0
    released: bool = field(default=False)


class StagingArea:
    """Where one broker stages stored fragments (see the module docstring). `new_file` makes
    the scratch files; used on the event loop only."""

    def __init__(
        self,
        new_file: Callable[[], SpoolFile],
        *,
        bytes_max: int = stage_bytes_max_default,
        wait_s: float = stage_wait_s_default,
        whole_in_memory_bytes_max: int = verify_whole_bytes_max_default,
    ) -> None:
        if bytes_max < 0:
            raise ValueError(f"bytes_max: must be >= 0 (got {bytes_max})")
        if wait_s < 0:
            raise ValueError(f"wait_s: must be >= 0 (got {wait_s})")
        self._new_file = new_file
        self.bytes_max = bytes_max
        self.wait_s = wait_s
        self._in_memory_max = whole_in_memory_bytes_max
        self._entries: dict[str, _Staged] = {}
        self.used = 0  # Bytes reserved by live staged copies.
        self._freed = asyncio.Event()

    def stages(self, fragment: pb.Fragment) -> bool:
        """Whether a read of `fragment` from its store is staged: it is too long to be
        verified in memory, and short enough to fit the area."""
        return self._in_memory_max < fragment.end - fragment.begin <= self.bytes_max

    @contextlib.asynccontextmanager
    async def staged(self, fragment: pb.Fragment, open_raw: OpenRaw) -> AsyncIterator[SpoolFile]:
        """The fragment's whole content in a file at positions offset - begin, verified
        against its name. Raises what opening (`open_raw`) or reading the store file raises,
        FragmentIntegrityError if it is not the fragment's content (nothing served), and
        StagingFullError."""
        key = fragment.backing_store + "\0" + naming.content_path(fragment)
        entry = self._entries.get(key)
        if entry is None:
            await self._reserve(fragment)
            entry = self._entries.get(key)  # Staged by another read while this one waited?
            if entry is None:
                entry = self._start(key, fragment, open_raw)
            else:
                self._free(fragment.end - fragment.begin)
        entry.users += 1
        try:
            assert entry.task is not None
            # Shielded: a read that goes away does not cancel the staging other reads await.
            await asyncio.shield(entry.task)
            yield entry.file
        finally:
            entry.users -= 1
            if entry.users == 0:
                self._release(entry)

    def _start(self, key: str, fragment: pb.Fragment, open_raw: OpenRaw) -> _Staged:
        try:
            file = self._new_file()
        except BaseException as err:
            self._free(fragment.end - fragment.begin)
            if isinstance(err, OSError):
                raise _scratch_error(fragment, err) from err
            raise
        entry = _Staged(key, fragment, file)
        self._entries[key] = entry
        entry.task = asyncio.create_task(self._fill(entry, open_raw), name=f"stage {key}")
        return entry

    async def _fill(self, entry: _Staged, open_raw: OpenRaw) -> None:
        fragment = entry.fragment
        try:
            raw = await open_raw()
            # Streamed (not whole in memory); a mismatch shows at the end, with nothing served.
            reader = FragmentContentReader(
                raw,
                fragment,
                fragment.begin,
                chunk_bytes_max=_stage_piece_bytes,
                verify_whole_bytes_max=0,
                store=fragment.backing_store,
            )
            try:
                position = 0
                while piece := await reader.read():
                    # In the event loop, as spools write: the page cache takes it.
                    try:
                        entry.file.pwrite(piece, position)
                    except OSError as err:  # A full or failing disk: not the fragment's.
                        raise _scratch_error(fragment, err) from err
                    position += len(piece)
            finally:
                await reader.aclose()
        except FragmentIntegrityError as err:
            self._forget(entry)
            # Its bytes went to the staged file, not to any reader.
            raise err.with_delivered(0) from err
        except BaseException:
            # A failure is not kept: the next read of the fragment stages it afresh.
            self._forget(entry)
            raise
        metrics.READ_STAGED.inc()

    def _forget(self, entry: _Staged) -> None:
        if self._entries.get(entry.key) is entry:
            del self._entries[entry.key]

    def _release(self, entry: _Staged) -> None:
        if entry.released:
            return
        entry.released = True
        self._forget(entry)
        if entry.task is not None and not entry.task.done():
            # No read wants it any more. Its writes are synchronous, so once cancelled it
            # never touches the file again.
            entry.task.cancel()
        entry.file.close()
        self._free(entry.fragment.end - entry.fragment.begin)

    async def _reserve(self, fragment: pb.Fragment) -> None:
        size = fragment.end - fragment.begin
        if self.used + size > self.bytes_max:
            metrics.READ_STAGING_WAITS.inc()
            try:
                async with asyncio.timeout(self.wait_s):
                    while self.used + size > self.bytes_max:
                        await self._freed.wait()
            except TimeoutError:
                raise StagingFullError(
                    fragment, size, self.used, self.bytes_max, self.wait_s
                ) from None
        self.used += size
        metrics.READ_STAGED_BYTES.inc(size)

    def _free(self, size: int) -> None:
        self.used -= size
        metrics.READ_STAGED_BYTES.dec(size)
        # Wake every waiter to look again; a new Event for the next wait.
        self._freed.set()
        self._freed = asyncio.Event()
