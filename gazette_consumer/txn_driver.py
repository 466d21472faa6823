"""The asyncio shell of the transaction loop: drives a `TxnLoop` with real events.

`TxnDriver.run()` loops: it feeds the state machine what happened without waiting (the prior
transaction's commit or ACKs resolved, the deadline passed), asks it for the next step, and
does that step — waits for the first of a message / the prior's next barrier / the deadline;
takes a ready message or closes; calls `finalize_txn`; or starts the commit. A message taken
is consumed with the messages ready right behind it, as one run (`_consume`): per message, the
framework then costs an await of `consume_message`, a clock read and `try_next()`.

Starting a commit: build the checkpoint (the source's read-through offsets and producer states,
the Publisher's ACK intents), start the store's commit waiting for every append still pending
(all made by this transaction: the prior's completed before it could close), then queue the
ACK intents in the AppendService with the commit as their dependency. Queued there, before any
message of the next transaction, each ACK is appended after the commit is durable and ahead of
the next transaction's messages to the same journal, which a read-committed reader requires.

Read progress that delivers no message (a duplicate, a re-appended ACK, a rolled-back or abandoned
transaction) begins no transaction, so no commit would report it: `on_source_idle` (called by
the source when it consumed everything at hand) reports the source's read-through offsets as
progress while no transaction is open, as Gazette's consumer does, so that a Stat waiting on
those offsets returns. If the prior transaction is still completing, they are reported with it.

Any failure raises `ShardFailedError`, naming the step; the begun transaction is reported to
`finished_txn` as failed, and nothing more commits (the shard then destroys its store).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, Final, NoReturn

from broker.client.async_append import AsyncAppend
from broker.logging import get_logger
from gazette_consumer.application import Application, MessageSource, Shard
from gazette_consumer.checkpoint import Checkpoint, flatten_read_through, from_sequencer_checkpoint
from gazette_consumer.message.clock import clock_span
from gazette_consumer.message.message import Envelope
from gazette_consumer.metrics import ShardMetrics
from gazette_consumer.shard_spec import PRODUCER_PRUNE_HORIZON_S, recovery_log, txn_durations_s
from gazette_consumer.source_revisions import SourceFingerprints, stamp_create_revisions
from gazette_consumer.stores.base import OpFuture, Store
from gazette_consumer.transaction import (
    Await,
    ClosedTxn,
    Failed,
    Finalize,
    Poll,
    PriorPhase,
    StartCommit,
    TxnLoop,
    TxnPhase,
)

# Producers idle this long before their journal's newest are pruned from checkpoints.
_PRUNE_HORIZON: Final = clock_span(PRODUCER_PRUNE_HORIZON_S)

__all__ = ["CONSUME_RUN_MAX", "ShardFailedError", "TxnDriver"]

CONSUME_RUN_MAX = 512
"""Messages consumed in one run after its first, without stepping the transaction loop (see
`TxnDriver._consume`). Between runs the loop notices the prior transaction's progress (and
reports it) and its timer: this bounds how late, in messages, it does."""


_log = get_logger(__name__)


class ShardFailedError(Exception):
    """A shard stopped on an error. `step` names what failed (``app.consume_message``,
    ``store commit``, ...); the original exception is the `__cause__`."""

    def __init__(self, shard: str, step: str, cause: BaseException) -> None:
        detail = str(cause) or type(cause).__name__
        super().__init__(f"shard {shard}: {step}: {type(cause).__name__}: {detail}")
        self.shard = shard
        self.step = step


class StrayCancelledError(RuntimeError):
    """An Application (or a store, or a source) raised CancelledError while nothing was
    cancelling the shard: it awaited something another task cancelled. Left to propagate, it
    would end the shard's task as if it had been stopped, while the shard went on reporting
    PRIMARY and served nothing (found by the bad-input audit, 2026-11-30)."""

    def __init__(self) -> None:
        super().__init__(
            "raised CancelledError while the shard was not being stopped (it awaited something"
            " another task cancelled)"
        )


def stray_cancellation() -> bool:
    """Whether a CancelledError caught now is not a cancellation of the current task (its
    `cancelling()` count is 0): not a stop, but an error of whatever raised it."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() == 0


async def run_step(shard: str, step: str, awaitable: Any) -> Any:
    """Await `awaitable`, naming `step` in the ShardFailedError it fails with (a CancelledError
    that does not cancel this task included: `StrayCancelledError`)."""
    try:
        return await awaitable
    except Exception as err:
        raise ShardFailedError(shard, step, err) from err
    except asyncio.CancelledError as err:
        if not stray_cancellation():
            raise
        stray = StrayCancelledError()
        stray.__cause__ = err
        raise ShardFailedError(shard, step, stray) from stray


class TxnDriver:
    """Runs the transactions of one primary shard. See the module docstring.

    `on_progress(checkpoint, acks)` is called when a transaction completes (committed, ACKs
    written); `on_read(read_through)` when the source read on without delivering a message
    while no transaction was open (see `on_source_idle`); `on_phase()` when the loop's phase
    changes. `clock`: monotonic seconds.
    """

    def __init__(
        self,
        shard: Shard,
        app: Application,
        store: Store,
        source: MessageSource,
        *,
        prior_read_through: dict[str, int],
        clock: Callable[[], float],
        on_progress: Callable[[Checkpoint, list[AsyncAppend]], None],
        on_phase: Callable[[], None],
        on_read: Callable[[Mapping[str, int]], None] = lambda _read_through: None,
        create_revisions: Mapping[str, int] | None = None,
        fingerprints: SourceFingerprints | None = None,
    ) -> None:
        self._shard, self._app, self._store, self._source = shard, app, store, source
        # The sources' etcd create revisions, and the fingerprints of the bytes below each
        # one's offset, recorded in every checkpoint (source_revisions.py).
        self._create_revisions: Mapping[str, int] = create_revisions or {}
        self._fingerprints = fingerprints
        self._id = shard.id
        self._recovery_log = recovery_log(shard.spec)
        self._clock = clock
        self._on_progress, self._on_phase, self._on_read = on_progress, on_phase, on_read
        min_s, max_s = txn_durations_s(shard.spec)
        self.fsm = TxnLoop(min_s, max_s, wait_for_acks=not shard.spec.disable_wait_for_ack)
        self.last_closed: ClosedTxn | None = None
        self._txn_began = False
        # The prior transaction: its commit, its ACK appends, its checkpoint.
        self._prior_commit: OpFuture | None = None
        self._prior_acks: list[AsyncAppend] = []
        self._prior_checkpoint = Checkpoint()
        self._prior_read_through = prior_read_through
        # Read-through offsets the source reached without delivering a message while the prior
        # transaction was completing: reported once it has (None: nothing to report).
        self._idle_read_through: Mapping[str, int] | None = None
        self._metrics: ShardMetrics  # Opened by run(), for as long as the loop runs.

    async def run(self) -> NoReturn:
        fsm = self.fsm
        phase = fsm.phase
        # Opened here rather than in __init__ (a driver never run would keep the shard's series
        # forever), and closed in the `finally` below whichever way the loop ends: the shard's
        # last use of its series closing drops them (metrics.py).
        self._metrics = ShardMetrics(self._id)
        try:
            while True:
                self._observe_prior()
                self._observe_timer()
                if fsm.phase is not phase:
                    # Before the step, which may block for long (a stalled transaction).
                    phase = fsm.phase
                    self._on_phase()
                ack_pending = self._ack_pending()
                step = fsm.next_step(ack_pending)
                if isinstance(step, Await):
                    await self._await(step)
                elif isinstance(step, Poll):
                    envelope = self._try_next()
                    if envelope is None:
                        fsm.on_read_empty(self._clock(), ack_pending=ack_pending)
                    else:
                        await self._consume(envelope)
                elif isinstance(step, Finalize):
                    shard = self._shard
                    finalize = self._app.finalize_txn(shard, self._store, shard.publisher)
                    await run_step(self._id, "app.finalize_txn", finalize)
                    fsm.on_finalized()
                elif isinstance(step, StartCommit):
                    await self._start_commit()
                elif isinstance(step, Failed):
                    raise step.error
        except asyncio.CancelledError:
            self._abandon_txn(None)
            raise
        except Exception as err:
            if fsm.phase is not TxnPhase.FAILED:
                fsm.on_fail(err)
            self._on_phase()
            self._abandon_txn(err)
            if isinstance(err, ShardFailedError):
                raise
            raise ShardFailedError(self._id, "transaction loop", err) from err
        finally:
            self._metrics.close()

    # --- Observing without waiting -------------------------------------------------------------

    def _observe_prior(self) -> None:
        """Feed the prior transaction's progress (commit, then ACKs)."""
        fsm = self.fsm
        if fsm.prior is PriorPhase.COMMITTING:
            commit = self._prior_commit
            assert commit is not None  # Set whenever the prior is committing.
            if not commit.done():
                return
            if commit.cancelled():
                raise ShardFailedError(self._id, "store commit", asyncio.CancelledError())
            error = commit.exception()
            if error is not None:
                raise ShardFailedError(self._id, "store commit", error) from error
            fsm.on_prior_committed()
        if fsm.prior is PriorPhase.ACKING:
            if not all(ack.done() for ack in self._prior_acks):
                return
            for ack in self._prior_acks:
                error = ack.exception()
                if error is not None:
                    raise ShardFailedError(self._id, "writing ACK intents", error) from error
            fsm.on_prior_acked(self._clock())
            self._on_progress(self._prior_checkpoint, self._prior_acks)
            self._metrics.progressed(self._prior_read_through)
            self._prior_commit, self._prior_acks = None, []
            idle, self._idle_read_through = self._idle_read_through, None
            if idle is not None:
                self._on_read(idle)

    def on_source_idle(self) -> None:
        """The source consumed everything it had read (see the module docstring). Called by
        the source, from its `next()`, so at a moment when every message it returned was
        consumed: with no transaction open, its read-through offsets cover only content that
        delivered nothing, and are the shard's progress."""
        fsm = self.fsm
        if fsm.phase is not TxnPhase.IDLE:
            return  # The open transaction's commit reports them.
        read_through = self._source.checkpoint().read_through
        if fsm.prior is PriorPhase.DONE:
            self._on_read(read_through)
        else:
            self._idle_read_through = read_through

    def _observe_timer(self) -> None:
        deadline = self.fsm.deadline
        if deadline is not None:
            now = self._clock()
            if now >= deadline:
                self.fsm.on_tick(now)

    def _ack_pending(self) -> bool:
        # Asked only when it is the last thing that could keep the transaction open:
        # has_pending scans every producer, too costly to ask at every message.
        fsm = self.fsm
        if not (
            fsm.wait_for_acks
            and fsm.phase is TxnPhase.CONSUMING
            and fsm.min_elapsed
            and fsm.prior is PriorPhase.DONE
            and not fsm.mid_sequence
        ):
            return False
        return self._source.has_pending(self._prior_read_through)

    # --- Steps ---------------------------------------------------------------------------------

    def _try_next(self) -> Envelope[Any] | None:
        try:
            return self._source.try_next()
        except Exception as err:
            raise ShardFailedError(self._id, "reading messages", err) from err

    async def _await(self, step: Await) -> None:
        """Wait for the first of: a message, the prior's next barrier, the deadline."""
        if step.read:
            envelope = self._try_next()
            if envelope is not None:
                await self._consume(envelope)
                return
        waits: set[asyncio.Future[Any]] = set()
        if step.prior:
            waits.update(self._prior_barrier())
        read: asyncio.Task[Envelope[Any]] | None = None
        if step.read:
            read = asyncio.ensure_future(self._source.next())
            waits.add(read)
        timeout = None if step.deadline is None else max(0.0, step.deadline - self._clock())
        try:
            if waits:
                await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            else:
                assert timeout is not None, f"nothing to wait for in {step}"
                await asyncio.sleep(timeout)
        except BaseException as err:
            # Cancelled (the shard stops): the read is stopped, but its own failure must not
            # replace the cancellation (the shard would fail, or retry, instead of stopping).
            if read is not None:
                try:
                    await self._settle_read(read)
                except ShardFailedError as read_err:
                    err.add_note(f"then the pending read failed too: {read_err}")
            raise
        envelope = None if read is None else await self._settle_read(read)
        if envelope is not None:
            await self._consume(envelope)

    def _prior_barrier(self) -> list[asyncio.Future[Any]]:
        if self._prior_commit is not None and not self._prior_commit.done():
            return [self._prior_commit]
        # The AppendService's futures are awaited with asyncio.wait only, never cancelled.
        return [ack.future for ack in self._prior_acks if not ack.done()]

    async def _settle_read(self, read: asyncio.Task[Envelope[Any]]) -> Envelope[Any] | None:
        """Stop a pending read, keeping a message it returned regardless (none is lost). A
        read that ended cancelled without being stopped here raised CancelledError itself (a
        source that awaited something another task cancelled): a failure, or the loop would
        start such a read again and again, serving nothing."""
        stopped = not read.done()
        if stopped:
            read.cancel()
            await asyncio.wait({read})
        if read.cancelled():
            if stopped:
                return None
            raise ShardFailedError(self._id, "reading messages", StrayCancelledError())
        error = read.exception()
        if error is not None:
            raise ShardFailedError(self._id, "reading messages", error) from error
        return read.result()

    def _consume_failed(self, envelope: Envelope[Any], err: BaseException) -> ShardFailedError:
        """The error `consume_message` of `envelope` fails the shard with; a CancelledError
        that cancels this task (a stop) is raised as it is."""
        if isinstance(err, asyncio.CancelledError):
            if not stray_cancellation():
                raise err
            stray = StrayCancelledError()
            stray.__cause__, err = err, stray
        step = f"app.consume_message ({envelope.journal} offset {envelope.begin})"
        failed = ShardFailedError(self._id, step, err)
        failed.__cause__ = err
        return failed

    async def _consume(self, envelope: Envelope[Any]) -> None:
        """Consume `envelope`, then the messages ready right behind it, as one run (see
        `TxnLoop.on_message_run`): until none is ready, the transaction's timer is due (and no
        sequence holds it off), or CONSUME_RUN_MAX messages. No step, prior check or clock
        read beyond one per message happens in between: per message, this loop is the
        framework's whole cost.

        Inside an upstream ACK's sequence the transaction cannot close, so the timer is not
        read there; a source that can (`ReadCommittedIter.take_sequence`) hands the messages
        the sequence certainly goes on after at once, consumed with no check, clock read or
        `try_next` each (a chain's input ACKs ~40,000 messages at a time). The sequence's last
        message is still taken by `try_next` and checked: a transaction closes where it
        would message by message."""
        fsm, source, clock = self.fsm, self._source, self._clock
        consume = fsm.on_message(clock(), more_in_sequence=source.in_sequence)
        shard, store = self._shard, self._store
        if consume.begins_txn:
            self._txn_began = True
            await run_step(self._id, "app.begin_txn", self._app.begin_txn(shard, store))
        timer_at = fsm.timer_at
        assert timer_at is not None  # The transaction is consuming.
        consume_message, publisher = self._app.consume_message, shard.publisher
        take_sequence = getattr(source, "take_sequence", None)
        more = 0  # Messages of the run after the first.
        while True:
            try:
                await consume_message(shard, store, envelope, publisher)
            except (Exception, asyncio.CancelledError) as err:
                raise self._consume_failed(envelope, err)  # noqa: B904 -- chained there.
            if more == CONSUME_RUN_MAX:
                break
            if source.in_sequence:
                # No close here: the timer is not read. Messages the sequence goes on after, at
                # once (within the run's bound).
                if take_sequence is not None and (taken := take_sequence(CONSUME_RUN_MAX - more)):
                    for envelope in taken:
                        try:
                            await consume_message(shard, store, envelope, publisher)
                        except (Exception, asyncio.CancelledError) as err:
                            raise self._consume_failed(envelope, err)  # noqa: B904 -- chained there.
                    more += len(taken)
                    if more == CONSUME_RUN_MAX:
                        break
            elif clock() >= timer_at:
                break
            try:
                # Looked up per message, not once per run: a source may rebind it as it goes
                # (ReadCommittedIter binds it to a C iterator over each piece's run of messages
                # that commit alone; a stale binding would hand every later message out through
                # its Python path: ~1.5% of the read path, measured in d57a1cd).
                next_envelope = source.try_next()
            except Exception as err:
                raise ShardFailedError(self._id, "reading messages", err) from err
            if next_envelope is None:
                break
            envelope = next_envelope
            more += 1
        if more:
            fsm.on_message_run(more, more_in_sequence=source.in_sequence)

    async def _start_commit(self) -> None:
        shard, store = self._shard, self._store
        publisher = shard.publisher
        try:
            # A publish never awaited (or awaited by nobody yet) would be lost by this commit.
            publisher.check_finished()
            intents = publisher.build_ack_intents()
            positions = self._source.checkpoint(_PRUNE_HORIZON)
            checkpoint = from_sequencer_checkpoint(positions, intents)
            prints = self._fingerprints
            stamp_create_revisions(
                checkpoint, self._create_revisions, prints.at(checkpoint) if prints else None
            )
        except Exception as err:
            raise ShardFailedError(self._id, "building the checkpoint", err) from err
        # The futures rather than the AsyncAppends: a store may wrap a plain awaitable in a
        # task of its own and cancel it, which would cancel the AppendService's future with it.
        pending = shard.append_service.pending_except(self._recovery_log)
        wait_for = [append.future for append in pending]
        commit = await run_step(
            self._id, "store.start_commit", store.start_commit(shard, checkpoint, wait_for)
        )
        acks = await run_step(
            self._id, "queueing ACK intents", publisher.write_ack_intents(intents, [commit])
        )
        self.last_closed = self.fsm.on_commit_started(self._clock())
        self._metrics.commit_started(self.last_closed, commit)
        self._prior_commit, self._prior_acks = commit, acks
        self._prior_checkpoint = checkpoint
        self._prior_read_through = flatten_read_through(checkpoint)
        began, self._txn_began = self._txn_began, False
        if began:
            try:
                self._app.finished_txn(shard, store, commit)
            except Exception as err:
                raise ShardFailedError(self._id, "app.finished_txn", err) from err

    def _abandon_txn(self, error: Exception | None) -> None:
        """A begun transaction will never commit: tell `finished_txn`, as `begin_txn`
        promised, with a future failed by `error` (cancelled if None)."""
        began, self._txn_began = self._txn_began, False
        if not began:
            return
        failed: OpFuture = asyncio.get_running_loop().create_future()
        if error is None:
            failed.cancel()
        else:
            failed.set_exception(error)
            failed.exception()  # Retrieved: asyncio need not report it as lost.
        try:
            self._app.finished_txn(self._shard, self._store, failed)
        except Exception as err:
            # Never instead of what the shard stops with (the cause to report and classify).
            _log.warning(
                "app.finished_txn failed too, as the transaction was abandoned",
                shard=self._id,
                error=repr(err),
            )
            if error is not None:
                error.add_note(f"then app.finished_txn failed too: {err!r}")
