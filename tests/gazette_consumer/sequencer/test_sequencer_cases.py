"""Sequencing cases beyond the single outcomes: partial ACKs, replays with duplicates, ring
eviction, mixed flags and zero clocks."""

from __future__ import annotations

import structlog

from gazette_consumer.sequencer import (
    JournalProducer,
    ProducerState,
    ReplayRequired,
    Sequencer,
)
from tests.gazette_consumer.sequencer.sequencer_testkit import (
    ACK,
    CONT,
    OUT,
    ZERO,
    A,
    B,
    Gen,
    J,
    Q,
    drain,
    queue,
)


def test_ack_commits_only_clocks_up_to_its_own() -> None:
    seq, gen = Sequencer(8), Gen()
    a5, a7, a6_ack = gen(A, 5, CONT), gen(A, 7, CONT), gen(A, 6, ACK)
    a8_ack = gen(A, 8, ACK)

    assert queue(seq, a5, a7, a6_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_RING,
    ]
    # a7 is larger than the ACK: it rolls back, and a later ACK does not revive it.
    assert drain(seq) == [a5, a6_ack]
    assert queue(seq, a8_ack) == [Q.ACK_EMPTY]
    assert drain(seq) == [a8_ack]


def test_ack_older_than_last_ack_keeps_the_bound() -> None:
    """An ACK older than the last one never lowers the bound (Gazette's sequencer does, and so
    delivers a re-appended batch's later transactions twice: see test_sequencer_duplicated_span):
    a message at or below the bound stays a duplicate."""
    seq, gen = Sequencer(8), Gen()
    a5_ack, a3_ack, a4, a6 = gen(A, 5, ACK), gen(A, 3, ACK), gen(A, 4, OUT), gen(A, 6, OUT)

    assert queue(seq, a5_ack) == [Q.ACK_EMPTY]
    assert drain(seq) == [a5_ack]
    assert queue(seq, a3_ack) == [Q.ACK_ROLLBACK]
    assert seq.checkpoint().producers[JournalProducer(J, A)] == ProducerState(5, -1)
    assert queue(seq, a4) == [Q.OUTSIDE_ALREADY_ACKED]
    assert queue(seq, a6) == [Q.OUTSIDE_COMMIT]
    assert drain(seq) == [a6]


def test_ack_older_than_last_ack_drops_the_pending_span() -> None:
    """What the older ACK says of the span pending after the bound: rolled back."""
    seq, gen = Sequencer(8), Gen()
    a5_ack, a6, a3_ack, a7_ack = gen(A, 5, ACK), gen(A, 6, CONT), gen(A, 3, ACK), gen(A, 7, ACK)

    assert queue(seq, a5_ack) == [Q.ACK_EMPTY]
    assert drain(seq) == [a5_ack]
    assert queue(seq, a6, a3_ack) == [Q.CONTINUE_BEGIN_SPAN, Q.ACK_ROLLBACK]
    assert seq.checkpoint().producers[JournalProducer(J, A)] == ProducerState(5, -1)
    assert queue(seq, a7_ack) == [Q.ACK_EMPTY]
    assert drain(seq) == [a7_ack]


def test_outside_after_pending_span_discards_it() -> None:
    seq, gen = Sequencer(8), Gen()
    a1, a2, a3, a4_ack = gen(A, 1, CONT), gen(A, 2, CONT), gen(A, 3, OUT), gen(A, 4, ACK)

    assert queue(seq, a1, a2, a3) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.OUTSIDE_COMMIT,
    ]
    assert drain(seq) == [a3]
    assert queue(seq, a4_ack) == [Q.ACK_EMPTY]
    assert drain(seq) == [a4_ack]


def test_unknown_flags_are_treated_as_outside() -> None:
    seq, gen = Sequencer(8), Gen()
    a1, a2_odd, a2_odd_dup = gen(A, 1, CONT), gen(A, 2, 0x100), gen(A, 2, 0x100)

    assert queue(seq, a1, a2_odd) == [Q.CONTINUE_BEGIN_SPAN, Q.OUTSIDE_COMMIT]
    assert drain(seq) == [a2_odd]
    assert queue(seq, a2_odd_dup) == [Q.OUTSIDE_ALREADY_ACKED]
    assert drain(seq) == []


def test_zero_clock_messages_are_always_delivered_and_carry_no_state() -> None:
    seq, gen = Sequencer(2), Gen()
    a1, z1, z2, a2_ack = gen(A, 1, CONT), gen(ZERO, 0, OUT), gen(A, 0, ACK), gen(A, 2, ACK)

    assert queue(seq, a1, z1) == [Q.CONTINUE_BEGIN_SPAN, Q.OUTSIDE_COMMIT]
    assert drain(seq) == [z1]
    # A zero clock commits regardless of flags or of the producer's pending span.
    assert queue(seq, z2) == [Q.OUTSIDE_COMMIT]
    assert drain(seq) == [z2]
    cp = seq.checkpoint()
    assert cp.producers == {JournalProducer(J, A): ProducerState(0, a1.begin)}
    assert cp.read_through == {J: z2.end}

    # a1 was evicted by the zero-clock entries; the replay skips them.
    assert queue(seq, a2_ack) == [Q.ACK_COMMIT_REPLAY]
    assert gen.replay(seq) == ReplayRequired(J, a1.begin, a2_ack.begin)
    assert drain(seq) == [a1, a2_ack]


def test_replay_skips_other_producers_duplicates_and_larger_clocks() -> None:
    seq, gen = Sequencer(3), Gen()
    b1 = gen(B, 1, CONT)
    a4, b1_dup, a4_dup, a5, a6 = (
        gen(A, 4, CONT),
        gen(B, 1, CONT),
        gen(A, 4, CONT),
        gen(A, 5, CONT),
        gen(A, 6, CONT),
    )
    a9 = gen(A, 9, CONT)
    a10, a11, a12 = gen(A, 10, CONT), gen(A, 11, CONT), gen(A, 12, CONT)
    a8_ack = gen(A, 8, ACK)

    assert queue(seq, b1, a4, b1_dup, a4_dup, a5, a6, a9, a10, a11, a12, a8_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_REPLAY,
    ]
    # a11 evicted a4, A's first entry: the span lost its start, its entries were freed and
    # no more were linked. The ring holds only the ACK: everything from a4 up to it is replayed.
    assert [e for e in seq._ring.entries if e is not None] == [a8_ack]
    assert gen.replay(seq) == ReplayRequired(J, a4.begin, a8_ack.begin)
    # Clocks 9 and up are larger than the ACK's.
    assert drain(seq) == [a4, a5, a6, a8_ack]


def test_interleaved_acks_each_replay_their_own_span() -> None:
    seq, gen = Sequencer(2), Gen()
    b11, a7, a8, b12 = gen(B, 11, CONT), gen(A, 7, CONT), gen(A, 8, CONT), gen(B, 12, CONT)
    a9_ack, b13_ack = gen(A, 9, ACK), gen(B, 13, ACK)

    assert queue(seq, b11, a7, a8, b12, a9_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_REPLAY,
    ]
    assert gen.replay(seq) == ReplayRequired(J, a7.begin, a9_ack.begin)
    assert drain(seq) == [a7, a8, a9_ack]
    assert seq.has_pending({})

    assert queue(seq, b13_ack) == [Q.ACK_COMMIT_REPLAY]
    assert gen.replay(seq) == ReplayRequired(J, b11.begin, b13_ack.begin)
    assert drain(seq) == [b11, b12, b13_ack]
    assert not seq.has_pending({})


def test_ring_of_one_replays_everything_but_the_ack() -> None:
    seq, gen = Sequencer(1), Gen()
    a1, a2, b1 = gen(A, 1, CONT), gen(A, 2, CONT), gen(B, 1, CONT)
    a1_dup, a2_dup, a3_ack = gen(A, 1, CONT), gen(A, 2, CONT), gen(A, 3, ACK)
    b2, b3_ack = gen(B, 2, CONT), gen(B, 3, ACK)

    assert queue(seq, a1, a2, b1, a1_dup, a2_dup, a3_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.ACK_COMMIT_REPLAY,
    ]
    assert gen.replay(seq) == ReplayRequired(J, a1.begin, a3_ack.begin)
    assert drain(seq) == [a1, a2, a3_ack]

    assert queue(seq, b2, b3_ack) == [Q.CONTINUE_EXTEND_SPAN, Q.ACK_COMMIT_REPLAY]
    assert gen.replay(seq) == ReplayRequired(J, b1.begin, b3_ack.begin)
    assert drain(seq) == [b1, b2, b3_ack]


def test_clocks_at_or_below_the_bound_are_not_reused_after_an_older_ack() -> None:
    """Gazette lets a producer reset to an older ACK reuse the clocks after it; here they stay
    duplicates (no producer of this project or Gazette's reuses clocks under one ProducerID: a
    restarted publisher has a new one)."""
    seq, gen = Sequencer(8), Gen()
    b11, b12_ack = gen(B, 11, CONT), gen(B, 12, ACK)
    b8_reset, b9, b10_ack = gen(B, 8, ACK), gen(B, 9, CONT), gen(B, 10, ACK)

    assert queue(seq, b11, b12_ack) == [Q.CONTINUE_BEGIN_SPAN, Q.ACK_COMMIT_RING]
    assert drain(seq) == [b11, b12_ack]
    assert queue(seq, b8_reset, b9, b10_ack) == [
        Q.ACK_ROLLBACK,
        Q.CONTINUE_ALREADY_ACKED,
        Q.ACK_ROLLBACK,
    ]
    assert drain(seq) == []


def test_ack_older_than_a_presumed_bound_is_a_quiet_rollback() -> None:
    """A reader that starts inside a producer's transaction presumes everything before the
    first clock it sees was acknowledged. An ACK older than that presumption is the rollback
    of the transaction it saw the tail of, not a regression of the producer: the span is
    dropped, without the error a real regression is logged with."""
    seq, gen = Sequencer(8), Gen()
    a5, a6, a2_ack, a7 = gen(A, 5, CONT), gen(A, 6, CONT), gen(A, 2, ACK), gen(A, 7, OUT)

    with structlog.testing.capture_logs() as logs:
        assert queue(seq, a5, a6, a2_ack) == [
            Q.CONTINUE_BEGIN_SPAN,
            Q.CONTINUE_EXTEND_SPAN,
            Q.ACK_ROLLBACK,
        ]
        assert drain(seq) == []
        assert queue(seq, a7) == [Q.OUTSIDE_COMMIT]
        assert drain(seq) == [a7]
    assert logs == []

    # Once an ACK was read, the bound is known: an older ACK is a copy (or a producer that went
    # back), said so in the log, and the bound is kept.
    a1_ack = gen(A, 1, ACK)
    with structlog.testing.capture_logs() as logs:
        assert queue(seq, a1_ack) == [Q.ACK_ROLLBACK]
    assert [entry["log_level"] for entry in logs] == ["warning"]
