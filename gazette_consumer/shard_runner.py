"""Running many shards in one process: `ShardRunner`, and the `LocalShard` handle of each.

`ShardRunner` runs each shard as its own task in one TaskGroup. A shard that fails for a
transient cause (a broker restarting, a journal or recovery log not there yet, an etcd hiccup:
`shard_retry.classify`) logs it and starts over after a back-off (`ShardRetryPolicy`: doubling,
capped, a bounded number of attempts in a row), reporting BACKFILL meanwhile (`retrying` says
why). A shard that fails for good — a permanent cause, or a transient one that outlasted its
attempts — records its error in its status (FAILED, with what to fix, as Stat and List report
it), logs it with the shard's ID, and ends; the other shards keep running. Only cancellation
(stopping a shard, or leaving the runner) and bugs in the runner itself propagate.

`LocalShard` implements `ShardHandle` (shard_handle.py), so a consumer member can start shards
through `ShardRunner.start_shard`, as assignments come and go.

Recovery logs (recovery.py). A shard whose spec has a `recovery_log_prefix` plays its log into
a directory of its own under the runner's `data_dir` (default: the system's temporary
directory), reporting BACKFILL meanwhile. A standby keeps tailing the log once caught up and
reports STANDBY from then on (so the allocator hands the primary's slot over only to a standby
that can take over); when promoted, it hands the log off and serves from the state it has
already played, without replaying the history. A primary plays, hands off, and serves. The
runner's `hints` (a HintStore over the consumer group's etcd) is where hints are read from and
stored; without it, every recovery plays the whole log. A shard without a recovery log reports
STANDBY at once and serves once promoted.

For in-process use without etcd (tests, the embedded default), `start(spec)` starts a primary
directly, and `run_shards` serves a fixed set of specs until cancelled.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from broker.client.route_cache import JournalClient
from broker.logging import get_logger
from broker.protocol import consumer_pb2 as cpb
from gazette_consumer.application import Application
from gazette_consumer.hints import HintStore
from gazette_consumer.metrics import ShardSeriesUse
from gazette_consumer.recovery import ShardRecovery
from gazette_consumer.shard import PrimaryShard, ShardFailedError
from gazette_consumer.shard_handle import ShardProgress, ShardRole, ShardStart, StartShard
from gazette_consumer.shard_retry import GiveUp, RetryAfter, ShardRetries, ShardRetryPolicy
from gazette_consumer.shard_spec import check_runnable, recovery_log
from gazette_consumer.topology import default_root, shard_key
from gazette_consumer.txn_driver import StrayCancelledError, run_step, stray_cancellation

__all__ = ["LocalShard", "ShardRetryPolicy", "ShardRunner", "ShardRunnerError", "run_shards"]

Code = cpb.ReplicaStatus.Code


class AssignmentUnknownError(RuntimeError):
    """etcd could not be read, within its bound, to tell whether a replica that failed may
    start over (LocalShard._holds_assignment)."""


class ShardRunnerError(RuntimeError):
    """The runner was used out of order (not entered, closed, or a shard ID already running)."""


class LocalShard:
    """A shard replica of this process. See the module docstring and `ShardHandle`."""

    def __init__(
        self,
        start: ShardStart,
        new_primary: Callable[..., PrimaryShard],
        new_recovery: Callable[[cpb.ShardSpec], ShardRecovery | None] = lambda _spec: None,
        *,
        retry: ShardRetryPolicy | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._start = start
        self._new_recovery = new_recovery
        self.recovery: ShardRecovery | None = None
        self._spec = start.spec
        self._new_primary = new_primary
        self._status = cpb.ReplicaStatus(code=Code.IDLE)
        self._promoted = asyncio.Event()
        if start.role is ShardRole.PRIMARY:
            self._promoted.set()
        self._primary: PrimaryShard | None = None
        self._progress = ShardProgress()
        self._task: asyncio.Task[None] | None = None
        self._done = asyncio.Event()
        self._retries = ShardRetries(retry or ShardRetryPolicy())
        self._sleep = sleep
        self._clock = clock
        # When the current attempt reached STANDBY or PRIMARY (None: not yet).
        self._serving_since: float | None = None
        self.retrying: RetryAfter | None = None
        """The last transient failure, while the replica waits to start over or starts over
        (None once it serves again, or if it never failed)."""
        # The shard's metric series are kept from the replica's start until it is stopped
        # (metrics.py), across its attempts: a retry does not reset its counters, and once it
        # failed for good its read-through (and so its lag) is still exported.
        self._series = ShardSeriesUse(start.spec.id)

    @property
    def id(self) -> str:
        return self._spec.id

    @property
    def fqn(self) -> str:
        return self._start.fqn

    @property
    def primary(self) -> PrimaryShard | None:
        """The serving primary (None while standby, or before it starts)."""
        return self._primary

    # --- ShardHandle ---------------------------------------------------------------------------

    def status(self) -> cpb.ReplicaStatus:
        out = cpb.ReplicaStatus()
        out.CopyFrom(self._status)
        return out

    def progress(self) -> ShardProgress:
        if self._primary is not None:
            return self._primary.progress()
        return self._progress

    def promote(self) -> None:
        self._promoted.set()

    def update_spec(self, spec: cpb.ShardSpec) -> None:
        # A running primary keeps the spec it started with (its sources and durations are
        # fixed for its reader and transaction loop); the next assignment uses this one.
        self._spec = spec

    async def stop(self) -> None:
        # Released at once rather than once stopped: a stop that never ends (a member gives up
        # waiting) must not keep the series forever. A transaction loop still running keeps
        # them until it ends.
        self._series.close()
        task = self._task
        if task is not None and not task.done():
            task.cancel()
        await self._done.wait()

    # --- Running -------------------------------------------------------------------------------

    async def wait_stopped(self) -> None:
        """Wait until the shard's task has ended (failed or stopped)."""
        await self._done.wait()

    async def run(self) -> None:
        """The shard's task: attempts (see `_attempt`) until one fails for good or it is
        cancelled; transient failures are retried after a back-off (module docstring)."""
        while True:
            failure = await self._attempt()
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                # Stopped while it failed (a cleanup's error swallowed the cancellation): a stop
                # is never turned into a retry, nor into FAILED.
                get_logger(__name__).warning("shard failed as it stopped", error=str(failure))
                raise asyncio.CancelledError
            served_s = None if self._serving_since is None else self._clock() - self._serving_since
            self._serving_since = None
            decision = self._retries.on_failure(failure, served_s=served_s)
            if isinstance(decision, GiveUp):
                self._fail(decision.message)
                return
            get_logger(__name__).warning(
                "shard failed transiently; starting over",
                shard=self.id,
                attempt=decision.attempt,
                delay_s=decision.delay_s,
                error=decision.error,
            )
            self.retrying = decision
            self._set_status(cpb.ReplicaStatus(code=Code.BACKFILL))
            await self._sleep(decision.delay_s)
            try:
                held = await self._holds_assignment()
            except AssignmentUnknownError as err:
                self._fail(f"{failure} (not retried: {err})")
                return
            if not held:
                # The assignment left this member while it failed (a paused process, back):
                # starting over would restore the shard again and fence the replica that took
                # it over, which then fails for good (found by audit, 2026-11-29). Asked only
                # before a retry (a permanent failure fails as it is, even while etcd cannot be
                # read). The member stops this replica once its view of etcd catches up.
                get_logger(__name__).warning(
                    "shard's assignment left this member; not started over",
                    shard=self.id,
                    error=str(failure),
                )
                self._fail(f"{failure} (the shard's assignment left this member: not retried)")
                return

    async def _attempt(self) -> ShardFailedError:
        """Standby until promoted, then primary, until it fails (returns why) or is cancelled."""
        try:
            recovery = self.recovery = await self._start_recovery()
            if not self._promoted.is_set():
                if recovery is not None:
                    step = f"playing recovery log {recovery.log}"
                    await run_step(self.id, step, recovery.wait_tailing())
                self._set_status(cpb.ReplicaStatus(code=Code.STANDBY))
                if recovery is not None:
                    step = f"tailing recovery log {recovery.log}"
                    await run_step(self.id, step, recovery.wait_playing(self._promoted))
                else:
                    await self._promoted.wait()
            primary = self._new_primary(
                self._spec, self._start.fqn, self._on_primary_change, recovery
            )
            self._primary = primary
            await primary.serve()
        except ShardFailedError as err:
            return err
        except Exception as err:  # A bug of the runner; still only this shard's problem.
            # Chained, as every ShardFailedError is: its cause decides whether it is retried
            # (an OSError of a full disk from a teardown is transient here as anywhere else).
            failed = ShardFailedError(self.id, "shard runner", err)
            failed.__cause__ = err
            return failed
        except asyncio.CancelledError as err:
            if not stray_cancellation():
                raise  # Stopped.
            # Not a stop: what raised it failed (txn_driver.StrayCancelledError).
            stray = StrayCancelledError()
            stray.__cause__ = err
            failed = ShardFailedError(self.id, "shard runner", stray)
            failed.__cause__ = stray
            return failed
        finally:
            if self._primary is not None:
                self._progress = self._primary.progress()
            self._primary = None
            if self.recovery is not None:
                await self.recovery.close()
        raise AssertionError("unreachable: PrimaryShard.serve() returns only by raising")

    async def _holds_assignment(self) -> bool:
        """Whether this member still holds the replica's assignment, asked of etcd (see
        ShardStart.still_assigned). While etcd cannot be read, asked again after back-offs
        doubling up to the retry policy's cap, at most its `attempts_max` times: a replica that
        cannot tell must not restore the shard, and one that still cannot after that raises
        AssignmentUnknownError (a stop cancels the wait)."""
        check = self._start.still_assigned
        if check is None:
            return True
        policy = self._retries.policy
        delay = policy.initial_s
        for attempt in range(1, policy.attempts_max + 1):
            try:
                return await check()
            except Exception as err:
                if attempt == policy.attempts_max:
                    raise AssignmentUnknownError(
                        f"etcd could not say whether this member still holds the shard's"
                        f" assignment ({attempt} tries): {err}"
                    ) from err
                get_logger(__name__).warning(
                    "shard cannot read its assignment from etcd; asking again",
                    shard=self.id,
                    error=str(err),
                    delay_s=delay,
                )
            await self._sleep(delay)
            delay = min(policy.max_s, max(delay * 2, 0.05))
        raise AssertionError("unreachable: attempts_max >= 1")

    async def _start_recovery(self) -> ShardRecovery | None:
        recovery = self._new_recovery(self._spec)
        if recovery is not None:
            self._set_status(cpb.ReplicaStatus(code=Code.BACKFILL))
            step = f"starting recovery log {recovery.log}"
            await run_step(self.id, step, recovery.start())
        return recovery

    def _on_primary_change(self) -> None:
        primary = self._primary
        if primary is not None and self._status.code != Code.PRIMARY:
            self._status = cpb.ReplicaStatus(code=Code.PRIMARY)
            self._serving()
        self._start.on_change()

    def _fail(self, message: str) -> None:
        # A logger looked up now rather than at import: failures are rare, and this way the
        # record follows the logging configuration in force when it happens (e.g. a test's).
        get_logger(__name__).error("shard failed", shard=self.id, fqn=self.fqn, error=message)
        self._set_status(cpb.ReplicaStatus(code=Code.FAILED, errors=[message]))

    def _set_status(self, status: cpb.ReplicaStatus) -> None:
        self._status = status
        if status.code == Code.STANDBY:
            self._serving()
        self._start.on_change()

    def _serving(self) -> None:
        self._serving_since = self._clock()
        self.retrying = None


class ShardRunner:
    """Runs shards of one Application in this process. Use as ``async with``.

    `root` is the consumer group's etcd root (shard FQNs are ``<root>/items/<id>``).
    `data_dir` holds the directories recovery logs are played into (None: the system's temporary
    directory); `hints` stores recovery-log hints (None: none are stored; see the module
    docstring); `retry` is how replicas retry transient failures (see `shard_retry`).
    `shard_options` are passed to every `PrimaryShard` (clock, append_service,
    hints_interval_s).
    """

    def __init__(
        self,
        app: Application,
        client: JournalClient,
        *,
        root: str | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        hints: HintStore | None = None,
        retry: ShardRetryPolicy | None = None,
        **shard_options: Any,
    ) -> None:
        self._retry = retry or ShardRetryPolicy()
        self._data_dir = data_dir
        self._hints = hints
        self._app = app
        self._client = client
        self._root = root if root is not None else default_root(type(app).__name__)
        self._shard_options = shard_options
        self._shards: dict[str, LocalShard] = {}
        self._tg: asyncio.TaskGroup | None = None
        self._closed = False

    async def __aenter__(self) -> ShardRunner:
        if self._tg is not None or self._closed:
            raise ShardRunnerError("a ShardRunner runs once")
        self._tg = asyncio.TaskGroup()
        await self._tg.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._closed = True
        assert self._tg is not None
        try:
            for shard in list(self._shards.values()):
                await shard.stop()
        except BaseException as err:
            # Interrupted (cancelled, say): the shards not stopped yet end with the group, and
            # let go of their series here, as a stop would have.
            for shard in self._shards.values():
                shard._series.close()
            await self._tg.__aexit__(type(err), err, err.__traceback__)
            raise
        # Every shard's task has ended (and they never raise but for cancellation), so the
        # group has nothing left to report: an error of the `async with` body propagates as
        # itself rather than wrapped in an ExceptionGroup.
        await self._tg.__aexit__(None, None, None)

    @property
    def root(self) -> str:
        return self._root

    def fqn(self, shard_id: str) -> str:
        return shard_key(self._root, shard_id)

    def start_shard(self, start: ShardStart) -> LocalShard:
        """Start a replica as `start` says, in the background (a `StartShard`)."""
        if self._tg is None or self._closed:
            raise ShardRunnerError("start_shard: the runner is not running")
        shard = LocalShard(start, self._new_primary, self._new_recovery, retry=self._retry)
        shard._task = task = self._tg.create_task(shard.run(), name=f"shard {start.spec.id}")
        # Set by a callback rather than by run() itself: a task cancelled before it first ran
        # never executes its body.
        task.add_done_callback(lambda _task: shard._done.set())
        replaced = self._shards.get(start.spec.id)
        if replaced is not None and replaced._done.is_set():
            # Ended without a stop (it failed for good), and out of the runner's reach from now
            # on: it lets go of the series here, after the new replica took them up.
            replaced._series.close()
        self._shards[start.spec.id] = shard
        return shard

    def start(
        self,
        spec: cpb.ShardSpec,
        *,
        role: ShardRole = ShardRole.PRIMARY,
        on_change: Callable[[], None] = lambda: None,
    ) -> LocalShard:
        """Validate `spec` and start it (a ValidationError naming the field starts nothing)."""
        check_runnable(spec)
        running = self._shards.get(spec.id)
        if running is not None and not running._done.is_set():
            raise ShardRunnerError(f"start: shard {spec.id} is already running")
        return self.start_shard(ShardStart(spec, role, self.fqn(spec.id), on_change))

    def shard(self, shard_id: str) -> LocalShard:
        try:
            return self._shards[shard_id]
        except KeyError:
            raise KeyError(f"shard {shard_id} was never started here") from None

    def statuses(self) -> dict[str, cpb.ReplicaStatus]:
        """Every shard started here and its status, by ID (the List of this process)."""
        return {shard_id: shard.status() for shard_id, shard in sorted(self._shards.items())}

    async def stop(self, shard_id: str) -> None:
        """Stop a shard abruptly (its open transaction is abandoned, as in a crash)."""
        await self.shard(shard_id).stop()

    def _new_primary(
        self,
        spec: cpb.ShardSpec,
        fqn: str,
        on_change: Callable[[], None],
        recovery: ShardRecovery | None,
    ) -> PrimaryShard:
        return PrimaryShard(
            self._app,
            spec,
            fqn,
            self._client,
            on_change=on_change,
            recovery=recovery,
            **self._shard_options,
        )

    def _new_recovery(self, spec: cpb.ShardSpec) -> ShardRecovery | None:
        if not recovery_log(spec):
            return None
        return ShardRecovery(self._client, spec, data_dir=self._data_dir, hints=self._hints)


async def run_shards(
    app: Application,
    client: JournalClient,
    specs: Iterable[cpb.ShardSpec],
    *,
    root: str | None = None,
    **shard_options: Any,
) -> None:
    """Serve `specs` as primaries in this process until cancelled. Failed shards stay failed
    (and logged); the others keep running."""
    specs = list(specs)
    for spec in specs:
        check_runnable(spec)
    async with ShardRunner(app, client, root=root, **shard_options) as runner:
        for spec in specs:
            runner.start(spec)
        await asyncio.Event().wait()  # Until cancelled; leaving the runner stops the shards.


if TYPE_CHECKING:
    # The type checker proves that a runner can start a consumer member's shards (and so that
    # LocalShard implements ShardHandle).
    def _start_shard_of(runner: ShardRunner) -> StartShard:
        return runner.start_shard
