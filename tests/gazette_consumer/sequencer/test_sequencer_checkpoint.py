"""Checkpoints: round trips, restarts mid-dequeue and before a replay, and pruning."""

from __future__ import annotations

import time

import pytest

from gazette_consumer.message.clock import clock_from_unix_nanos, clock_span
from gazette_consumer.sequencer import (
    JournalProducer,
    ProducerState,
    ReplayRequired,
    SeqEnvelope,
    Sequencer,
    SequencerCheckpoint,
)
from tests.gazette_consumer.sequencer.sequencer_testkit import (
    ACK,
    CONT,
    OUT,
    A,
    B,
    C,
    Gen,
    J,
    Q,
    drain,
    jp,
    queue,
)


def restart(seq: Sequencer, ring_size: int = 12) -> Sequencer:
    """A new Sequencer from `seq`'s checkpoint, twice over: a round trip must be stable."""
    cp = seq.checkpoint()
    again = Sequencer(ring_size, cp).checkpoint()
    assert again == cp
    return Sequencer(ring_size, again)


def test_round_trip_then_identical_outputs() -> None:
    seq1, gen = Sequencer(12), Gen()
    a1, a2, b1, b2 = gen(A, 1, CONT), gen(A, 2, CONT), gen(B, 1, CONT), gen(B, 2, CONT)
    c1_ack, z1 = gen(C, 1, ACK), gen(bytes(6), 0, OUT)
    b3_ack, c2, c1_resent, a3_ack = gen(B, 3, ACK), gen(C, 2, CONT), gen(C, 1, ACK), gen(A, 3, ACK)

    assert queue(seq1, a1, a2, b1, b2, c1_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_EMPTY,
    ]
    assert drain(seq1) == [c1_ack]
    assert queue(seq1, z1) == [Q.OUTSIDE_COMMIT]
    assert drain(seq1) == [z1]

    cp = seq1.checkpoint()
    assert cp.read_through == {J: z1.end}
    assert cp.producers == {
        jp(A): ProducerState(0, a1.begin),
        jp(B): ProducerState(0, b1.begin),
        jp(C): ProducerState(1, -1),
    }
    seq2 = restart(seq1)

    # Same outputs from here, though seq2 must replay what seq1 still holds in its ring.
    assert queue(seq1, b3_ack) == [Q.ACK_COMMIT_RING]
    assert queue(seq2, b3_ack) == [Q.ACK_COMMIT_REPLAY]
    assert gen.replay(seq2) == ReplayRequired(J, b1.begin, b3_ack.begin)
    assert drain(seq1) == drain(seq2) == [b1, b2, b3_ack]

    for seq in (seq1, seq2):
        assert queue(seq, c2, c1_resent) == [Q.CONTINUE_BEGIN_SPAN, Q.ACK_ROLLBACK]
        assert drain(seq) == []

    assert queue(seq1, a3_ack) == [Q.ACK_COMMIT_RING]
    assert queue(seq2, a3_ack) == [Q.ACK_COMMIT_REPLAY]
    assert gen.replay(seq2) == ReplayRequired(J, a1.begin, a3_ack.begin)
    assert drain(seq1) == drain(seq2) == [a1, a2, a3_ack]
    assert seq1.checkpoint() == seq2.checkpoint()


def test_checkpoint_mid_dequeue_resumes_after_the_consumed_envelope() -> None:
    seq1, gen = Sequencer(12), Gen()
    a1, a2, a3_ack = gen(A, 1, CONT), gen(A, 2, CONT), gen(A, 3, ACK)

    assert queue(seq1, a1, a2, a3_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_RING,
    ]
    assert seq1.step() and seq1.dequeued == a1
    # a1 is consumed; the ACK is not yet past, so a restart reads it again.
    cp = seq1.checkpoint()
    assert cp == SequencerCheckpoint({J: a2.end}, {jp(A): ProducerState(1, a1.end)})
    seq2 = restart(seq1)

    assert queue(seq2, a3_ack) == [Q.ACK_COMMIT_REPLAY]
    assert gen.replay(seq2) == ReplayRequired(J, a1.end, a3_ack.begin)
    assert drain(seq2) == [a2, a3_ack]
    assert drain(seq1) == [a2, a3_ack]
    assert seq1.checkpoint() == seq2.checkpoint()


def test_checkpoint_after_the_committing_envelope_is_past_it() -> None:
    seq, gen = Sequencer(12), Gen()
    a1, a2_ack = gen(A, 1, CONT), gen(A, 2, ACK)

    queue(seq, a1, a2_ack)
    assert seq.step() and seq.step() and seq.dequeued == a2_ack
    # Before the final step() returns False, the ACK already counts as consumed.
    assert seq.checkpoint() == SequencerCheckpoint({J: a2_ack.end}, {jp(A): ProducerState(2)})
    assert not seq.step()


def test_checkpoint_before_replay_restarts_the_whole_commit() -> None:
    seq1, gen = Sequencer(1), Gen()
    a1, a2, a3_ack = gen(A, 1, CONT), gen(A, 2, CONT), gen(A, 3, ACK)

    assert queue(seq1, a1, a2, a3_ack)[-1] is Q.ACK_COMMIT_REPLAY
    seq2 = restart(seq1, ring_size=1)
    assert seq2.checkpoint() == SequencerCheckpoint(
        {J: a2.end}, {jp(A): ProducerState(0, a1.begin)}
    )

    assert queue(seq2, a3_ack) == [Q.ACK_COMMIT_REPLAY]
    for seq in (seq1, seq2):
        assert gen.replay(seq) == ReplayRequired(J, a1.begin, a3_ack.begin)
        assert drain(seq) == [a1, a2, a3_ack]


def test_restart_with_span_reappended_after_the_checkpoint() -> None:
    seq1, gen = Sequencer(12), Gen()
    a1, a2 = gen(A, 1, CONT), gen(A, 2, CONT)
    a1_dup, a2_dup, a3_ack = gen(A, 1, CONT), gen(A, 2, CONT), gen(A, 3, ACK)

    queue(seq1, a1, a2)
    seq2 = restart(seq1)

    # seq2 no longer knows the span's largest clock, so it takes the duplicates as extending
    # the span; but the span lost its start (it holds nothing of it in the ring), so it links
    # none of them: the ACK replays everything since a1, dropping the duplicates by clock.
    assert queue(seq1, a1_dup, a2_dup, a3_ack) == [
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.ACK_COMMIT_RING,
    ]
    assert queue(seq2, a1_dup, a2_dup, a3_ack) == [
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_REPLAY,
    ]
    assert gen.replay(seq2) == ReplayRequired(J, a1.begin, a3_ack.begin)
    assert drain(seq1) == drain(seq2) == [a1, a2, a3_ack]


def test_pruning_drops_only_old_producers_without_pending_spans() -> None:
    seq, gen = Sequencer(12), Gen()
    a_cont, b_cont, b_ack = gen(A, 10 << 4, CONT), gen(B, 19 << 4, CONT), gen(B, 20 << 4, ACK)
    c_cont, b_ack_dup = gen(C, 30 << 4, CONT), gen(B, 20 << 4, ACK)

    queue(seq, a_cont, b_cont, b_ack)
    assert drain(seq) == [b_cont, b_ack]
    queue(seq, c_cont)

    everyone = {
        jp(A): ProducerState((10 << 4) - 1, a_cont.begin),
        jp(B): ProducerState(20 << 4),
        jp(C): ProducerState((30 << 4) - 1, c_cont.begin),
    }
    assert seq.checkpoint(0).producers == everyone
    # The horizon is a span back from the journal's newest state (C's), as Gazette's: B's
    # last ACK is exactly that old, and not pruned.
    newest = (30 << 4) - 1
    assert seq.checkpoint(newest - (20 << 4)).producers == everyone
    # A is older still, but its pending span must survive to be replayed.
    pruned = seq.checkpoint(newest - (20 << 4) - 1).producers
    assert pruned == {jp(A): everyone[jp(A)], jp(C): everyone[jp(C)]}
    assert seq.checkpoint(0).producers == pruned

    # The price of pruning: a late duplicate of a pruned producer is delivered again.
    assert queue(seq, b_ack_dup) == [Q.ACK_EMPTY]
    assert drain(seq) == [b_ack_dup]


def test_checkpoint_is_a_snapshot() -> None:
    seq, gen = Sequencer(4), Gen()
    a1, a2_ack = gen(A, 1, CONT), gen(A, 2, ACK)
    queue(seq, a1)
    cp = seq.checkpoint()
    queue(seq, a2_ack)
    drain(seq)

    assert cp == SequencerCheckpoint({J: a1.end}, {jp(A): ProducerState(0, a1.begin)})
    with pytest.raises(TypeError):
        cp.read_through[J] = 0  # type: ignore[index]


def test_has_pending_since_offsets() -> None:
    seq, gen = Sequencer(4), Gen()
    a1, b1, a2_ack = gen(A, 1, CONT), gen(B, 1, CONT), gen(A, 2, ACK)
    queue(seq, a1, b1)

    assert seq.has_pending({J: b1.begin})
    assert not seq.has_pending({J: b1.end})
    queue(seq, a2_ack)
    drain(seq)
    assert seq.has_pending({J: a1.begin})
    assert not seq.has_pending({J: b1.begin + 1})


def test_checkpoint_before_a_lone_commit_is_dequeued() -> None:
    seq1, gen = Sequencer(4), Gen()
    a1, b1_ack = gen(A, 1, OUT), gen(B, 1, ACK)

    for env, outcome in ((a1, Q.OUTSIDE_COMMIT), (b1_ack, Q.ACK_EMPTY)):
        assert queue(seq1, env) == [outcome]
        seq2 = restart(seq1)
        # The restored Sequencer reads the message again and delivers it alone, like seq1.
        assert queue(seq2, env)[0].commits
        assert drain(seq1) == drain(seq2) == [env]
        assert seq1.checkpoint() == seq2.checkpoint()


def test_the_horizon_spans_back_from_each_journals_newest_clock() -> None:
    """As Gazette's Sequencer.Checkpoint: a producer is pruned by how far its last ACK lags the
    newest state of its own journal, not the wall clock, so a reader catching up on history
    older than the horizon forgets no producer that is still writing (found by review: the
    horizon was once measured from the wall clock, and a backfill delivered re-appended
    duplicates twice); and one journal's clocks never prune another's producers."""
    day = clock_span(86_400)
    three_days_ago = clock_from_unix_nanos(time.time_ns() - 3 * 86_400 * 10**9)
    seq: Sequencer = Sequencer(12)
    old, other = "test/backfill", "test/recent"
    a1 = SeqEnvelope(old, 0, 10, A, three_days_ago, OUT, "a1")
    b1 = SeqEnvelope(old, 10, 20, B, three_days_ago + day // 2, OUT, "b1")
    c1 = SeqEnvelope(other, 0, 10, C, three_days_ago + 2 * day, OUT, "c1")
    for env in (a1, b1, c1):
        assert queue(seq, env) == [Q.OUTSIDE_COMMIT] and drain(seq) == [env]

    assert len(seq.checkpoint(day).producers) == 3  # All within a day of their journal's newest.
    b2 = SeqEnvelope(old, 20, 30, B, three_days_ago + day + 1, OUT, "b2")
    assert queue(seq, b2) == [Q.OUTSIDE_COMMIT] and drain(seq) == [b2]
    kept = seq.checkpoint(day).producers  # A now lags B by more than a day: pruned.
    assert set(kept) == {JournalProducer(old, B), JournalProducer(other, C)}
    # A re-appended duplicate of it is delivered again: the price of the horizon, as in
    # Gazette. One of B's is not.
    a1_again = SeqEnvelope(old, 30, 40, A, three_days_ago, OUT, "a1")
    assert queue(seq, a1_again) == [Q.OUTSIDE_COMMIT] and drain(seq) == [a1_again]
    b1_again = SeqEnvelope(old, 40, 50, B, three_days_ago + day // 2, OUT, "b1")
    assert queue(seq, b1_again) == [Q.OUTSIDE_ALREADY_ACKED] and drain(seq) == []


def test_clock_span_is_gazettes() -> None:
    # Gazette: Clock((d / 100) << 4) for a duration d in nanoseconds.
    assert clock_span(1) == (10**9 // 100) << 4
    assert clock_span(86_400) == ((86_400 * 10**9) // 100) << 4
    assert clock_span(0) == 0
