"""The shard transaction loop as an explicit state machine (sans-IO).

A primary shard processes read-committed messages in *pipelined* consumer transactions. This
module decides, from events the shard's asyncio shell feeds it, when a transaction begins, what
the shell should wait for next, and when the transaction closes; it does no I/O and keeps no
clock of its own (every timed event carries `now`, in seconds of any monotonic clock).

The rules (those of Gazette's consumer, docs/architecture.md, Invariants):

- A transaction holds at least one message: it begins with the first message consumed, and the
  shell calls the application's `begin_txn` just before consuming it (`Consume.begins_txn`).
- It runs for at least `min_duration_s` and reads for at most `max_duration_s`, both measured
  from that first message.
- It does not close while the *prior* transaction is incomplete: its commit must resolve and
  then its ACK intents be written. Meanwhile this transaction keeps consuming — that is the
  pipelining. If its maximum duration passes first, it stops reading and *stalls* until the
  prior completes (the only case in which ready messages are not consumed).
- Past the minimum duration, with the prior complete, it closes as soon as no message is
  immediately ready (the read channel is drained), or once its maximum duration is reached.
  Optionally (`wait_for_acks`) it also waits, until the maximum, while a producer's transaction
  that began since the last checkpoint awaits its ACK (the shell passes `ack_pending`).
- It never closes in the middle of the committed messages of one ACK (`more_in_sequence`), so
  that a read-committed reader's transaction boundaries fall between upstream transactions.
- Closing is two steps: the shell calls `finalize_txn` (FINALIZING), then builds the checkpoint
  and starts the store's commit (STARTING_COMMIT). The next transaction begins at once, with
  this one as its prior.

Phases (`TxnPhase`) and the prior transaction's progress (`PriorPhase`) together are the state.
The shell loop is::

    while True:
        step = fsm.next_step(ack_pending=...)
        match step:
            case Await(read, prior, deadline):   wait for the first of those; feed the event
            case Poll(deadline):                  take a ready tick or message, else on_read_empty

A message is fed with `on_message`; the ready messages right behind it may be consumed as a
run, up to `timer_at`, and fed at once with `on_message_run` (see there why that is the same).
            case Finalize():                      app.finalize_txn(); fsm.on_finalized()
            case StartCommit():                   store.start_commit(...); fsm.on_commit_started()
            case Failed(error):                   stop the shard

Every `on_*` event method checks that it is legal in the current state first (`TRANSITIONS`
names the phases that accept each event); an illegal event raises `TxnStateError` and changes
nothing. `next_step` dispatches to one `_step_<phase>` handler per phase.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

__all__ = [
    "TRANSITIONS",
    "Await",
    "ClosedTxn",
    "Consume",
    "Failed",
    "Finalize",
    "Poll",
    "PriorPhase",
    "StartCommit",
    "Step",
    "TxnConfigError",
    "TxnEvent",
    "TxnLoop",
    "TxnPhase",
    "TxnStateError",
]


class TxnPhase(enum.Enum):
    """Where the current transaction stands."""

    IDLE = "idle"
    """No message consumed yet: the transaction has not begun."""
    CONSUMING = "consuming"
    """At least one message consumed; reading continues until the transaction may close."""
    STALLED = "stalled"
    """The maximum duration passed before the prior transaction completed: reading stopped,
    and the transaction closes as soon as the prior completes."""
    FINALIZING = "finalizing"
    """Closed to messages: the shell calls the application's `finalize_txn`."""
    STARTING_COMMIT = "starting_commit"
    """Finalized: the shell builds the checkpoint and starts the store's commit."""
    FAILED = "failed"
    """Terminal: the shard must stop; nothing of this transaction may commit."""


class PriorPhase(enum.Enum):
    """Progress of the prior transaction, which the current one must not overtake."""

    DONE = "done"
    """There is none (a fresh shard; recovery wrote its ACK intents before the loop), or it
    committed and its ACK intents were written."""
    COMMITTING = "committing"
    """Its store commit has not resolved yet."""
    ACKING = "acking"
    """It committed; its ACK intents are being written."""


class TxnEvent(enum.Enum):
    """What the shell reports to the state machine (one `on_*` method each)."""

    MESSAGE = "message"
    MESSAGE_RUN = "message_run"
    TICK = "tick"
    PRIOR_COMMITTED = "prior_committed"
    PRIOR_ACKED = "prior_acked"
    READ_EMPTY = "read_empty"
    FINALIZED = "finalized"
    COMMIT_STARTED = "commit_started"
    FAIL = "fail"


_WAITING: Final = frozenset({TxnPhase.IDLE, TxnPhase.CONSUMING, TxnPhase.STALLED})

TRANSITIONS: Final[dict[TxnEvent, frozenset[TxnPhase]]] = {
    TxnEvent.MESSAGE: frozenset({TxnPhase.IDLE, TxnPhase.CONSUMING}),
    TxnEvent.MESSAGE_RUN: frozenset({TxnPhase.CONSUMING}),
    TxnEvent.TICK: frozenset({TxnPhase.CONSUMING}),
    TxnEvent.PRIOR_COMMITTED: _WAITING,
    TxnEvent.PRIOR_ACKED: _WAITING,
    TxnEvent.READ_EMPTY: frozenset({TxnPhase.CONSUMING}),
    TxnEvent.FINALIZED: frozenset({TxnPhase.FINALIZING}),
    TxnEvent.COMMIT_STARTED: frozenset({TxnPhase.STARTING_COMMIT}),
    TxnEvent.FAIL: frozenset(TxnPhase) - {TxnPhase.FAILED},
}
"""The phases in which each event is legal. Some events have further conditions (a tick before
its deadline, a prior event that does not match the prior's phase): see the `on_*` methods."""


class TxnStateError(RuntimeError):
    """An event was fed in a state that does not accept it. Nothing was changed."""


class TxnConfigError(ValueError):
    """Transaction durations out of their domain."""


# --- Steps: what the shell does next ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Await:
    """Block until one of the enabled things happens, then feed it as an event.

    `read`: a message becomes available (`on_message`). `prior`: the prior transaction reaches
    its next barrier — its commit resolves (`on_prior_committed`) or, once committed, its ACK
    writes finish (`on_prior_acked`). `deadline`: the clock reaches it (`on_tick`); None if no
    timer is armed.
    """

    read: bool
    prior: bool
    deadline: float | None


@dataclass(frozen=True, slots=True)
class Poll:
    """Do not block. If the deadline has passed, feed `on_tick`; else if a message is ready at
    once, feed `on_message`; else feed `on_read_empty`, which closes the transaction."""

    deadline: float | None


@dataclass(frozen=True, slots=True)
class Finalize:
    """Call the application's `finalize_txn`, then `on_finalized`."""


@dataclass(frozen=True, slots=True)
class StartCommit:
    """Build the checkpoint (read-through offsets, producer states, ACK intents), start the
    store's commit waiting for the transaction's publishes, queue its ACK intents behind that
    commit, then `on_commit_started`."""


@dataclass(frozen=True, slots=True)
class Failed:
    """The shard failed with `error`: stop, and commit nothing more."""

    error: BaseException


Step = Await | Poll | Finalize | StartCommit | Failed


@dataclass(frozen=True, slots=True)
class Consume:
    """Consume the message just read. If `begins_txn`, call `begin_txn` before it."""

    begins_txn: bool


@dataclass(frozen=True, slots=True)
class ClosedTxn:
    """A transaction whose commit has started: what it did and how its time was spent.

    `stalled_at` is when it stopped reading (its maximum duration) while the prior was still
    incomplete, or `closed_at` if it never stalled.
    """

    sequence: int
    consumed: int
    began_at: float
    stalled_at: float
    closed_at: float
    commit_started_at: float


# --- The state machine --------------------------------------------------------------------------


class TxnLoop:
    """The state of one shard's transaction loop. See the module docstring.

    Not thread-safe; the shard's task is its only user.
    """

    def __init__(
        self, min_duration_s: float, max_duration_s: float, *, wait_for_acks: bool = True
    ) -> None:
        if not (math.isfinite(min_duration_s) and min_duration_s >= 0):
            raise TxnConfigError(f"min_duration_s: must be >= 0 (got {min_duration_s!r})")
        if not (math.isfinite(max_duration_s) and max_duration_s > 0):
            raise TxnConfigError(f"max_duration_s: must be > 0 (got {max_duration_s!r})")
        self.min_duration_s = min_duration_s
        self.max_duration_s = max_duration_s
        self.wait_for_acks = wait_for_acks

        self._phase = TxnPhase.IDLE
        self._prior = PriorPhase.DONE
        self._error: BaseException | None = None
        self._sequence = 0  # Transactions whose commit started.
        self._messages_total = 0
        self._reset_txn()
        self._handlers: dict[TxnPhase, Callable[[bool], Step]] = {
            TxnPhase.IDLE: self._step_idle,
            TxnPhase.CONSUMING: self._step_consuming,
            TxnPhase.STALLED: self._step_stalled,
            TxnPhase.FINALIZING: self._step_finalizing,
            TxnPhase.STARTING_COMMIT: self._step_starting_commit,
            TxnPhase.FAILED: self._step_failed,
        }

    def _reset_txn(self) -> None:
        self._consumed = 0
        self._began_at = 0.0
        self._stalled_at: float | None = None
        self._closed_at = 0.0
        self._min_elapsed = False
        self._max_elapsed = False
        self._mid_sequence = False

    # --- Observers -----------------------------------------------------------------------------

    @property
    def phase(self) -> TxnPhase:
        return self._phase

    @property
    def prior(self) -> PriorPhase:
        return self._prior

    @property
    def error(self) -> BaseException | None:
        """Why the loop failed (set in FAILED only)."""
        return self._error

    @property
    def consumed(self) -> int:
        """Messages consumed by the current transaction."""
        return self._consumed

    @property
    def messages_total(self) -> int:
        """Messages consumed by all transactions so far (including the current one)."""
        return self._messages_total

    @property
    def commits_started(self) -> int:
        """Transactions whose commit has started."""
        return self._sequence

    @property
    def min_elapsed(self) -> bool:
        return self._min_elapsed

    @property
    def max_elapsed(self) -> bool:
        return self._max_elapsed

    @property
    def mid_sequence(self) -> bool:
        """True while the committed messages of one upstream ACK are being consumed."""
        return self._mid_sequence

    @property
    def deadline(self) -> float | None:
        """When the next timer fires: the minimum duration's end, then the maximum's; None when
        no timer is armed (before the first message, mid-sequence, or after the maximum)."""
        if self._mid_sequence:
            return None
        return self.timer_at

    @property
    def timer_at(self) -> float | None:
        """When the transaction's next timer is due, whether or not a sequence holds it off
        (`deadline` is None mid-sequence); None outside CONSUMING. The end of a run of
        messages the shell consumes without stepping (see `on_message_run`)."""
        if self._phase is not TxnPhase.CONSUMING:
            return None
        if not self._min_elapsed:
            return self._began_at + self.min_duration_s
        return self._began_at + self.max_duration_s

    def blocks(self, ack_pending: bool = False) -> bool:
        """True if the current transaction must not close yet even if nothing is ready.

        Only meaningful in CONSUMING (past the maximum duration a transaction is STALLED or
        closing instead).
        """
        return (
            self._mid_sequence
            or not self._min_elapsed
            or self._prior is not PriorPhase.DONE
            or (self.wait_for_acks and ack_pending and not self._max_elapsed)
        )

    # --- What to do next: one handler per phase ------------------------------------------------

    def next_step(self, ack_pending: bool = False) -> Step:
        """What the shell must do next. `ack_pending`: a producer's transaction begun since the
        last checkpoint awaits its ACK (see the module docstring). Changes nothing."""
        return self._handlers[self._phase](ack_pending)

    def _step_idle(self, _ack_pending: bool) -> Step:
        # Nothing to close: wait for the first message, noting the prior's progress meanwhile.
        return Await(read=True, prior=self._prior_pending, deadline=None)

    def _step_consuming(self, ack_pending: bool) -> Step:
        if self.blocks(ack_pending):
            return Await(read=True, prior=self._prior_pending, deadline=self.deadline)
        return Poll(deadline=self.deadline)

    def _step_stalled(self, _ack_pending: bool) -> Step:
        return Await(read=False, prior=True, deadline=None)

    def _step_finalizing(self, _ack_pending: bool) -> Step:
        return Finalize()

    def _step_starting_commit(self, _ack_pending: bool) -> Step:
        return StartCommit()

    def _step_failed(self, _ack_pending: bool) -> Step:
        assert self._error is not None  # Set together with FAILED.
        return Failed(self._error)

    @property
    def _prior_pending(self) -> bool:
        return self._prior is not PriorPhase.DONE

    # --- Events --------------------------------------------------------------------------------

    def on_message(self, now: float, *, more_in_sequence: bool = False) -> Consume:
        """A read-committed message is ready. Returns how to consume it.

        `more_in_sequence`: more messages committed by the same upstream ACK follow at once;
        the transaction will not close (nor time out) before the last of them.
        """
        self._check(TxnEvent.MESSAGE)
        begins = self._phase is TxnPhase.IDLE
        if begins:
            self._phase = TxnPhase.CONSUMING
            self._began_at = now
        self._consumed += 1
        self._messages_total += 1
        self._mid_sequence = more_in_sequence
        return Consume(begins_txn=begins)

    def on_message_run(self, count: int, *, more_in_sequence: bool = False) -> None:
        """`count` more messages were consumed, in a run right after an `on_message`, with no
        step in between. Stepping per message would decide nothing else: while a message is
        ready and the timer is not due (or a sequence holds it off), a consuming transaction
        consumes it whatever its prior does. So the shell may take a run of ready messages
        up to `timer_at` (or on to the end of a sequence), and report it at once.

        `more_in_sequence` is that of the run's last message.
        """
        self._check(TxnEvent.MESSAGE_RUN)
        if count < 1:
            raise TxnStateError(f"message_run: count must be >= 1 (got {count})")
        self._consumed += count
        self._messages_total += count
        self._mid_sequence = more_in_sequence

    def on_tick(self, now: float) -> None:
        """The clock reached `deadline` (a tick before it is illegal)."""
        self._check(TxnEvent.TICK)
        deadline = self.deadline
        if deadline is None or now < deadline:
            raise TxnStateError(
                f"tick at {now}: no timer is due in phase {self._phase.value} (deadline {deadline})"
            )
        self._min_elapsed = True
        if now < self._began_at + self.max_duration_s:
            return  # The timer re-arms for the maximum (see `deadline`).
        self._max_elapsed = True
        if self._prior is PriorPhase.DONE:
            self._close(now)
        else:
            self._phase = TxnPhase.STALLED
            self._stalled_at = now

    def on_prior_committed(self) -> None:
        """The prior transaction's store commit succeeded: its ACK intents may now land."""
        self._check(TxnEvent.PRIOR_COMMITTED)
        self._check_prior(TxnEvent.PRIOR_COMMITTED, PriorPhase.COMMITTING)
        self._prior = PriorPhase.ACKING

    def on_prior_acked(self, now: float) -> None:
        """Every ACK intent of the prior transaction was written: it is complete."""
        self._check(TxnEvent.PRIOR_ACKED)
        self._check_prior(TxnEvent.PRIOR_ACKED, PriorPhase.ACKING)
        self._prior = PriorPhase.DONE
        if self._phase is TxnPhase.STALLED:
            self._close(now)

    def on_read_empty(self, now: float, *, ack_pending: bool = False) -> None:
        """No message was ready after a `Poll`: close the transaction."""
        self._check(TxnEvent.READ_EMPTY)
        if self.blocks(ack_pending):
            raise TxnStateError(
                "read_empty: the transaction may not close yet "
                f"(min_elapsed={self._min_elapsed}, prior={self._prior.value}, "
                f"mid_sequence={self._mid_sequence}, ack_pending={ack_pending})"
            )
        self._close(now)

    def on_finalized(self) -> None:
        """The application's `finalize_txn` returned."""
        self._check(TxnEvent.FINALIZED)
        self._phase = TxnPhase.STARTING_COMMIT

    def on_commit_started(self, now: float) -> ClosedTxn:
        """The store's commit started (its future is the new prior). A new transaction begins,
        idle; this one is returned for the record."""
        self._check(TxnEvent.COMMIT_STARTED)
        # Closing required the prior to be complete; a second one in flight would break the
        # ordering ACKs rely on.
        if self._prior is not PriorPhase.DONE:
            raise AssertionError(f"transaction loop invariant: prior is {self._prior.value}")
        self._sequence += 1
        closed = ClosedTxn(
            sequence=self._sequence,
            consumed=self._consumed,
            began_at=self._began_at,
            stalled_at=self._closed_at if self._stalled_at is None else self._stalled_at,
            closed_at=self._closed_at,
            commit_started_at=now,
        )
        self._prior = PriorPhase.COMMITTING
        self._phase = TxnPhase.IDLE
        self._reset_txn()
        return closed

    def on_fail(self, error: BaseException) -> None:
        """Something failed (the application, the store, a read, the prior's commit or ACKs):
        the loop stops for good."""
        self._check(TxnEvent.FAIL)
        self._phase = TxnPhase.FAILED
        self._error = error

    # --- Internals -----------------------------------------------------------------------------

    def _close(self, now: float) -> None:
        self._phase = TxnPhase.FINALIZING
        self._closed_at = now

    def _check(self, event: TxnEvent) -> None:
        if self._phase not in TRANSITIONS[event]:
            allowed = ", ".join(sorted(p.value for p in TRANSITIONS[event]))
            raise TxnStateError(
                f"{event.value}: not accepted in phase {self._phase.value} (only in {allowed})"
            )

    def _check_prior(self, event: TxnEvent, expected: PriorPhase) -> None:
        if self._prior is not expected:
            raise TxnStateError(
                f"{event.value}: the prior transaction is {self._prior.value}, not {expected.value}"
            )
