"""Sending one batch of an AppendService: after its dependencies, retried while that may help.

`BatchSender.send(batch)` is what a journal's worker awaits for each batch, in order. It waits
for the batch's dependencies (one failed: DependencyFailedError), skips the RPC of a batch that
every writer aborted, then appends the batch's bytes in one Append RPC, again and again while
the failure is transient (`append_errors.is_transient`): with doubling back-off capped at
`backoff_max_s`, each attempt bounded by `append_timeout_s`, for at most `retry_s_max` from the
first attempt, after which it raises AppendRetriesExhaustedError with the last failure chained.
A transport failure also drops the journal's cached route, so that the next attempt asks the
client's default broker. The batch's `attempts` and `last_error` show a retry in progress.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from broker.client.append_errors import (
    AppendRetriesExhaustedError,
    DependencyCancelledError,
    DependencyFailedError,
    backoff_s,
    is_transient,
)
from broker.client.appender import Appender
from broker.client.async_append import AsyncAppend
from broker.client.route_cache import JournalClient
from broker.logging import get_logger
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import GazetteError

log = get_logger(__name__)


@dataclass
class AppendServiceStats:
    """Counters of a service's work, for tests, benchmarks and metrics."""

    batches: int = 0  # AsyncAppends created (each becomes one committed or failed batch).
    releases: int = 0  # release() calls: the writes that joined batches.
    aborts: int = 0  # abort() calls.
    rpcs: int = 0  # Append RPC attempts, retries included.
    retries: int = 0
    committed: int = 0  # Batches committed.
    committed_bytes: int = 0
    failed: int = 0  # Batches whose future holds an error (cancellations aside).
    cancelled: int = 0  # Batches failed with AppendCancelledError by the service's stop.


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a batch is retried (see the module docstring); checked by the AppendService."""

    retry_s_max: float
    backoff_initial_s: float
    backoff_max_s: float
    append_timeout_s: float


class BatchSender:
    """Sends batches of one AppendService (see the module docstring), counting attempts and
    retries in the service's `stats`."""

    def __init__(
        self,
        client: JournalClient,
        policy: RetryPolicy,
        *,
        chunk_bytes_max: int,
        stats: AppendServiceStats,
        sleep: Callable[[float], Awaitable[None]],
        clock: Callable[[], float],
    ) -> None:
        self._client = client
        self._policy = policy
        self._chunk_bytes_max = chunk_bytes_max
        self._stats = stats
        self._sleep = sleep
        self._clock = clock

    async def send(self, batch: AsyncAppend) -> pb.AppendResponse:
        await _await_dependencies(batch)
        if not batch._buffer.size and batch._key == batch.journal:
            # Every writer aborted, and a plain empty append changes nothing: skip the RPC.
            return pb.AppendResponse(status=pb.OK)
        policy = self._policy
        started = self._clock()
        while True:
            batch._attempts += 1
            self._stats.rpcs += 1
            try:
                async with asyncio.timeout(policy.append_timeout_s):
                    response = await self._append_once(batch)
                batch._last_error = None
                return response
            except Exception as err:
                if not is_transient(err):
                    raise
                batch._last_error = err
                attempt = batch._attempts
                delay = backoff_s(attempt, policy.backoff_initial_s, policy.backoff_max_s)
                elapsed = self._clock() - started
                if elapsed + delay > policy.retry_s_max:
                    raise AppendRetriesExhaustedError(batch.journal, attempt, elapsed, err) from err
                if not isinstance(err, GazetteError):
                    # The broker we reached (or failed to) may be gone: ask the default one.
                    self._client.routes.update(batch.journal, None)
                self._stats.retries += 1
                log.warning(
                    "append failed (will retry)",
                    journal=batch.journal,
                    attempt=attempt,
                    delay_s=delay,
                    error=str(err) or type(err).__name__,
                )
                await self._sleep(delay)

    async def _append_once(self, batch: AsyncAppend) -> pb.AppendResponse:
        appender = Appender(self._client, batch.request, chunk_bytes_max=self._chunk_bytes_max)
        try:
            for chunk in batch._buffer.chunks(self._chunk_bytes_max):
                await appender.write(chunk)
            await appender.commit()
        except BaseException:
            await appender.abort()
            raise
        assert appender.response is not None  # commit() returned, so the response was OK.
        return appender.response


async def _await_dependencies(batch: AsyncAppend) -> None:
    for dependency in batch.dependencies:
        try:
            await dependency
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # This worker is being cancelled, not the dependency.
            raise DependencyCancelledError(batch.journal) from None
        except Exception as err:
            raise DependencyFailedError(
                f"journal {batch.journal}: a dependency of the append failed: {err}"
            ) from err
