"""LogSource: a recovery log's bytes from an offset, read ahead of the player that decodes them.

Where the bytes come from. When it starts, the source lists the log's fragments (ListFragments,
with signed URLs; if that fails, every byte is read through the broker). A fragment that is
persisted and ends at or before `direct_end` (the write head the player knows: every such
fragment holds only history it must read) is read straight from its store's file — the signed
URL, `file://` or a presigned `s3://` — as Gazette's player does (its reads are `do_not_proxy`):
the broker serves no byte of it. Everything else (fragments not yet persisted when listed, the
open fragment, content appended later, gaps) comes from a broker Read, blocking at the write
head, as before.

Verification. A file is decoded and verified by the broker's own `VerifyingDecoder`
(broker/fragment/verify.py: the length and SHA1 the fragment's name carries) in pieces of
`STORED_READ_BYTES`, each read and hashed in a worker thread (hashlib and file reads release the
GIL), the next piece read while this one is hashed, so that hashing overlaps the player's
decoding and writing. A file is read from its start (a file cannot be entered mid-way) and always
to its end, even when the player skips ahead within or past it (`skip_to`; a file wholly below
the offset skipped to is not read at all), and its last piece is handed out only once the whole
file is verified: the player cannot read any fragment through, nor anything after it, nor
complete at a write head it ends at, before it is verified. A file that fails verification
raises `FragmentIntegrityError` (a `DataLossError`, naming the log, the fragment and the store)
only if some of its bytes were already handed out (a file larger than one piece); otherwise it
is logged by name and its range read through a broker, as is a file that cannot be opened or
read here — not found at its URL's path (a store this host does not mount), or store and I/O
errors past FILE_READ_ATTEMPTS_MAX attempts. A broker serves the range from its spool if it
still has it, else reads the same file and verifies it the same way; if it answers DATA_LOSS
too, playback fails with `StoredFragmentLostError` (a `DataLossError` naming the journal, the
fragment, its file and both failures) and the player removes what it played. No byte is ever
skipped.

Read-ahead. A producer task fills a queue while it holds less than `READ_AHEAD_BYTES_MAX` (it
may go past by one chunk: at most `STORED_READ_BYTES`, times the codec's ratio for a compressed
fragment), so that fetching and hashing the next piece overlaps the player's work on this one,
and a broker, in its own process, streams while the player writes. Errors reach the consumer
in order, after the chunks read before them.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Final, NamedTuple

from google.protobuf.duration_pb2 import Duration

from broker.client.list_apply import list_all_fragments
from broker.client.reader import OpenURL, missing_fragment_error, open_url
from broker.client.retry_reader import RetryReader
from broker.client.route_cache import JournalClient
from broker.fragment.cover_set import CoverSet
from broker.fragment.stores.base import FragmentNotFoundError, FragmentReader, StoreError
from broker.fragment.verify import (
    DataLossError,
    FragmentIntegrityError,
    VerifyingDecoder,
    describe_fragment,
)
from broker.logging import get_logger
from broker.protocol import protocol_pb2 as pb

__all__ = [
    "READ_AHEAD_BYTES_MAX",
    "STORED_READ_BYTES",
    "LogChunk",
    "LogSource",
    "StoredFragmentLostError",
]

log = get_logger(__name__)

STORED_READ_BYTES: Final = 4 << 20
"""Stored bytes of a fragment file read (and decoded and hashed) in one worker-thread hop:
large enough that a thread hop per piece costs nothing next to the copy and the hash (1 MiB
pieces cost the event loop 1.0-1.2 CPU s per 2 GiB of log against 0.7 for 4 MiB, and the
workers no less; 8 MiB gained nothing: alternated playbacks of one recorded log)."""

READ_AHEAD_BYTES_MAX: Final = 32 << 20
"""Bytes read ahead of the player (queued, not yet taken), past which the producer waits."""

FILE_READ_ATTEMPTS_MAX: Final = 4
"""Attempts at reading a fragment file that fails part-way (a store or I/O error), each from
its start, after back-offs doubling from FILE_READ_BACKOFF_INITIAL_S up to
FILE_READ_BACKOFF_MAX_S; then playback fails with the error."""
FILE_READ_BACKOFF_INITIAL_S: Final = 0.1
FILE_READ_BACKOFF_MAX_S: Final = 2.0

SIGNED_URL_TTL_S: Final = 3600
"""How long the signed URLs of the listing stay valid: a playback reads its fragments in
minutes; one that outlives them reads the rest through the broker (an open fails)."""


class StoredFragmentLostError(DataLossError):
    """A recovery log fragment whose stored file is corrupt or unreadable here, and which no
    broker could serve either (none had it spooled, and the file is lost to it too)."""

    def __init__(
        self, fragment: pb.Fragment, url: str, store_error: Exception, broker_error: Exception
    ) -> None:
        super().__init__(
            fragment.journal,
            f"journal {fragment.journal}: fragment {describe_fragment(fragment)} (file {url}):"
            f" not readable from its store ({store_error}), and no broker could serve it"
            f" ({broker_error})",
        )
        self.fragment = fragment
        self.url = url
        self.store_error = store_error
        self.broker_error = broker_error


class _Fallback(NamedTuple):
    """A fragment file that could not be read here: read from `at` through a broker."""

    at: int
    error: Exception


class LogChunk(NamedTuple):
    """Log content starting at `offset` (a view: slicing it copies nothing)."""

    offset: int
    data: memoryview


@dataclass
class _FileProgress:
    """What of a fragment file was handed out, across attempts at reading it."""

    next_offset: int  # The next offset to hand out.
    handed_out: int = 0


@dataclass(frozen=True)
class _Listed:
    """A fragment of the listing, with its signed URL ("" for one not persisted)."""

    fragment: pb.Fragment
    url: str

    @property
    def begin(self) -> int:
        return int(self.fragment.begin)

    @property
    def end(self) -> int:
        return int(self.fragment.end)


class LogSource:
    """See the module docstring. Call `start()` once, then `read_chunk()` for chunks in offset
    order (a larger offset than the last chunk's end is a jump over removed content); `close()`
    when done. With `direct` false every byte is read through the broker."""

    def __init__(
        self,
        client: JournalClient,
        log_name: str,
        offset: int,
        *,
        direct_end: int,
        direct: bool = True,
        opener: OpenURL = open_url,
        read_ahead_bytes_max: int = READ_AHEAD_BYTES_MAX,
        stored_read_bytes: int = STORED_READ_BYTES,
    ) -> None:
        if read_ahead_bytes_max < 1 or stored_read_bytes < 1:
            raise ValueError("read_ahead_bytes_max and stored_read_bytes: must be >= 1")
        self.client = client
        self.log = log_name
        self.direct_end = direct_end if direct else 0
        self._opener = opener
        self._stored_read_bytes = stored_read_bytes
        # Unbounded as a queue: the producer bounds it by bytes (`_put`).
        self._queue: asyncio.Queue[LogChunk | BaseException] = asyncio.Queue()
        self._queued_bytes = 0
        self._read_ahead_bytes_max = read_ahead_bytes_max
        self._taken = asyncio.Event()  # Set when the consumer takes a chunk.
        self._start = offset
        self._skip_to = offset  # Bytes below it are not handed out.
        self._task: asyncio.Task[None] | None = None
        self._failed: BaseException | None = None
        # What was read from where, for tests and benchmarks.
        self.direct_bytes = 0
        self.broker_bytes = 0
        self.fragments_verified = 0
        self.fragments_fallen_back = 0  # Files not readable here, read through a broker.

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("LogSource: already started")
        self._task = asyncio.ensure_future(self._produce())

    def skip_to(self, offset: int) -> None:
        """Hand out no byte below `offset` from now on (the player skips obsolete history).
        Fragment files being read are still read and verified to their end."""
        self._skip_to = max(self._skip_to, offset)

    async def read_chunk(self) -> LogChunk:
        """The next chunk (never empty), waiting for it; raises what the producer failed with."""
        if self._failed is not None:
            raise self._failed
        while True:
            item = await self._queue.get()
            if isinstance(item, LogChunk):
                self._queued_bytes -= len(item.data)
                self._taken.set()
            if isinstance(item, BaseException):
                self._failed = item
                raise item
            end = item.offset + len(item.data)
            if end <= self._skip_to:
                continue
            if item.offset < self._skip_to:
                return LogChunk(self._skip_to, item.data[self._skip_to - item.offset :])
            return item

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # --- The producer ----------------------------------------------------------------------------

    async def _produce(self) -> None:
        try:
            cover = await self._list_or_none()
            at = self._start
            while True:
                at = max(at, self._skip_to)
                listed, covering = cover.longest_overlapping(at)
                if listed is not None and covering and self._readable_directly(listed):
                    fallback = await self._read_file(listed, at)
                    if fallback is not None:
                        # Not readable here: its (remaining) range through a broker.
                        at = await self._read_broker_instead(listed, fallback)
                    else:
                        at = listed.end
                    continue
                at = await self._read_broker(at, self._next_direct_begin(cover, at))
        except asyncio.CancelledError:
            raise
        except BaseException as err:  # Handed to the consumer, in order.
            await self._queue.put(err)

    async def _put(self, chunk: LogChunk) -> None:
        """Queue `chunk` once fewer than `read_ahead_bytes_max` bytes wait in the queue."""
        while self._queued_bytes >= self._read_ahead_bytes_max:
            self._taken.clear()
            await self._taken.wait()
        self._queued_bytes += len(chunk.data)
        self._queue.put_nowait(chunk)

    def _readable_directly(self, listed: _Listed) -> bool:
        return bool(listed.url) and listed.end <= self.direct_end

    def _next_direct_begin(self, cover: CoverSet[_Listed], at: int) -> int:
        """Where the broker read from `at` ends: the next fragment read directly (0: never)."""
        for listed in cover:
            if listed.begin > at and self._readable_directly(listed):
                return listed.begin
        return 0

    async def _list_or_none(self) -> CoverSet[_Listed]:
        """The listing; empty when direct reads are off, or when listing fails (a broker
        restarting, say): then every byte is read through the broker, whose reads retry."""
        if not self.direct_end:
            return CoverSet()
        try:
            return await self._list()
        except Exception as err:  # Not lost: the broker path reads the same bytes.
            log.warning(
                "listing the recovery log's fragments failed: reading it through the broker",
                log=self.log,
                error=repr(err),
            )
            return CoverSet()

    async def _list(self) -> CoverSet[_Listed]:
        request = pb.FragmentsRequest(
            journal=self.log, signatureTTL=Duration(seconds=SIGNED_URL_TTL_S)
        )
        listing = await list_all_fragments(self.client, request)
        cover: CoverSet[_Listed] = CoverSet()
        # Of equal ranges the CoverSet keeps the last added: persisted ones last.
        items = sorted(
            (_Listed(item.spec, item.signed_url) for item in listing.fragments),
            key=lambda x: (x.begin, x.end, bool(x.url)),
        )
        for listed in items:
            if listed.begin < listed.end:
                cover.add(listed)
        return cover

    async def _read_file(self, listed: _Listed, at: int) -> _Fallback | None:
        """Read a fragment's file whole, handing out its bytes from `at` on; None once done.
        A read that fails part-way (a store error, an I/O error) is retried from the file's
        start, handing out only what was not yet, up to FILE_READ_ATTEMPTS_MAX attempts. A
        file that cannot be opened, read or verified here, with none of its bytes handed out,
        is a `_Fallback`: the caller reads its range through a broker. Past the first handed
        out byte, the failure is raised (what was handed out cannot be taken back)."""
        fragment = listed.fragment
        progress = _FileProgress(at)
        for attempt in range(1, FILE_READ_ATTEMPTS_MAX + 1):
            try:
                raw = await self._opener(listed.url)
            except (FragmentNotFoundError, StoreError) as err:
                reason: Exception = err
                if isinstance(err, FragmentNotFoundError):
                    reason = missing_fragment_error(fragment, err)
                if attempt == 1 or attempt == FILE_READ_ATTEMPTS_MAX:
                    return self._fall_back(listed, progress, reason)
                await self._back_off(attempt, err)
                continue
            try:
                await self._read_opened(raw, listed, progress)
                return None
            except FragmentIntegrityError as err:
                return self._fall_back(listed, progress, err)  # Reading it again cannot help.
            except (StoreError, OSError) as err:
                if attempt == FILE_READ_ATTEMPTS_MAX:
                    return self._fall_back(listed, progress, err)
                await self._back_off(attempt, err)
            finally:
                await raw.aclose()
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _fall_back(self, listed: _Listed, progress: _FileProgress, err: Exception) -> _Fallback:
        """The broker's turn at a file not readable here; raises `err` if some of the file's
        bytes were handed out already."""
        if progress.handed_out:
            raise err
        log.warning(
            "recovery log fragment file not readable here: reading its range through a broker",
            log=self.log,
            fragment=describe_fragment(listed.fragment),
            file=listed.url,
            error=str(err),
        )
        self.fragments_fallen_back += 1
        return _Fallback(progress.next_offset, err)

    async def _read_broker_instead(self, listed: _Listed, fallback: _Fallback) -> int:
        """Read the range of a fragment whose file failed here through a broker (its spool, or
        its own read of the file); returns the fragment's end. A broker that finds the content
        lost too fails playback with StoredFragmentLostError."""
        try:
            return await self._read_broker(fallback.at, listed.end)
        except DataLossError as lost:
            raise StoredFragmentLostError(
                listed.fragment, listed.url, fallback.error, lost
            ) from lost

    async def _back_off(self, attempt: int, err: BaseException) -> None:
        delay = min(FILE_READ_BACKOFF_MAX_S, FILE_READ_BACKOFF_INITIAL_S * 2 ** (attempt - 1))
        log.warning(
            "recovery log fragment read failed (will read it again)",
            log=self.log,
            attempt=attempt,
            delay_s=delay,
            error=str(err),
        )
        await asyncio.sleep(delay)

    async def _read_opened(
        self, raw: FragmentReader, listed: _Listed, progress: _FileProgress
    ) -> None:
        """One attempt at reading an opened fragment file from its start (see `_read_file`)."""
        fragment = listed.fragment
        decoder = VerifyingDecoder(fragment, fragment.backing_store)
        position = listed.begin  # Offset of the next decoded byte.
        # The last piece decoded is handed out only once the next one is (or the file is
        # verified): the player cannot read a fragment through, and so complete at a write head
        # it ends at, before the fragment is verified whole.
        held: LogChunk | None = None
        # The next piece is read while this one is decoded and hashed (both in threads).
        reading: asyncio.Future[bytes] | None = asyncio.ensure_future(
            raw.read(self._stored_read_bytes)
        )
        try:
            while reading is not None:
                stored = await reading
                reading = None
                if stored:
                    reading = asyncio.ensure_future(raw.read(self._stored_read_bytes))
                try:
                    if stored:
                        content = await asyncio.to_thread(decoder.feed, stored)
                    else:
                        content = decoder.finish()
                except FragmentIntegrityError as err:
                    raise err.with_delivered(progress.handed_out) from err
                start = max(progress.next_offset, self._skip_to, position)
                if start < position + len(content):
                    if held is not None:
                        await self._hand_out(held, progress)
                    held = LogChunk(start, memoryview(content)[start - position :])
                position += len(content)
                self.direct_bytes += len(content)
            self.fragments_verified += 1
            if held is not None:
                await self._hand_out(held, progress)
        finally:
            if reading is not None:
                reading.cancel()
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await reading

    async def _hand_out(self, chunk: LogChunk, progress: _FileProgress) -> None:
        await self._put(chunk)
        progress.handed_out += len(chunk.data)
        progress.next_offset = chunk.offset + len(chunk.data)

    async def _read_broker(self, at: int, end: int) -> int:
        """Read [at, end) through the broker (`end` 0: on for ever, blocking at the head);
        returns `end`. Restarts where the player skipped to, when it skips ahead."""
        while True:
            request = pb.ReadRequest(journal=self.log, offset=at, end_offset=end, block=True)
            reader = RetryReader(self.client, request)
            try:
                while True:
                    if self._skip_to > at:
                        if end and self._skip_to >= end:
                            return end  # Skipped whole.
                        break  # Start over where the player now reads.
                    chunk = await reader.read_chunk()
                    if not chunk.content:
                        return max(at, end)
                    await self._put(LogChunk(chunk.offset, memoryview(chunk.content)))
                    at = chunk.offset + len(chunk.content)
                    self.broker_bytes += len(chunk.content)
                    if end and at >= end:
                        return at
            finally:
                await reader.close()
            at = self._skip_to
