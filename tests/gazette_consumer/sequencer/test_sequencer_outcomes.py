"""One test per queue outcome: the exact outcome and the exact dequeued sequence."""

from __future__ import annotations

from gazette_consumer.sequencer import (
    JournalProducer,
    ProducerState,
    QueueOutcome,
    ReplayRequired,
    Sequencer,
)
from tests.gazette_consumer.sequencer.sequencer_testkit import (
    ACK,
    CONT,
    OUT,
    A,
    B,
    Gen,
    J,
    drain,
    queue,
)


def state(seq: Sequencer, producer: bytes) -> ProducerState:
    return seq.checkpoint().producers[JournalProducer(J, producer)]


def test_outside_commit() -> None:
    seq, gen = Sequencer(4), Gen(named=True)
    a1, a2 = gen(A, 1, OUT), gen(A, 2, OUT)

    assert queue(seq, a1) == [QueueOutcome.OUTSIDE_COMMIT]
    assert seq.replay_required is None
    assert drain(seq) == [a1]
    assert queue(seq, a2) == [QueueOutcome.OUTSIDE_COMMIT]
    assert drain(seq) == [a2]
    assert seq.checkpoint().read_through == {J: a2.end}
    assert state(seq, A) == ProducerState(last_ack=2, begin=-1)


def test_outside_already_acked() -> None:
    seq, gen = Sequencer(4), Gen(named=True)
    a1, a2 = gen(A, 1, OUT), gen(A, 2, OUT)
    a1_dup, a2_dup = gen(A, 1, OUT), gen(A, 2, OUT)
    assert queue(seq, a1) == [QueueOutcome.OUTSIDE_COMMIT]
    assert drain(seq) == [a1]
    assert queue(seq, a2) == [QueueOutcome.OUTSIDE_COMMIT]
    assert drain(seq) == [a2]

    assert queue(seq, a1_dup, a2_dup) == [QueueOutcome.OUTSIDE_ALREADY_ACKED] * 2
    assert drain(seq) == []
    # Ignored messages are decided, so reading resumes after them.
    assert seq.checkpoint().read_through == {J: a2_dup.end}


def test_continue_already_acked() -> None:
    seq, gen = Sequencer(4), Gen(named=True)
    a1, a2_ack = gen(A, 1, CONT), gen(A, 2, ACK)
    a1_dup = gen(A, 1, CONT)
    assert queue(seq, a1, a2_ack) == [
        QueueOutcome.CONTINUE_BEGIN_SPAN,
        QueueOutcome.ACK_COMMIT_RING,
    ]
    assert drain(seq) == [a1, a2_ack]

    assert queue(seq, a1_dup) == [QueueOutcome.CONTINUE_ALREADY_ACKED]
    assert drain(seq) == []
    assert state(seq, A) == ProducerState(last_ack=2, begin=-1)
    assert seq.checkpoint().read_through == {J: a1_dup.end}


def test_continue_begin_span() -> None:
    seq, gen = Sequencer(4), Gen(named=True)
    a5 = gen(A, 5, CONT)

    assert queue(seq, a5) == [QueueOutcome.CONTINUE_BEGIN_SPAN]
    assert drain(seq) == []
    # A first-seen producer is presumed to have been acknowledged just before its first clock.
    assert state(seq, A) == ProducerState(last_ack=4, begin=a5.begin)
    assert seq.checkpoint().read_through == {J: a5.end}
    assert seq.has_pending({})
    assert not seq.has_pending({J: a5.end})


def test_continue_extend_span() -> None:
    seq, gen = Sequencer(4), Gen(named=True)
    a1, a2, a3_ack = gen(A, 1, CONT), gen(A, 2, CONT), gen(A, 3, ACK)

    assert queue(seq, a1, a2) == [
        QueueOutcome.CONTINUE_BEGIN_SPAN,
        QueueOutcome.CONTINUE_EXTEND_SPAN,
    ]
    assert drain(seq) == []
    # The span still begins at a1: that is where a replay would have to start.
    assert state(seq, A) == ProducerState(last_ack=0, begin=a1.begin)
    assert queue(seq, a3_ack) == [QueueOutcome.ACK_COMMIT_RING]
    assert drain(seq) == [a1, a2, a3_ack]


def test_continue_txn_clock_larger() -> None:
    seq, gen = Sequencer(8), Gen(named=True)
    a1, a2 = gen(A, 1, CONT), gen(A, 2, CONT)
    a1_dup, a2_dup = gen(A, 1, CONT), gen(A, 2, CONT)  # A retried append of a1, a2.
    a3_ack = gen(A, 3, ACK)

    assert queue(seq, a1, a2, a1_dup, a2_dup, a3_ack) == [
        QueueOutcome.CONTINUE_BEGIN_SPAN,
        QueueOutcome.CONTINUE_EXTEND_SPAN,
        QueueOutcome.CONTINUE_TXN_CLOCK_LARGER,
        QueueOutcome.CONTINUE_TXN_CLOCK_LARGER,
        QueueOutcome.ACK_COMMIT_RING,
    ]
    assert drain(seq) == [a1, a2, a3_ack]


def test_ack_empty() -> None:
    seq, gen = Sequencer(4), Gen(named=True)
    a1_ack = gen(A, 1, ACK)

    assert queue(seq, a1_ack) == [QueueOutcome.ACK_EMPTY]
    dequeued = drain(seq)
    assert dequeued == [a1_ack]
    assert dequeued[0].is_ack
    assert state(seq, A) == ProducerState(last_ack=1, begin=-1)
    assert seq.checkpoint().read_through == {J: a1_ack.end}


def test_ack_commit_ring_without_head_of_line_blocking() -> None:
    seq, gen = Sequencer(8), Gen(named=True)
    a1, b1, a2, a3_ack = gen(A, 1, CONT), gen(B, 1, CONT), gen(A, 2, CONT), gen(A, 3, ACK)
    b2_ack = gen(B, 2, ACK)

    assert queue(seq, a1, b1, a2, a3_ack) == [
        QueueOutcome.CONTINUE_BEGIN_SPAN,
        QueueOutcome.CONTINUE_BEGIN_SPAN,
        QueueOutcome.CONTINUE_EXTEND_SPAN,
        QueueOutcome.ACK_COMMIT_RING,
    ]
    assert seq.replay_required is None
    # B's span, pending in between, does not hold up A's commit.
    assert drain(seq) == [a1, a2, a3_ack]
    assert state(seq, B) == ProducerState(last_ack=0, begin=b1.begin)
    # Reading moves past B's pending span: after a restart, its kept begin offset is where a
    # replay would start instead.
    assert seq.checkpoint().read_through == {J: a3_ack.end}

    assert queue(seq, b2_ack) == [QueueOutcome.ACK_COMMIT_RING]
    assert drain(seq) == [b1, b2_ack]


def test_ack_commit_replay() -> None:
    seq, gen = Sequencer(2), Gen(named=True)
    a1, b1, a2, a3_ack = gen(A, 1, CONT), gen(B, 1, CONT), gen(A, 2, CONT), gen(A, 3, ACK)

    assert queue(seq, a1, b1, a2, a3_ack) == [
        QueueOutcome.CONTINUE_BEGIN_SPAN,
        QueueOutcome.CONTINUE_BEGIN_SPAN,
        QueueOutcome.CONTINUE_EXTEND_SPAN,
        QueueOutcome.ACK_COMMIT_REPLAY,
    ]
    # a2 evicted a1 from the two-entry ring: A's span lost its start, and a2 was not linked;
    # only the ACK is in the ring, and everything before it is replayed.
    assert seq.replay_required == ReplayRequired(J, a1.begin, a3_ack.begin)
    seq.replay([a1, b1, a2])
    assert seq.replay_required is None
    assert drain(seq) == [a1, a2, a3_ack]
    assert seq.checkpoint().read_through == {J: a3_ack.end}


def test_ack_rollback() -> None:
    seq, gen = Sequencer(8), Gen(named=True)
    a1, a2_ack = gen(A, 1, CONT), gen(A, 2, ACK)
    a3, a4 = gen(A, 3, CONT), gen(A, 4, CONT)
    a2_resent = gen(A, 2, ACK)  # The producer restarted and re-sent its last ACK.
    a5, a6_ack = gen(A, 5, CONT), gen(A, 6, ACK)

    assert queue(seq, a1, a2_ack) == [
        QueueOutcome.CONTINUE_BEGIN_SPAN,
        QueueOutcome.ACK_COMMIT_RING,
    ]
    assert drain(seq) == [a1, a2_ack]
    assert queue(seq, a3, a4, a2_resent) == [
        QueueOutcome.CONTINUE_BEGIN_SPAN,
        QueueOutcome.CONTINUE_EXTEND_SPAN,
        QueueOutcome.ACK_ROLLBACK,
    ]
    assert drain(seq) == []
    assert state(seq, A) == ProducerState(last_ack=2, begin=-1)

    assert queue(seq, a5, a6_ack) == [
        QueueOutcome.CONTINUE_BEGIN_SPAN,
        QueueOutcome.ACK_COMMIT_RING,
    ]
    assert drain(seq) == [a5, a6_ack]  # a3 and a4 never are.
