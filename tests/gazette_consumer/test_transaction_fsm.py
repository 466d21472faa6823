"""The transaction loop state machine: one test per phase and transition, and illegal events."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

from gazette_consumer.transaction import (
    TRANSITIONS,
    Await,
    ClosedTxn,
    Consume,
    Failed,
    Finalize,
    Poll,
    PriorPhase,
    StartCommit,
    TxnConfigError,
    TxnEvent,
    TxnLoop,
    TxnPhase,
    TxnStateError,
)

MIN_S, MAX_S = 1.0, 5.0
T0 = 100.0  # When the first message of a transaction arrives.


def snapshot(fsm: TxnLoop) -> tuple[Any, ...]:
    return (
        fsm.phase,
        fsm.prior,
        fsm.consumed,
        fsm.messages_total,
        fsm.commits_started,
        fsm.min_elapsed,
        fsm.max_elapsed,
        fsm.mid_sequence,
        fsm.deadline,
        fsm.error,
    )


def consuming(prior: PriorPhase = PriorPhase.DONE, *, min_elapsed: bool = False) -> TxnLoop:
    """A loop whose transaction consumed one message at T0, with the prior in `prior`."""
    fsm = TxnLoop(MIN_S, MAX_S)
    if prior is not PriorPhase.DONE:
        commit_one(fsm)
        if prior is PriorPhase.ACKING:
            fsm.on_prior_committed()
    fsm.on_message(T0)
    if min_elapsed:
        fsm.on_tick(T0 + MIN_S)
    return fsm


def commit_one(fsm: TxnLoop) -> ClosedTxn:
    """Run a whole transaction from IDLE (prior done) to its commit start."""
    fsm.on_message(0.0)
    fsm.on_tick(MIN_S)
    fsm.on_read_empty(MIN_S)
    fsm.on_finalized()
    return fsm.on_commit_started(MIN_S)


def in_phase(phase: TxnPhase) -> TxnLoop:
    fsm = TxnLoop(MIN_S, MAX_S)
    if phase is TxnPhase.IDLE:
        return fsm
    if phase is TxnPhase.STALLED:
        fsm = consuming(PriorPhase.COMMITTING)
        fsm.on_tick(T0 + MIN_S)
        fsm.on_tick(T0 + MAX_S)
        return fsm
    fsm.on_message(T0)
    if phase is TxnPhase.CONSUMING:
        return fsm
    fsm.on_tick(T0 + MIN_S)
    fsm.on_read_empty(T0 + MIN_S)
    if phase is TxnPhase.FINALIZING:
        return fsm
    fsm.on_finalized()
    if phase is TxnPhase.STARTING_COMMIT:
        return fsm
    assert phase is TxnPhase.FAILED
    fsm.on_fail(RuntimeError("boom"))
    return fsm


# --- Configuration ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("min_s", "max_s", "field"),
    [
        (-1.0, 1.0, "min_duration_s"),
        (math.nan, 1.0, "min_duration_s"),
        (0.0, 0.0, "max_duration_s"),
        (0.0, -2.0, "max_duration_s"),
        (0.0, math.inf, "max_duration_s"),
    ],
)
def test_durations_out_of_domain_are_refused(min_s: float, max_s: float, field: str) -> None:
    with pytest.raises(TxnConfigError, match=field):
        TxnLoop(min_s, max_s)


# --- IDLE ---------------------------------------------------------------------------------------


def test_idle_awaits_the_first_message_without_a_timer() -> None:
    fsm = TxnLoop(MIN_S, MAX_S)
    assert fsm.phase is TxnPhase.IDLE and fsm.prior is PriorPhase.DONE
    assert fsm.next_step() == Await(read=True, prior=False, deadline=None)


def test_idle_with_a_prior_committing_also_awaits_the_prior() -> None:
    fsm = TxnLoop(MIN_S, MAX_S)
    commit_one(fsm)
    assert fsm.phase is TxnPhase.IDLE and fsm.prior is PriorPhase.COMMITTING
    assert fsm.next_step() == Await(read=True, prior=True, deadline=None)


def test_first_message_begins_the_transaction_and_arms_the_min_timer() -> None:
    fsm = TxnLoop(MIN_S, MAX_S)
    assert fsm.on_message(T0) == Consume(begins_txn=True)
    assert fsm.phase is TxnPhase.CONSUMING
    assert fsm.consumed == 1
    assert fsm.deadline == T0 + MIN_S


# --- CONSUMING ----------------------------------------------------------------------------------


def test_later_messages_do_not_begin_again() -> None:
    fsm = consuming()
    assert fsm.on_message(T0 + 0.5) == Consume(begins_txn=False)
    assert (fsm.consumed, fsm.messages_total) == (2, 2)
    assert fsm.deadline == T0 + MIN_S  # Measured from the first message.


def test_before_min_duration_it_blocks_on_read_and_timer() -> None:
    fsm = consuming()
    assert fsm.next_step() == Await(read=True, prior=False, deadline=T0 + MIN_S)


def test_tick_before_the_deadline_is_illegal_and_changes_nothing() -> None:
    fsm = consuming()
    before = snapshot(fsm)
    with pytest.raises(TxnStateError, match="no timer is due"):
        fsm.on_tick(T0 + MIN_S - 0.001)
    assert snapshot(fsm) == before


def test_min_tick_rearms_for_the_max_and_allows_closing_when_idle() -> None:
    fsm = consuming()
    fsm.on_tick(T0 + MIN_S)
    assert fsm.min_elapsed and not fsm.max_elapsed
    assert fsm.phase is TxnPhase.CONSUMING
    assert fsm.deadline == T0 + MAX_S
    assert fsm.next_step() == Poll(deadline=T0 + MAX_S)


def test_read_empty_after_min_closes_the_transaction() -> None:
    fsm = consuming(min_elapsed=True)
    fsm.on_read_empty(T0 + 2)
    assert fsm.phase is TxnPhase.FINALIZING
    assert fsm.next_step() == Finalize()


def test_a_late_tick_past_both_durations_elapses_both() -> None:
    fsm = consuming()
    fsm.on_tick(T0 + MAX_S + 3)
    assert fsm.min_elapsed and fsm.max_elapsed
    assert fsm.phase is TxnPhase.FINALIZING


def test_min_duration_above_max_closes_at_the_min() -> None:
    fsm = TxnLoop(3.0, 1.0)
    fsm.on_message(T0)
    assert fsm.deadline == T0 + 3.0
    fsm.on_tick(T0 + 3.0)
    assert fsm.phase is TxnPhase.FINALIZING


def test_max_tick_with_prior_done_closes_without_polling() -> None:
    fsm = consuming(min_elapsed=True)
    fsm.on_tick(T0 + MAX_S)
    assert fsm.max_elapsed
    assert fsm.phase is TxnPhase.FINALIZING


@pytest.mark.parametrize(
    ("why", "build", "ack_pending"),
    [
        ("min duration", lambda: consuming(), False),
        ("prior committing", lambda: consuming(PriorPhase.COMMITTING, min_elapsed=True), False),
        ("prior acking", lambda: consuming(PriorPhase.ACKING, min_elapsed=True), False),
        ("upstream ack pending", lambda: consuming(min_elapsed=True), True),
    ],
)
def test_read_empty_while_blocked_is_illegal_and_changes_nothing(
    why: str, build: Callable[[], TxnLoop], ack_pending: bool
) -> None:
    fsm = build()
    assert isinstance(fsm.next_step(ack_pending), Await), why
    before = snapshot(fsm)
    with pytest.raises(TxnStateError, match="may not close yet"):
        fsm.on_read_empty(T0 + 2, ack_pending=ack_pending)
    assert snapshot(fsm) == before


# --- Pipelining: the prior transaction ----------------------------------------------------------


def test_next_transaction_consumes_while_the_prior_commits() -> None:
    fsm = TxnLoop(MIN_S, MAX_S)
    commit_one(fsm)
    assert fsm.on_message(T0) == Consume(begins_txn=True)
    fsm.on_tick(T0 + MIN_S)
    # Past its minimum, but the prior has not committed: it keeps waiting (and reading).
    assert fsm.next_step() == Await(read=True, prior=True, deadline=T0 + MAX_S)
    fsm.on_prior_committed()
    assert fsm.prior is PriorPhase.ACKING
    assert fsm.next_step() == Await(read=True, prior=True, deadline=T0 + MAX_S)
    fsm.on_prior_acked(T0 + 2)
    assert fsm.prior is PriorPhase.DONE
    assert fsm.next_step() == Poll(deadline=T0 + MAX_S)


def test_prior_events_out_of_order_are_illegal_and_change_nothing() -> None:
    fsm = TxnLoop(MIN_S, MAX_S)
    before = snapshot(fsm)
    with pytest.raises(TxnStateError, match="prior transaction is done, not committing"):
        fsm.on_prior_committed()
    with pytest.raises(TxnStateError, match="prior transaction is done, not acking"):
        fsm.on_prior_acked(1.0)
    assert snapshot(fsm) == before
    commit_one(fsm)
    before = snapshot(fsm)
    with pytest.raises(TxnStateError, match="committing, not acking"):
        fsm.on_prior_acked(2.0)
    assert snapshot(fsm) == before


def test_max_tick_with_the_prior_pending_stalls() -> None:
    fsm = consuming(PriorPhase.COMMITTING, min_elapsed=True)
    fsm.on_tick(T0 + MAX_S)
    assert fsm.phase is TxnPhase.STALLED
    assert fsm.next_step() == Await(read=False, prior=True, deadline=None)


def test_stalled_refuses_messages_and_closes_once_the_prior_is_acked() -> None:
    fsm = in_phase(TxnPhase.STALLED)
    before = snapshot(fsm)
    with pytest.raises(TxnStateError, match="message: not accepted in phase stalled"):
        fsm.on_message(T0 + 6)
    assert snapshot(fsm) == before
    fsm.on_prior_committed()
    assert fsm.phase is TxnPhase.STALLED
    fsm.on_prior_acked(T0 + 7)
    assert fsm.phase is TxnPhase.FINALIZING
    fsm.on_finalized()
    closed = fsm.on_commit_started(T0 + 8)
    assert (closed.stalled_at, closed.closed_at) == (T0 + MAX_S, T0 + 7)


# --- Upstream ACKs and sequences ----------------------------------------------------------------


def test_pending_upstream_ack_holds_the_transaction_until_max() -> None:
    fsm = consuming(min_elapsed=True)
    assert fsm.next_step(ack_pending=True) == Await(read=True, prior=False, deadline=T0 + MAX_S)
    fsm.on_tick(T0 + MAX_S)
    assert fsm.phase is TxnPhase.FINALIZING


def test_pending_upstream_ack_is_ignored_when_disabled() -> None:
    fsm = TxnLoop(MIN_S, MAX_S, wait_for_acks=False)
    fsm.on_message(T0)
    fsm.on_tick(T0 + MIN_S)
    assert fsm.next_step(ack_pending=True) == Poll(deadline=T0 + MAX_S)
    fsm.on_read_empty(T0 + 2, ack_pending=True)
    assert fsm.phase is TxnPhase.FINALIZING


def test_mid_sequence_disarms_the_timer_and_forbids_closing() -> None:
    fsm = consuming(min_elapsed=True)
    fsm.on_message(T0 + MAX_S + 1, more_in_sequence=True)
    assert fsm.mid_sequence and fsm.deadline is None
    assert fsm.next_step() == Await(read=True, prior=False, deadline=None)
    before = snapshot(fsm)
    with pytest.raises(TxnStateError, match="no timer is due"):
        fsm.on_tick(T0 + MAX_S + 2)
    with pytest.raises(TxnStateError, match="may not close yet"):
        fsm.on_read_empty(T0 + MAX_S + 2)
    assert snapshot(fsm) == before
    # The sequence's last message re-arms the (long past) maximum: the next tick closes.
    fsm.on_message(T0 + MAX_S + 3)
    assert fsm.deadline == T0 + MAX_S
    fsm.on_tick(T0 + MAX_S + 3)
    assert fsm.phase is TxnPhase.FINALIZING


# --- Runs of messages (on_message_run) ----------------------------------------------------------


def test_a_run_counts_like_that_many_messages() -> None:
    run, one_by_one = consuming(), consuming()
    run.on_message(T0 + 0.1)
    run.on_message_run(3)
    one_by_one.on_message(T0 + 0.1)
    for _ in range(3):
        one_by_one.on_message(T0 + 0.1)
    assert snapshot(run) == snapshot(one_by_one)
    assert (run.consumed, run.messages_total) == (5, 5)
    assert run.deadline == run.timer_at == T0 + MIN_S


def test_a_run_ending_mid_sequence_disarms_the_timer_but_not_timer_at() -> None:
    fsm = consuming(min_elapsed=True)
    fsm.on_message_run(2, more_in_sequence=True)
    assert fsm.mid_sequence and fsm.deadline is None
    # The shell's runs still know when the timer is due (they continue past it only while a
    # sequence holds it off).
    assert fsm.timer_at == T0 + MAX_S
    fsm.on_message_run(1)
    assert not fsm.mid_sequence and fsm.deadline == T0 + MAX_S


@pytest.mark.parametrize("phase", [p for p in TxnPhase if p is not TxnPhase.CONSUMING])
def test_timer_at_is_none_outside_consuming(phase: TxnPhase) -> None:
    assert in_phase(phase).timer_at is None


@pytest.mark.parametrize("count", [0, -1])
def test_an_empty_run_is_illegal_and_changes_nothing(count: int) -> None:
    fsm = consuming()
    before = snapshot(fsm)
    with pytest.raises(TxnStateError, match="count must be >= 1"):
        fsm.on_message_run(count)
    assert snapshot(fsm) == before


def test_a_run_never_begins_a_transaction() -> None:
    fsm = TxnLoop(MIN_S, MAX_S)
    with pytest.raises(TxnStateError, match="message_run: not accepted in phase idle"):
        fsm.on_message_run(1)
    assert fsm.phase is TxnPhase.IDLE and fsm.messages_total == 0


# --- FINALIZING and STARTING_COMMIT -------------------------------------------------------------


def test_finalized_then_commit_started_begins_an_idle_transaction() -> None:
    fsm = in_phase(TxnPhase.FINALIZING)
    fsm.on_finalized()
    assert fsm.phase is TxnPhase.STARTING_COMMIT
    assert fsm.next_step() == StartCommit()
    closed = fsm.on_commit_started(T0 + 3)
    assert closed == ClosedTxn(
        sequence=1,
        consumed=1,
        began_at=T0,
        stalled_at=T0 + MIN_S,
        closed_at=T0 + MIN_S,
        commit_started_at=T0 + 3,
    )
    assert fsm.phase is TxnPhase.IDLE
    assert fsm.prior is PriorPhase.COMMITTING
    assert (fsm.consumed, fsm.messages_total, fsm.commits_started) == (0, 1, 1)
    assert not fsm.min_elapsed and fsm.deadline is None


# --- FAILED -------------------------------------------------------------------------------------


@pytest.mark.parametrize("phase", [p for p in TxnPhase if p is not TxnPhase.FAILED])
def test_fail_from_every_live_phase(phase: TxnPhase) -> None:
    fsm = in_phase(phase)
    error = ValueError("bad input")
    fsm.on_fail(error)
    assert fsm.phase is TxnPhase.FAILED
    assert fsm.error is error
    assert fsm.next_step() == Failed(error)


# --- Illegal transitions, table-driven ----------------------------------------------------------

EVENTS: dict[TxnEvent, Callable[[TxnLoop], object]] = {
    TxnEvent.MESSAGE: lambda fsm: fsm.on_message(T0 + 50),
    TxnEvent.MESSAGE_RUN: lambda fsm: fsm.on_message_run(1),
    TxnEvent.TICK: lambda fsm: fsm.on_tick(T0 + 50),
    TxnEvent.PRIOR_COMMITTED: lambda fsm: fsm.on_prior_committed(),
    TxnEvent.PRIOR_ACKED: lambda fsm: fsm.on_prior_acked(T0 + 50),
    TxnEvent.READ_EMPTY: lambda fsm: fsm.on_read_empty(T0 + 50),
    TxnEvent.FINALIZED: lambda fsm: fsm.on_finalized(),
    TxnEvent.COMMIT_STARTED: lambda fsm: fsm.on_commit_started(T0 + 50),
    TxnEvent.FAIL: lambda fsm: fsm.on_fail(RuntimeError("again")),
}


@pytest.mark.parametrize(
    ("phase", "event"),
    [(p, e) for e in TxnEvent for p in TxnPhase if p not in TRANSITIONS[e]],
    ids=lambda value: value.value,
)
def test_event_outside_its_phases_raises_and_changes_nothing(
    phase: TxnPhase, event: TxnEvent
) -> None:
    fsm = in_phase(phase)
    before = snapshot(fsm)
    with pytest.raises(TxnStateError, match=f"{event.value}: not accepted in phase {phase.value}"):
        EVENTS[event](fsm)
    assert snapshot(fsm) == before


def test_every_event_has_a_handler_and_a_table_entry() -> None:
    assert set(EVENTS) == set(TxnEvent) == set(TRANSITIONS)
