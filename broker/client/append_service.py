"""AppendService: asynchronous appends, batched and ordered per journal, retried until they land.

Many small writes (messages a publisher produces one at a time) would cost one Append RPC each
if made directly; gRPC alone manages only ~9k small messages a second on one stream. The
service instead queues writes per journal and sends them in batches: while one batch of a
journal is being appended, later writes join the next one, which is sent as soon as the first
commits. A batch is one Append RPC, one transaction: its writes commit together, contiguously,
in the order they were released.

Use:

    async with AppendService(client) as service:
        aa = await service.start_append("a/journal")  # exclusive use of the journal's batch
        aa.write(b"one whole message\\n")               # synchronous: no await while held
        aa.release()                                    # queue it (or aa.abort() to drop it)
        response = await aa                             # AppendResponse of the whole batch

Call order and concurrency (one event loop; nothing here is thread-safe):

- `start_append` hands out the journal's open batch (`AsyncAppend`) to one writer at a time;
  other writers of that journal wait until it is released. Writers must not await between
  `start_append` and `release`/`abort` (the batch cannot be sent while held), and must
  release or abort every append they start.
- Writes to one journal commit in release order. Journals proceed independently: each has
  its own worker task, started when it has something to send and ended when it has nothing.
- Consecutive appends join one batch until it holds `batch_bytes_max` bytes, or until its
  request (preconditions such as `offset` or registers) or dependencies differ. Every writer of
  a batch awaits the same future, whose response spans the whole batch (as in Gazette).
- Content waits in memory, then in spill files (`append_buffer`); while both are full,
  `start_append` waits (backpressure) until batches commit.
- A batch with `dependencies` (other AsyncAppends, or futures) is sent only after all of them
  succeed; if one fails, the batch fails with DependencyFailedError (if one was cancelled, it
  is cancelled with DependencyCancelledError, one of both).
- Transient failures (an unreachable or restarting broker, a stale route, no primary yet, a
  timeout) are retried with capped doubling back-off for at most `retry_s_max` per batch (ten
  minutes by default: an outage that long needs someone to look), then the batch fails with
  AppendRetriesExhaustedError (`append_send`). `AsyncAppend.attempts` and `.last_error`, and
  `AppendService.retrying()`, show what is stuck and why. A later batch starts afresh.
- Other failures (JOURNAL_NOT_FOUND, WRONG_APPEND_OFFSET, REGISTER_MISMATCH,
  INDEX_HAS_GREATER_OFFSET, ...: `append_errors.TERMINAL_STATUSES`) fail the batch's future at
  once with their typed error. A journal's failure is sticky, as in Gazette: every later batch
  of that journal fails with JournalFailedError instead of being sent, so that nothing commits
  after a hole (a reader would otherwise see later messages without the failed ones). Other
  journals go on; append to the failed one through a new service once the cause is fixed.
- No failure is only a log line, and each is reported once, to whoever looks first (as
  Kafka's producer and Gazette's AppendService do): a failed batch's future raises for every
  writer that awaits it (or retrieves its `exception()`/`result()`), `flush()` raises for the
  batches it waited on, and leaving the `async with` block normally raises AppendsFailedError
  (naming the journals and counts) for the failed batches that nobody observed that way (fire
  and forget, or a future a writer cancelled). A failure a writer awaited and handled is not
  raised a second time at the exit (past `failed_kept_max` failed batches kept to tell, later
  ones are reported at the exit even if awaited: twice rather than never). A failed batch also
  stays in `pending_except` (the last one per journal), so that what depends on "every pending
  append" (a consumer's checkpoint commit) fails too rather than commit past it.
- Retries make appends at-least-once: a commit whose response was lost is appended again.
  Messages carry UUIDs (the Publisher) so that readers drop the duplicates.
- A batch that nobody wrote to (every writer aborted) and that has no preconditions is not
  sent: its response is an OK AppendResponse without a commit.
- Leaving the `async with` block waits for every queued append to resolve; leaving it by an
  exception (or a cancellation) stops the service instead: what is still queued or in flight
  fails with AppendCancelledError (`maybe_committed` tells whether it was in flight), which is
  the owner's choice and not logged as a failure; the block's own error is what propagates.
"""

from __future__ import annotations

import asyncio
import enum
import os
import time
from collections.abc import Awaitable, Callable, Collection
from types import TracebackType
from typing import Any, Final

from broker.client.append_buffer import (
    BufferBudget,
    memory_bytes_max_default,
    spill_bytes_max_default,
)
from broker.client.append_errors import (
    AppendCancelledError,
    AppendRetriesExhaustedError,
    AppendServiceClosedError,
    AppendsFailedError,
    DependencyCancelledError,
    DependencyFailedError,
    JournalFailedError,
    backoff_s,
    is_transient,
)
from broker.client.append_send import AppendServiceStats, BatchSender, RetryPolicy
from broker.client.appender import chunk_bytes_max_default, validate_append_request
from broker.client.async_append import (
    AppendState,
    AsyncAppend,
    JournalQueue,
    notify,
    wait_on,
)
from broker.client.route_cache import JournalClient
from broker.logging import get_logger
from broker.protocol import protocol_pb2 as pb
from broker.protocol.validate import at, validate_journal_name

__all__ = [
    "AppendCancelledError",
    "AppendRetriesExhaustedError",
    "AppendService",
    "AppendServiceClosedError",
    "AppendServiceStats",
    "AppendsFailedError",
    "DependencyCancelledError",
    "DependencyFailedError",
    "JournalFailedError",
    "backoff_s",
    "is_transient",
]

log = get_logger(__name__)

# A batch stops taking writes at this size: large enough to amortise an RPC, small enough that
# one batch does not hold a journal's pipeline (and every other writer of it) for long.
batch_bytes_max_default: Final = 4 << 20
# How long one batch is retried (from its first attempt) before its future fails with
# AppendRetriesExhaustedError: long enough to ride out a broker restart or a fail-over many times
# over, short enough that an outage nobody fixes reaches the writer as an error.
retry_s_max_default: Final = 600.0
# Back-off between attempts: doubling from the initial delay, capped. The cap is how late a
# writer may notice that its journal is back (a broker restarted, a route re-assigned): one
# cheap RPC a second per waiting journal is worth not adding up to Gazette's 5 s to every
# recovery (and to every consumer's progress behind it).
backoff_initial_s_default: Final = 0.05
backoff_max_s_default: Final = 1.0
# One attempt (sending a batch and awaiting its commit) is abandoned, and retried, after this.
append_timeout_s_default: Final = 60.0
# A writer that never awaits anything else would starve the tasks that send its batches; after
# this many released bytes, `start_append` gives the event loop a turn.
writer_yield_bytes_default: Final = 256 << 10
# The futures of failed batches are kept until the block ends, to learn which failures no
# writer observed; those observed are dropped whenever the list doubles past this length, so
# that a long-lived service whose writers handle their failures holds few of them.
_failed_prune_len_min: Final = 64
# At most this many failed batches are kept to learn whether they are observed (a fire-and-forget writer of a failed
# journal fails every batch of it); past it, a failure is counted as unobserved at once (the
# exit reports it even if a writer awaits it later: reported twice rather than never).
failed_kept_max_default: Final = 10_000


class _Run(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    CLOSED = "closed"


_NO_DEPENDENCIES: Final[frozenset[Any]] = frozenset()
# Enum members as module constants: reading a member through its class costs ~80 ns, which
# matters on the per-write path.
_OPEN: Final = AppendState.OPEN
_RUNNING: Final = _Run.RUNNING


class AppendService:
    """See the module docstring. Use as `async with AppendService(client) as service:`."""

    def __init__(
        self,
        client: JournalClient,
        *,
        batch_bytes_max: int = batch_bytes_max_default,
        memory_bytes_max: int = memory_bytes_max_default,
        spill_bytes_max: int = spill_bytes_max_default,
        spill_dir: str | os.PathLike[str] | None = None,
        retry_s_max: float = retry_s_max_default,
        backoff_initial_s: float = backoff_initial_s_default,
        backoff_max_s: float = backoff_max_s_default,
        append_timeout_s: float = append_timeout_s_default,
        chunk_bytes_max: int = chunk_bytes_max_default,
        writer_yield_bytes: int = writer_yield_bytes_default,
        failed_kept_max: int = failed_kept_max_default,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        for name, value in (
            ("batch_bytes_max", batch_bytes_max),
            ("chunk_bytes_max", chunk_bytes_max),
            ("writer_yield_bytes", writer_yield_bytes),
            ("failed_kept_max", failed_kept_max),
        ):
            if value < 1:
                raise ValueError(f"{name}: must be >= 1 (got {value})")
        if not 0 <= backoff_initial_s <= backoff_max_s:
            raise ValueError("backoff_initial_s, backoff_max_s: must be 0 <= initial <= max")
        if append_timeout_s <= 0:
            raise ValueError(f"append_timeout_s: must be > 0 (got {append_timeout_s})")
        if retry_s_max < 0:
            raise ValueError(f"retry_s_max: must be >= 0 (got {retry_s_max})")
        self.client = client
        self.stats = AppendServiceStats()
        self.budget = BufferBudget(
            memory_bytes_max=memory_bytes_max, spill_bytes_max=spill_bytes_max, spill_dir=spill_dir
        )
        self._batch_bytes_max = batch_bytes_max
        self._sender = BatchSender(
            client,
            RetryPolicy(retry_s_max, backoff_initial_s, backoff_max_s, append_timeout_s),
            chunk_bytes_max=chunk_bytes_max,
            stats=self.stats,
            sleep=sleep,
            clock=clock,
        )
        self._writer_yield_bytes = writer_yield_bytes
        self._queues: dict[str, JournalQueue] = {}
        # Failed batches (cancellations aside): the count per journal, the first failure, and
        # each journal's last failed batch (see `pending_except`).
        self._failures: dict[str, int] = {}
        self._first_failure: BaseException | None = None
        self._failed_last: dict[str, AsyncAppend] = {}
        # The failed batches (journal, future, error) until the block ends: those that no
        # writer observed then are what AppendsFailedError reports (see `_unobserved`).
        self._failed_futures: list[
            tuple[str, asyncio.Future[pb.AppendResponse], BaseException]
        ] = []
        self._failed_prune_len = _failed_prune_len_min
        self._failed_kept_max = failed_kept_max
        # Failures past `failed_kept_max`, per journal, and the first of them.
        self._failed_overflow: dict[str, int] = {}
        self._failed_overflow_first: BaseException | None = None
        # The first failure of each journal: later batches of it are not sent (sticky).
        self._journal_failed: dict[str, BaseException] = {}
        self._budget_waiters: list[asyncio.Future[None]] = []
        self._unyielded_bytes = 0
        self._run = _Run.NEW
        self._tg: asyncio.TaskGroup | None = None

    # --- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> AppendService:
        if self._run is not _Run.NEW:
            raise AppendServiceClosedError("an AppendService runs once")
        self._tg = asyncio.TaskGroup()
        await self._tg.__aenter__()
        self._run = _Run.RUNNING
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        self._run = _Run.CLOSED
        # Writers waiting for room or for their journal learn that the service closed.
        for queue in self._queues.values():
            notify(queue.waiters)
        notify(self._budget_waiters)
        assert self._tg is not None
        if exc is not None:
            # The block failed (or was cancelled): stop sending. Cancelled workers fail the
            # futures of what they still held with AppendCancelledError; the block's own error
            # is what propagates.
            for queue in list(self._queues.values()):
                if queue.task is not None:
                    queue.task.cancel()
        # The task group waits for the workers: each ends once its queue is drained (or it was
        # cancelled). A worker that failed by itself (a bug) raises from here.
        try:
            await self._tg.__aexit__(None, None, None)
        finally:
            # A worker cancelled before its first step never ran its own clean-up.
            for queue in list(self._queues.values()):
                self._cancel_queue(queue)
            self._queues.clear()
        unobserved, first = self._take_unobserved()
        if exc is None and first is not None:
            # Nothing may be dropped unseen: a writer that never awaited its append (fire and
            # forget) learns here that it failed. Failures a writer already observed (awaited
            # and handled) are not reported twice.
            raise AppendsFailedError(unobserved, first) from first
        return None

    def _take_unobserved(self) -> tuple[dict[str, int], BaseException | None]:
        """The failed batches no writer observed (count per journal, and the first one's
        error), now reported by the caller: their futures are marked retrieved so that asyncio
        does not log them again when they are collected."""
        counts: dict[str, int] = {}
        first: BaseException | None = None
        for journal, future, error in self._failed_futures:
            if not _unobserved(future):
                continue
            counts[journal] = counts.get(journal, 0) + 1
            first = first or error
            if not future.cancelled():
                future.exception()
        self._failed_futures.clear()
        for journal, n in self._failed_overflow.items():  # Later than every kept one.
            counts[journal] = counts.get(journal, 0) + n
        return counts, first or self._failed_overflow_first

    # --- writers -----------------------------------------------------------------------------

    async def start_append(
        self, journal: str | pb.AppendRequest, dependencies: Collection[Any] = ()
    ) -> AsyncAppend:
        """The batch of `journal` (a name, or an AppendRequest with preconditions) that the
        caller now holds: write to it, then `release()` (or `abort()`) without awaiting in
        between. Waits while another writer holds the journal, and while the buffers are
        full. `dependencies` are AsyncAppends or asyncio futures that must succeed first."""
        if self._unyielded_bytes >= self._writer_yield_bytes:
            self._unyielded_bytes = 0
            await asyncio.sleep(0)
        key: object
        if isinstance(journal, str):
            name, request, key = journal, None, journal
        else:
            name, request, key = _request_key(journal)
        deps = _dependencies(dependencies) if dependencies else _NO_DEPENDENCIES
        queue = self._queues.get(name)
        if queue is None or queue.holder is not None or not self._admits():
            queue = await self._admit(name, request is None)
        return self._hold(queue, request, key, deps)

    def _queue_if_free(self, journal: str) -> JournalQueue | None:
        """The journal's queue if a writer may take it at once: it exists and is not held,
        the service is running, its buffer has room, and writers need not yield yet."""
        queue = self._queues.get(journal)
        budget = self.budget
        if (
            queue is None
            or queue.holder is not None
            or self._unyielded_bytes >= self._writer_yield_bytes
            or self._run is not _RUNNING
            or budget.memory_bytes + budget.spill_bytes >= budget.bytes_max
        ):
            return None
        return queue

    def start_append_nowait(self, journal: str) -> AsyncAppend | None:
        """`start_append(journal)` if it would not wait (nor yield); else None, and the caller
        awaits `start_append`. Saves a coroutine per write on a publisher's hot path."""
        queue = self._queue_if_free(journal)
        if queue is None:
            return None
        return self._hold(queue, None, journal, _NO_DEPENDENCIES)

    def append_nowait(self, journal: str, data: bytes) -> AsyncAppend | None:
        """`start_append_nowait(journal)`, `write(data)` and `release()` in one call: append
        `data` (whole messages) to the journal's open batch and return the batch, if that needs
        no wait; else None, and nothing is written. The one call a publisher makes per message.
        """
        # `_queue_if_free` and `AppendBuffer.write_released`, inlined, each field read once:
        # this runs for every message a publisher appends. Anything but the common case (the
        # open batch of this journal, in memory, with room) goes to `_append_nowait_other`.
        queue = self._queues.get(journal)
        if queue is None or queue.holder is not None or self._run is not _RUNNING:
            return None
        budget = self.budget
        memory = budget.memory_bytes
        unyielded = self._unyielded_bytes
        if unyielded >= self._writer_yield_bytes or memory + budget.spill_bytes >= budget.bytes_max:
            return None
        size = len(data)
        batches = queue.batches
        if batches:
            # Never held: nothing can run between taking the batch and releasing it.
            batch = batches[-1]
            buffer = batch._buffer
            if (
                batch._state is _OPEN
                and batch._key == journal
                and not buffer.spilled
                and buffer.size < self._batch_bytes_max
                and memory + size <= budget.memory_bytes_max
                and not buffer._closed
            ):
                buffer._memory += data
                budget.memory_bytes = memory + size
                buffer.size = buffer._mark = buffer.size + size
                self.stats.releases += 1
                self._unyielded_bytes = unyielded + size
                if queue.waiters:
                    notify(queue.waiters)
                return batch
        return self._append_nowait_other(queue, journal, data)

    def _append_nowait_other(self, queue: JournalQueue, journal: str, data: bytes) -> AsyncAppend:
        """`append_nowait` where the open batch cannot take `data` in memory as it is: a new
        batch (or the spilled one, as `_open_batch` weighs), written through the buffer."""
        batch = queue.batches[-1] if queue.batches else None
        if (
            batch is None
            or batch._state is not _OPEN
            or batch._key != journal
            or batch._buffer.size >= self._batch_bytes_max
            or batch._buffer.spilled
        ):
            # The open batch cannot take it (or _open_batch must weigh the spill budget).
            batch = self._open_batch(queue, None, journal, _NO_DEPENDENCIES)
        batch._buffer.write_released(data)  # An OSError leaves the batch as it was.
        self.stats.releases += 1
        self._unyielded_bytes += len(data)
        if queue.waiters:
            notify(queue.waiters)
        return batch

    def _admits(self) -> bool:
        budget = self.budget
        return self._run is _RUNNING and budget.memory_bytes + budget.spill_bytes < budget.bytes_max

    def _hold(
        self,
        queue: JournalQueue,
        request: pb.AppendRequest | None,
        key: object,
        deps: frozenset[Any],
    ) -> AsyncAppend:
        """Hand the journal's open batch to the caller, chaining a new one if the open one
        cannot take this append. Call without awaiting after checking `queue` is unheld."""
        tail = self._open_batch(queue, request, key, deps)
        tail._held = True
        queue.holder = tail
        return tail

    def _open_batch(
        self,
        queue: JournalQueue,
        request: pb.AppendRequest | None,
        key: object,
        deps: frozenset[Any],
    ) -> AsyncAppend:
        """The journal's open batch if it can take an append of `key` and `deps`, else a new
        one chained after it."""
        tail = queue.batches[-1] if queue.batches else None
        budget = self.budget
        if (
            tail is None
            or tail._state is not _OPEN
            or tail._key != key
            or tail._buffer.size >= self._batch_bytes_max
            or (deps and not deps <= tail.dependencies)
            or (tail._buffer.spilled and budget.spill_bytes >= budget.spill_bytes_max)
        ):
            tail = self._chain(queue, request, key, deps)
        return tail

    async def _admit(self, name: str, validate: bool) -> JournalQueue:
        """The queue of journal `name` once no writer holds it and the budget has room."""
        while True:
            if self._run is not _RUNNING:
                raise AppendServiceClosedError(
                    f"append service is {self._run.value}: appends are taken only inside "
                    "`async with AppendService(...)`"
                )
            queue = self._queues.get(name)
            if queue is None:
                if validate:
                    with at("journal"):
                        validate_journal_name(name)
                queue = self._queues[name] = JournalQueue(name)
            if queue.holder is not None:
                await wait_on(queue.waiters)
            elif self.budget.full:
                await wait_on(self._budget_waiters)
            else:
                return queue

    def _chain(
        self,
        queue: JournalQueue,
        request: pb.AppendRequest | None,
        key: object,
        deps: frozenset[Any],
    ) -> AsyncAppend:
        future: asyncio.Future[pb.AppendResponse] = asyncio.get_running_loop().create_future()
        batch = AsyncAppend(
            queue, request, key, deps, self.budget.new_buffer(), future, self._on_release
        )
        queue.batches.append(batch)
        self.stats.batches += 1
        if queue.task is None:
            assert self._tg is not None
            queue.task = self._tg.create_task(self._serve(queue), name=f"append {queue.journal}")
        return batch

    def _on_release(self, batch: AsyncAppend, released_bytes: int) -> None:
        """`batch` was released with `released_bytes` more content (-1: aborted)."""
        batch._held = False
        batch._queue.holder = None
        if released_bytes < 0:
            self.stats.aborts += 1
        else:
            self.stats.releases += 1
            self._unyielded_bytes += released_bytes
        if batch._queue.waiters:
            notify(batch._queue.waiters)

    @property
    def waiting_writers(self) -> int:
        """Writers waiting in `start_append` for the buffers to have room."""
        return sum(1 for waiter in self._budget_waiters if not waiter.done())

    def pending_except(self, journal: str = "") -> list[AsyncAppend]:
        """The unresolved batches of every journal other than `journal` ("": of all), and the
        last failed batch of each such journal: await them as a barrier before appending to
        `journal`. A failed batch is included (as in Gazette) so that its error reaches what
        waits on the barrier (a checkpoint's commit) instead of being passed over."""
        pending = [
            batch
            for name, queue in self._queues.items()
            if name != journal
            for batch in queue.batches
            # Until the service resolved it, not by its future: a writer may have cancelled
            # that (explicitly), and a commit must then fail on it rather than pass it by.
            if batch._state is not AppendState.DONE
        ]
        pending.extend(batch for name, batch in self._failed_last.items() if name != journal)
        return pending

    def retrying(self) -> list[AsyncAppend]:
        """The batches being retried now (their `last_error` says why): what is stuck."""
        return [
            batch
            for queue in self._queues.values()
            for batch in queue.batches
            if batch._last_error is not None and not batch.done()
        ]

    @property
    def failures(self) -> dict[str, int]:
        """Failed batches per journal so far (cancellations by a stop aside)."""
        return dict(self._failures)

    async def flush(self) -> None:
        """Wait until every batch queued now has resolved; raise AppendsFailedError if any of
        them failed (each batch's future holds its own outcome)."""
        batches = [
            batch for queue in self._queues.values() for batch in queue.batches if not batch.done()
        ]
        if batches:
            await asyncio.wait([batch.future for batch in batches])
        failed: dict[str, int] = {}
        first: BaseException | None = None
        for batch in batches:
            error = None if batch.future.cancelled() else batch.future.exception()
            if error is not None and not isinstance(error, AppendCancelledError):
                failed[batch.journal] = failed.get(batch.journal, 0) + 1
                first = first or error
        if first is not None:
            raise AppendsFailedError(failed, first) from first

    # --- workers -----------------------------------------------------------------------------

    async def _serve(self, queue: JournalQueue) -> None:
        """Send the journal's batches in order until none is left."""
        try:
            while queue.batches:
                batch = queue.batches[0]
                while batch._held:
                    await wait_on(queue.waiters)
                batch._state = AppendState.SENDING  # Later writers start the next batch.
                failed = self._journal_failed.get(queue.journal)
                if failed is not None:
                    # Never after a hole: see JournalFailedError.
                    self._fail(batch, JournalFailedError(queue.journal, failed))
                else:
                    try:
                        response = await self._sender.send(batch)
                    except Exception as err:
                        self._fail(batch, err)
                    else:
                        self._commit(batch, response)
                queue.batches.popleft()
                batch._buffer.close()
                notify(self._budget_waiters)
        except asyncio.CancelledError:
            # The service is stopping: nothing will send the remaining batches, so their
            # writers must hear about it now.
            self._cancel_queue(queue)
            raise
        except BaseException as err:
            # A bug of the worker: the same, as a failure.
            closed = AppendServiceClosedError(f"journal {queue.journal}: append worker failed")
            closed.__cause__ = err
            for batch in queue.batches:
                if not batch.done():
                    self._fail(batch, closed)
            self._cancel_queue(queue)
            raise
        finally:
            queue.task = None
            if self._queues.get(queue.journal) is queue and not queue.batches:
                del self._queues[queue.journal]

    def _cancel_queue(self, queue: JournalQueue) -> None:
        """Fail what `queue` still holds with AppendCancelledError: the service stopped."""
        for batch in queue.batches:
            if not batch.done():
                self._cancel(batch)
            batch._buffer.close()
        queue.batches.clear()
        notify(self._budget_waiters)

    def _commit(self, batch: AsyncAppend, response: pb.AppendResponse) -> None:
        batch._state = AppendState.DONE
        self.stats.committed += 1
        self.stats.committed_bytes += len(batch._buffer)
        # A writer may have cancelled the shared future (asyncio.gather over AsyncAppends, or a
        # store cancelling a task wrapping it): the append still happened; nobody is told.
        if not batch._future.done():
            batch._future.set_result(response)

    def _fail(self, batch: AsyncAppend, err: BaseException) -> None:
        if isinstance(err, AppendCancelledError):
            self._cancelled(batch, err)
            return
        batch._state = AppendState.DONE
        self.stats.failed += 1
        journal = batch.journal
        self._failures[journal] = self._failures.get(journal, 0) + 1
        if self._first_failure is None:
            self._first_failure = err
        self._failed_last[journal] = batch
        self._journal_failed.setdefault(journal, err)
        if not batch._future.done():  # Not cancelled by a writer (see _commit).
            # Not retrieved here: whether a writer retrieves it tells the block's exit whether
            # to report it (`_take_unobserved`, which then retrieves it for asyncio).
            batch._future.set_exception(err)
        self._keep_failed(journal, batch._future, err)
        if not isinstance(err, JournalFailedError):  # Its first failure was logged already.
            log.warning("append failed", journal=journal, error=str(err) or type(err).__name__)

    def _keep_failed(
        self, journal: str, future: asyncio.Future[pb.AppendResponse], err: BaseException
    ) -> None:
        """Keep a failed batch's future until the block ends; drop the observed ones each time
        the list doubles (amortised O(1) per failure). Past `failed_kept_max` kept, count the
        failure as unobserved instead (and retrieve it, so that asyncio does not log it)."""
        failed = self._failed_futures
        if len(failed) >= self._failed_prune_len:
            failed[:] = [entry for entry in failed if _unobserved(entry[1])]
            self._failed_prune_len = max(_failed_prune_len_min, 2 * len(failed))
        if len(failed) < self._failed_kept_max:
            failed.append((journal, future, err))
            return
        self._failed_overflow[journal] = self._failed_overflow.get(journal, 0) + 1
        self._failed_overflow_first = self._failed_overflow_first or err
        if not future.cancelled():
            future.exception()

    def _cancel(self, batch: AsyncAppend) -> None:
        """Fail `batch` because the service stops. In flight (sent at least once) means it may
        have committed."""
        in_flight = batch._state is AppendState.SENDING and batch._attempts > 0
        self._cancelled(batch, AppendCancelledError(batch.journal, maybe_committed=in_flight))

    def _cancelled(self, batch: AsyncAppend, err: AppendCancelledError) -> None:
        """Resolve `batch` as cancelled: its owner's choice, so neither logged as a failure nor
        counted in `failures`."""
        batch._state = AppendState.DONE
        self.stats.cancelled += 1
        if not batch._future.done():
            batch._future.set_exception(err)
            batch._future.exception()


def _unobserved(future: asyncio.Future[pb.AppendResponse]) -> bool:
    """Whether no writer has seen the failure on `future`: its exception was never retrieved
    (not awaited, nor `result()`/`exception()` called, which is what asyncio's own "exception
    was never retrieved" tracks), or a writer cancelled it before the failure was stored.
    A failure that a dependent batch's sending awaited counts as seen: it travels on as the
    cause of that batch's DependencyFailedError, which is itself awaited or reported."""
    return future.cancelled() or future._log_traceback


def _request_key(request: pb.AppendRequest) -> tuple[str, pb.AppendRequest | None, object]:
    """(journal, request to send, batching key) of an AppendRequest: batches join only
    appends with identical requests; a request of a journal name alone is the plain one."""
    validate_append_request(request)
    if request == pb.AppendRequest(journal=request.journal):
        return request.journal, None, request.journal
    copy = pb.AppendRequest()
    copy.CopyFrom(request)
    return copy.journal, copy, (copy.journal, copy.SerializeToString(deterministic=True))


def _dependencies(dependencies: Collection[Any]) -> frozenset[Any]:
    for index, dependency in enumerate(dependencies):
        if not isinstance(dependency, AsyncAppend | asyncio.Future):
            raise TypeError(
                f"dependencies[{index}]: must be an AsyncAppend or an asyncio.Future "
                f"(got {type(dependency).__name__})"
            )
    return frozenset(dependencies)
