"""ReroutingReader: a Reader that is re-dispatched when the broker it went to cannot serve.

A client's cached route can name a broker that has died, or a broker may answer that the route
it was given is stale (NOT_JOURNAL_BROKER, ...) or that it is starting (UNAVAILABLE). A plain
Reader then fails, and would fail again the same way: its JournalClient dispatches by the same
cached route. A ReroutingReader drops the journal's route on such a failure, so that the next
Read goes to the default broker (whose answer teaches the current route) or to another live
member, and continues at the offset reached, after a growing back-off; at most
``attempts_max`` failures in a row (an attempt that received an OK response resets the count).

A Read stream the broker ends before the read is done is re-dispatched the same way. A broker
ends a Read cleanly, without an error, when its replica of the journal goes away mid-read (the
journal moved, or the broker is stopping), as Gazette's brokers do; a plain Reader then ends
too, short of what was asked: a non-blocking read short of the write head, with nothing to say
that content was left unread (the HTTP gateway served such a body as complete). Only a read
that got all it asked for ends: its `end_offset` reached, or the metadata of a
`metadata_only` one. Early ends in a row, with no content between them, count as failed
attempts.

Unlike `RetryReader`, which rides out long outages for consumers, it gives up after about a
second and a half (a caller answering a request, the HTTP gateway, reports the failure rather
than hold its client): ReadEndedEarlyError after ``attempts_max`` early ends in a row. It keeps
the metadata of the Reader that failed last (``response``), so that a caller can report the
write head of a non-blocking read at the head, say. Every other error (a non-retriable status,
JOURNAL_NOT_FOUND, OFFSET_NOT_YET_AVAILABLE, a gRPC error a retry cannot fix) is raised at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Final

import grpc
import grpc.aio

from broker.client.reader import Chunk, Reader
from broker.client.route_cache import JournalClient
from broker.logging import get_logger
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import GazetteError

log = get_logger(__name__)

# Consecutive failed Reads before the last failure is raised.
attempts_max_default: Final = 6
# Back-off before re-dispatching: doubling from the initial value, capped.
backoff_initial_s: Final = 0.05
backoff_max_s: Final = 1.0


class ReadEndedEarlyError(Exception):
    """Read streams of a journal ended, ``attempts`` times in a row without content, before
    the read was done (each broker's replica of it went away as it was read)."""

    def __init__(self, journal: str, offset: int, attempts: int) -> None:
        super().__init__(
            f"reading {journal} at offset {offset}: {attempts} Read streams in a row ended"
            " before the read was done (the journal's replicas went away); read again"
        )
        self.journal = journal
        self.offset = offset


def rerouting_backoff_s(attempt: int) -> float:
    """Delay before re-dispatch ``attempt`` (1-based)."""
    return float(min(backoff_max_s, backoff_initial_s * 2 ** max(attempt - 1, 0)))


def reroutes(err: BaseException) -> bool:
    """Whether a Read failing with ``err`` may succeed re-dispatched by a fresh route."""
    if isinstance(err, grpc.aio.AioRpcError):
        return bool(err.code() == grpc.StatusCode.UNAVAILABLE)
    return isinstance(err, GazetteError) and err.retriable


class ReroutingReader:
    """See the module docstring. ``request`` is copied."""

    def __init__(
        self,
        client: JournalClient,
        request: pb.ReadRequest,
        *,
        attempts_max: int = attempts_max_default,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if attempts_max < 1:
            raise ValueError(f"attempts_max: must be >= 1 (got {attempts_max})")
        self.client = client
        self.reader = Reader(client, request)
        self.reroutes = 0  # Re-dispatches so far.
        self._attempts_max = attempts_max
        self._sleep = sleep

    @property
    def request(self) -> pb.ReadRequest:
        return self.reader.request

    @property
    def response(self) -> pb.ReadResponse:
        """The latest metadata response (of the Reader that failed, after a failure)."""
        return self.reader.response

    async def read_chunk(self) -> Chunk:
        attempt = 0
        ended = 0  # Early ends in this call: counted apart, so that failures between them
        # (whose count an OK response resets) cannot make them unbounded.
        while True:
            spent = self.reader
            try:
                chunk = await spent.read_chunk()
            except Exception as err:
                attempt = 1 if spent.ok_responses else attempt + 1
                if not reroutes(err) or attempt >= self._attempts_max:
                    raise
                log.info(
                    "read re-dispatched",
                    journal=spent.request.journal,
                    offset=spent.offset,
                    attempt=attempt,
                    error=str(err),
                )
            else:
                if chunk.content or self._read_done(spent):
                    return chunk
                # Ended before the read was done (its broker's replica went away), with no
                # content since this call began: content would have been returned.
                ended += 1
                attempt = max(attempt + 1, ended)
                if ended >= self._attempts_max:
                    raise ReadEndedEarlyError(spent.request.journal, spent.offset, ended)
                log.info(
                    "read ended early; re-dispatched",
                    journal=spent.request.journal,
                    offset=spent.offset,
                    attempt=attempt,
                )
            # The route that led here is stale, or names a broker that cannot serve.
            self.client.update_route(spent.request.journal, None)
            request = pb.ReadRequest()
            request.CopyFrom(spent.request)
            self.reader = Reader(self.client, request)
            self.reader.jumps = spent.jumps
            self.reroutes += 1
            await self._sleep(rerouting_backoff_s(attempt))

    @staticmethod
    def _read_done(reader: Reader) -> bool:
        """Whether a Reader that ended got everything its request asked for."""
        return reader.request.metadata_only or reader.reached_end_offset

    async def close(self) -> None:
        await self.reader.close()
