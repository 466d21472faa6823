"""RetryReader: a Reader that survives broker restarts, reassignments and transient errors.

A Read RPC ends for many ordinary reasons: the broker serving it exits or loses the journal's
assignment, a directly read fragment is read through, a network blip breaks the stream. The
RetryReader starts a new Reader at the offset where the last one stopped, after a short back-off,
so that its caller sees one continuous stream of chunks (with visible offset jumps, as Reader's).

What is surfaced rather than retried:
- the end of `end_offset`, or of a `metadata_only` read: the read is complete (an empty chunk;
  the metadata is in `reader.response`);
- OFFSET_NOT_YET_AVAILABLE of a non-blocking read (the caller asked not to wait);
- JOURNAL_NOT_FOUND, after a few attempts that ride out the propagation of a just-created
  journal (at once if the request carried a header: the broker already honoured its revision);
- other non-retriable statuses (NOT_ALLOWED, SUSPENDED, ...), gRPC errors that a retry cannot
  fix (invalid argument, unimplemented, permission), and malformed responses;
- cancellation of the caller's task;
- `attempts_max` consecutive failed attempts: a reader that makes no progress for that long is
  not going to (each attempt that receives an OK response resets the count).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Final

import grpc
import grpc.aio

from broker.client.reader import (
    Chunk,
    FragmentContentError,
    OpenURL,
    Reader,
    ReadProtocolError,
    open_url,
)
from broker.client.route_cache import JournalClient
from broker.fragment.stores.base import StoreError
from broker.logging import get_logger
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import (
    GazetteError,
    JournalNotFoundError,
    OffsetNotYetAvailableError,
)

if TYPE_CHECKING:
    from broker.fragment.stores.registry import StoreRegistry

log = get_logger(__name__)

# Consecutive failed attempts (no response received) before the RetryReader gives up.
attempts_max_default: Final = 30
# Attempts at reading a journal not found, when the request has no header: a journal created
# a moment ago may not have reached every broker's view of etcd yet.
journal_not_found_attempts_max: Final = 3
# Back-off before retry `attempt` (1-based; the last value repeats). Most retries wait for the
# cluster to agree on a journal's assignment, which takes a few etcd watch round trips.
backoff_schedule_s: Final = (0.05, 0.05, 0.1, 0.1, 1.0, 1.0, 5.0)

# gRPC codes no retry can fix.
_FATAL_CODES: Final = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.OUT_OF_RANGE,
    }
)


def _unavailable(err: grpc.aio.AioRpcError) -> bool:
    return bool(err.code() == grpc.StatusCode.UNAVAILABLE)


def backoff_s(attempt: int) -> float:
    """Delay before retry `attempt` (1-based)."""
    return backoff_schedule_s[min(max(attempt, 1), len(backoff_schedule_s)) - 1]


class RetryReader:
    """See the module docstring. `request` is copied; `offset` is the next offset to read."""

    def __init__(
        self,
        client: JournalClient,
        request: pb.ReadRequest,
        *,
        registry: StoreRegistry | None = None,
        opener: OpenURL = open_url,
        attempts_max: int = attempts_max_default,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if attempts_max < 1:
            raise ValueError(f"attempts_max: must be >= 1 (got {attempts_max})")
        self.client = client
        self._registry = registry
        self._opener = opener
        self._attempts_max = attempts_max
        self._sleep = sleep
        self.reader = self._new_reader(request)
        self.restarts = 0

    def _new_reader(self, request: pb.ReadRequest) -> Reader:
        return Reader(self.client, request, registry=self._registry, opener=self._opener)

    @property
    def journal(self) -> str:
        return self.reader.request.journal

    @property
    def offset(self) -> int:
        return self.reader.offset

    @property
    def request(self) -> pb.ReadRequest:
        return self.reader.request

    @property
    def response(self) -> pb.ReadResponse:
        """The latest metadata response of the current Reader."""
        return self.reader.response

    @property
    def jumps(self) -> int:
        return self.reader.jumps

    async def read(self) -> bytes:
        """The next chunk's content; b"" only once `end_offset` is read through."""
        return (await self.read_chunk()).content

    async def read_chunk(self) -> Chunk:
        attempt = 0
        while True:
            try:
                chunk = await self.reader.read_chunk()
            except Exception as err:
                # The Reader is spent either way: the next read, now or after surfacing the
                # error, continues with a fresh one where it stopped.
                progressed = await self._renew()
                if isinstance(err, grpc.aio.AioRpcError) and _unavailable(err):
                    # The broker read from may be gone (it exited or crashed): go through the
                    # default broker next, which knows the journal's current route.
                    self.client.update_route(self.journal, None)
                attempt = self._attempt_after(err, 0 if progressed else attempt)
            else:
                if chunk.content or self._complete():
                    return chunk
                # The RPC (or a directly read fragment) ended: continue with a new one. An RPC
                # that answered OK made progress; one that ended without doing so counts.
                attempt = 0 if await self._renew() else attempt + 1
                if attempt >= self._attempts_max:
                    raise ConnectionError(
                        f"reading {self.journal}: {attempt} consecutive Read RPCs ended without"
                        " an OK response"
                    )
            if attempt:
                await self._sleep(backoff_s(attempt))

    def _complete(self) -> bool:
        request = self.reader.request
        if request.metadata_only:
            return True  # One answer is all a metadata read wants.
        return request.end_offset != 0 and self.reader.offset >= request.end_offset

    def _attempt_after(self, err: Exception, attempt: int) -> int:
        """The attempt count after `err` (`attempt` failures before it), or raise `err` if it
        is not to be retried."""
        if not self._retriable(err, attempt):
            raise err
        attempt += 1
        if attempt >= self._attempts_max:
            raise err
        log.warning(
            "read failed (will retry)",
            journal=self.journal,
            offset=self.offset,
            attempt=attempt,
            error=str(err),
        )
        return attempt

    def _retriable(self, err: Exception, attempt: int) -> bool:
        if isinstance(err, OffsetNotYetAvailableError):
            # A caller may make a non-blocking reader blocking; then it waits at the head.
            return self.reader.request.block
        if isinstance(err, JournalNotFoundError):
            return (
                not self.reader.request.HasField("header")
                and attempt < journal_not_found_attempts_max
            )
        if isinstance(err, GazetteError):
            return err.retriable
        if isinstance(err, grpc.aio.AioRpcError):
            return err.code() not in _FATAL_CODES
        if isinstance(err, ReadProtocolError):
            return False
        return isinstance(err, FragmentContentError | StoreError | OSError)

    async def _renew(self) -> bool:
        """Replace the spent Reader with a new one continuing where it stopped. Returns whether
        the spent one made progress (received an OK response)."""
        spent = self.reader
        request = pb.ReadRequest()
        request.CopyFrom(spent.request)
        await spent.close()
        self.reader = self._new_reader(request)
        self.reader.jumps = spent.jumps
        self.restarts += 1
        return spent.ok_responses > 0

    async def seek(self, offset: int) -> None:
        """Continue reading at `offset` (a new RPC)."""
        request = pb.ReadRequest()
        request.CopyFrom(self.reader.request)
        request.offset = offset
        await self.reader.close()
        self.reader = self._new_reader(request)

    async def close(self) -> None:
        await self.reader.close()

    def __aiter__(self) -> AsyncIterator[Chunk]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[Chunk]:
        while True:
            chunk = await self.read_chunk()
            if not chunk.content:
                return
            yield chunk
