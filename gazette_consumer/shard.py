"""A primary shard: recovery, then pipelined transactions.

`PrimaryShard.serve()` runs one primary assignment of a shard from start to finish:

1. Opens the shard's `AppendService`; if the spec has a recovery log, completes its playback
   with a hand-off (`recovery.py`: fencing the recorder of any older primary) and builds a
   Recorder; opens the Application's store (`new_store(shard, recorder)`), and restores the
   store's checkpoint, which fences every older instance of the store (docs/architecture.md,
   Invariants). With
   a recovery log, it then stores the recovered hints, and while it serves, stores the
   recorder's hints after commits (at most every `hints_interval_s`).
2. Re-writes the checkpoint's ACK intents and waits for them, before consuming anything: if
   the previous primary committed a transaction but died before acknowledging it, this
   acknowledges it; if it died in the middle of the next one, this rolls that one's pending
   messages back (an ACK whose clock readers already passed discards what followed it).
3. Opens the message source from the checkpoint (`source.py`) and runs transactions
   (`TxnDriver`, the shell of the `TxnLoop` state machine) until something fails.

It returns only by raising: `ShardFailedError` (naming the step and the shard) when anything
fails, or CancelledError when stopped. Either way the source is closed, the store destroyed
(pending commits abandoned, staged changes rolled back) and the AppendService's queued appends
cancelled, so that nothing of the open transaction commits.

Concurrency: everything runs on the task that awaits `serve()`; the only other tasks are the
AppendService's, the store's, the source's, and a read of the source while the loop waits on
several things at once.
"""

from __future__ import annotations

import asyncio
import functools
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Final, NoReturn

from broker.client.append_service import AppendService, AsyncAppend
from broker.client.route_cache import JournalClient
from broker.logging import get_logger
from broker.protocol import consumer_pb2 as cpb
from broker.protocol.recorded_op_pb2 import FSMHints
from gazette_consumer.application import Application, shard_labels
from gazette_consumer.checkpoint import Checkpoint, flatten_read_through
from gazette_consumer.message.publisher import Publisher
from gazette_consumer.recovery import ShardRecovery
from gazette_consumer.recoverylog.recorder import Recorder, RecorderError
from gazette_consumer.shard_handle import ShardProgress
from gazette_consumer.source import OpenedSource, open_source
from gazette_consumer.stores.base import Store
from gazette_consumer.transaction import ClosedTxn, TxnPhase
from gazette_consumer.txn_driver import ShardFailedError, TxnDriver, run_step

__all__ = ["HINTS_INTERVAL_S", "PrimaryShard", "ShardFailedError"]

HINTS_INTERVAL_S: Final = 10.0
"""Least time between two stores of a primary's recorded hints: each is an etcd write, and a
primary that recovers from slightly older hints only plays a little more of its log."""

_log = get_logger(__name__)


class _Notifier:
    """Wakes waiters whenever the shard's observable state (phase, progress) changes."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()

    async def wait(self) -> None:
        await self._event.wait()


class PrimaryShard:
    """One primary assignment of a shard; the Application's `Shard`.

    `on_change` is called (on the event loop, never blocking) when progress changes: after
    recovery, and whenever a transaction completes. `clock` is a monotonic clock in seconds for
    transaction durations (default: `time.monotonic`; the transaction loop reads it once per
    message, and the event loop's clock would add a Python call around it); `append_service` builds the shard's
    AppendService. `recovery` is the replica's recovery log (None: the spec has none).
    """

    def __init__(
        self,
        app: Application,
        spec: cpb.ShardSpec,
        fqn: str,
        client: JournalClient,
        *,
        on_change: Callable[[], None] = lambda: None,
        clock: Callable[[], float] | None = None,
        append_service: Callable[[JournalClient], AppendService] = AppendService,
        recovery: ShardRecovery | None = None,
        hints_interval_s: float = HINTS_INTERVAL_S,
    ) -> None:
        if hints_interval_s < 0:
            raise ValueError(f"hints_interval_s: must be >= 0 (got {hints_interval_s})")
        self._app = app
        self._spec = spec
        self._fqn = fqn
        self._client = client
        self._on_change = on_change
        self._clock = clock
        self._new_append_service = append_service
        self._labels = shard_labels(spec)
        self._store: Store | None = None
        self._appends: AppendService | None = None
        self._publisher: Publisher[AsyncAppend] | None = None
        self._progress = ShardProgress()
        self._notifier = _Notifier()
        self._driver: TxnDriver | None = None
        self._recovery = recovery
        self._hints_interval_s = hints_interval_s
        # The recorder's hints this primary last stored (None before the first), and the
        # progress of the last transaction they cover.
        self.recorded_hints: FSMHints | None = None
        self.recorded_hints_at: ShardProgress | None = None

    # --- The Shard protocol --------------------------------------------------------------------

    @property
    def id(self) -> str:
        return self._spec.id

    @property
    def fqn(self) -> str:
        return self._fqn

    @property
    def spec(self) -> cpb.ShardSpec:
        return self._spec

    @property
    def labels(self) -> Mapping[str, tuple[str, ...]]:
        return self._labels

    @property
    def store(self) -> Store:
        if self._store is None:
            raise RuntimeError(f"shard {self.id}: the store is not open")
        return self._store

    @property
    def publisher(self) -> Publisher[AsyncAppend]:
        if self._publisher is None:
            raise RuntimeError(f"shard {self.id}: the publisher is not ready")
        return self._publisher

    @property
    def append_service(self) -> AppendService:
        if self._appends is None:
            raise RuntimeError(f"shard {self.id}: the append service is not running")
        return self._appends

    @property
    def journal_client(self) -> JournalClient:
        return self._client

    def progress(self) -> ShardProgress:
        return self._progress

    # --- Observation (status, tests) -----------------------------------------------------------

    @property
    def txn_phase(self) -> TxnPhase | None:
        """Phase of the transaction loop (None before it starts)."""
        return None if self._driver is None else self._driver.fsm.phase

    @property
    def last_closed(self) -> ClosedTxn | None:
        """The last transaction whose commit started."""
        return None if self._driver is None else self._driver.last_closed

    async def wait_until(self, predicate: Callable[[PrimaryShard], bool]) -> None:
        """Wait until `predicate(self)` holds, re-checking at every phase or progress change.
        Bound it with a timeout: a shard that stopped changes nothing more."""
        while not predicate(self):
            await self._notifier.wait()

    # --- Serving -------------------------------------------------------------------------------

    async def serve(self) -> NoReturn:
        """Serve until cancelled or failed (see the module docstring)."""
        async with self._new_append_service(self._client) as appends:
            self._appends = appends
            recorder = await self._complete_recovery()
            store = await run_step(self.id, "app.new_store", self._app.new_store(self, recorder))
            _require(self.id, "app.new_store", store, "Store", STORE_METHODS)
            self._store = store
            hints_task: asyncio.Task[None] | None = None
            try:
                restore = store.restore_checkpoint(self)
                checkpoint = await run_step(self.id, "store.restore_checkpoint", restore)
                if self._recovery is not None:
                    stored = self._recovery.store_recovered_hints()
                    await run_step(self.id, "storing recovered hints", stored)
                    hints_task = asyncio.ensure_future(self._store_hints(self._recovery))
                self._publisher = Publisher(appends)
                await self._acknowledge_recovered(checkpoint)
                opened = await self._open_source(store, checkpoint)
                source = opened.source
                if opened.checkpoint is not checkpoint:  # Sources rewound (source_heads.py).
                    checkpoint = opened.checkpoint
                    self._record_progress(checkpoint, [])
                try:
                    self._driver = TxnDriver(
                        self,
                        self._app,
                        store,
                        source,
                        prior_read_through=flatten_read_through(checkpoint),
                        clock=self._clock or time.monotonic,
                        on_progress=self._record_progress,
                        on_phase=self._notifier.notify,
                        on_read=self._record_read,
                        create_revisions=opened.create_revisions,
                        fingerprints=opened.fingerprints,
                    )
                    self._notifier.notify()
                    await self._driver.run()
                finally:
                    # An Application's own source may fail to close: never instead of the
                    # error (or the cancellation) the shard stops with.
                    failing = sys.exc_info()[1]
                    await _cleanup(self.id, "source.close", source.close, failing)
            finally:
                failing = sys.exc_info()[1]  # What the shard is failing with (it always is).
                if hints_task is not None:
                    hints_task.cancel()
                    await asyncio.wait([hints_task])
                self._store = None
                await _destroy(self.id, store, failing)

    async def _complete_recovery(self) -> Recorder | None:
        if self._recovery is None:
            return None
        recorder: Recorder = await run_step(
            self.id, f"recovering from log {self._recovery.log}", self._recovery.complete()
        )
        return recorder

    async def _store_hints(self, recovery: ShardRecovery) -> None:
        """Store the recorder's hints after each completed transaction, at most every
        `hints_interval_s`. Hints are advisory: a failure to store them is logged, and the
        next completed transaction tries again."""
        stored_for: ShardProgress | None = None
        while True:
            await self.wait_until(functools.partial(_progressed, since=stored_for))
            stored_for = self._progress
            try:
                self.recorded_hints = await recovery.store_recorded_hints()
                self.recorded_hints_at = stored_for
            except RecorderError as err:
                # Fenced or failed: the store's next commit fails the shard with the reason.
                _log.warning("recorder hints not stored", shard=self.id, error=str(err))
                return
            except Exception as err:
                _log.warning("recorder hints not stored", shard=self.id, error=repr(err))
            self._notifier.notify()
            await asyncio.sleep(self._hints_interval_s)  # A rate bound, not a synchronisation.

    async def _acknowledge_recovered(self, checkpoint: Checkpoint) -> None:
        acks: list[AsyncAppend] = []
        intents = dict(checkpoint.ack_intents)
        if intents:
            step = "writing recovered ACK intents"
            acks = await run_step(self.id, step, self.publisher.write_ack_intents(intents))
            # asyncio.wait, not gather: cancelling a gather cancels the futures it gathers,
            # and these belong to the AppendService.
            await asyncio.wait([ack.future for ack in acks])
            for ack in acks:
                error = ack.exception()
                if error is not None:
                    raise ShardFailedError(self.id, step, error) from error
        self._record_progress(checkpoint, acks)

    async def _open_source(self, store: Store, checkpoint: Checkpoint) -> OpenedSource:
        try:
            return await open_source(
                self._app, self, store, checkpoint, self._client, on_idle=self._on_source_idle
            )
        except Exception as err:
            raise ShardFailedError(self.id, "opening the message source", err) from err

    def _record_progress(self, checkpoint: Checkpoint, acks: list[AsyncAppend]) -> None:
        publish_at = dict(self._progress.publish_at)
        for ack in acks:
            end = ack.result().commit.end
            publish_at[ack.journal] = max(publish_at.get(ack.journal, 0), end)
        self._progress = ShardProgress(flatten_read_through(checkpoint), publish_at)
        self._notifier.notify()
        self._on_change()

    def _on_source_idle(self) -> None:
        if self._driver is not None:
            self._driver.on_source_idle()

    def _record_read(self, read_through: Mapping[str, int]) -> None:
        """The source read through `read_through` without delivering a message: progress that
        no transaction reports (see txn_driver), as Stat must see it."""
        progress = self._progress
        merged = _merged(progress.read_through, read_through)
        if merged == progress.read_through:
            return
        self._progress = ShardProgress(merged, progress.publish_at)
        self._notifier.notify()
        self._on_change()


def _merged(read_through: Mapping[str, int], more: Mapping[str, int]) -> dict[str, int]:
    out = dict(read_through)
    for journal, offset in more.items():
        if offset > out.get(journal, 0):
            out[journal] = offset
    return out


def _progressed(shard: PrimaryShard, *, since: ShardProgress | None) -> bool:
    return shard.progress() is not since


async def _destroy(shard_id: str, store: Store, failing: BaseException | None) -> None:
    """`store.destroy()`, whose own error never replaces `failing`, the error the shard stops
    with: a store whose disk filled fails its commit, then often its close too ("Writer has
    previous error"), and the commit's error is the cause to report and to classify for a retry.
    """
    await _cleanup(shard_id, "store.destroy", store.destroy, failing)


async def _cleanup(
    shard_id: str, step: str, cleanup: Callable[[], Awaitable[None]], failing: BaseException | None
) -> None:
    """Call and await `cleanup` (`step` names it) as a stopping shard does, whose own error
    never replaces `failing`, what the shard stops with (an error, or the cancellation of a
    stop: replacing that would make a stopping shard fail, or retry). The cleanup's error
    (calling it included) is logged and noted on `failing`; with nothing failing, it is the
    shard's failure."""
    try:
        await cleanup()
    except Exception as err:
        if failing is None:
            raise ShardFailedError(shard_id, step, err) from err
        _log.warning(f"{step} failed too, as the shard stopped", shard=shard_id, error=repr(err))
        failing.add_note(f"then {step} failed too: {err!r}")


# What an Application's new_store must return has (the Store protocol), checked when it
# returns: a value without them failed later, in the shard's cleanup, with an AttributeError
# that named neither the Application nor what it returned (found by the bad-input audit).
STORE_METHODS: Final = ("restore_checkpoint", "start_commit", "destroy")


def _require(shard_id: str, step: str, value: object, kind: str, methods: tuple[str, ...]) -> None:
    """Raise ShardFailedError(step, TypeError) unless `value` has every one of `methods`."""
    missing = [name for name in methods if not callable(getattr(value, name, None))]
    if missing:
        error = TypeError(
            f"returned {type(value).__name__}, not a {kind} (it has no {', '.join(missing)})"
        )
        raise ShardFailedError(shard_id, step, error)
