"""ACKs older than their producer's last ACK are counted (``gazette_sequencer_older_acks_total``)
and logged as a warning, at most once per producer an interval: a producer that kept its
ProducerID while its clock went back has its transactions dropped (the rule keeps re-appended
copies from being delivered twice; classify.py), which must not go unseen. A re-appended copy
is counted alike: when the Sequencer drops the older ACK, the two look the same (it keeps a
producer's last ACK only, as Gazette's does), which the metric's name and the log line say."""

from __future__ import annotations

from typing import Any

import structlog

from broker.metrics import value_of
from gazette_consumer.sequencer import SeqEnvelope, Sequencer
from gazette_consumer.sequencer.older_acks import OLDER_ACK_LOG_INTERVAL_S, OncePer
from tests.gazette_consumer.sequencer.sequencer_testkit import (
    ACK,
    CONT,
    OUT,
    A,
    B,
    Gen,
    Q,
    drain,
    queue,
)

METRIC = "gazette_sequencer_older_acks_total"


def older_acks(journal: str) -> float:
    return value_of(METRIC, {"journal": journal})


def errors(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The older-ACK lines (warnings)."""
    return [e for e in logs if e["log_level"] == "warning" and "older" in e["event"]]


def on(journal: str, env: SeqEnvelope) -> SeqEnvelope:
    """`env` in `journal` (the counter is per process: each test counts in its own)."""
    return SeqEnvelope(journal, env.begin, env.end, env.producer, env.clock, env.flags, env.message)


def test_a_producer_whose_clock_went_back_is_counted_and_logged_once_an_interval() -> None:
    journal = "test/older-acks/regressed"
    seq, gen = Sequencer(8), Gen()
    a100, a101_ack = gen(A, 100, CONT), gen(A, 101, ACK)
    # A restarts with the same ProducerID and a clock that went back: two new transactions.
    a50, a51_ack, a60, a61_ack = (
        gen(A, 50, CONT),
        gen(A, 51, ACK),
        gen(A, 60, CONT),
        gen(A, 61, ACK),
    )
    b10_ack, b5_ack = gen(B, 10, ACK), gen(B, 5, ACK)
    first, dropped, other = [a100, a101_ack], [a50, a51_ack, a60, a61_ack], [b10_ack, b5_ack]
    first, dropped, other = ([on(journal, e) for e in envs] for envs in (first, dropped, other))

    before = older_acks(journal)
    assert queue(seq, *first)[-1] == Q.ACK_COMMIT_RING and drain(seq) == first
    with structlog.testing.capture_logs() as logs:
        assert queue(seq, *dropped) == [
            Q.CONTINUE_ALREADY_ACKED,
            Q.ACK_ROLLBACK,
            Q.CONTINUE_ALREADY_ACKED,
            Q.ACK_ROLLBACK,
        ]
        assert drain(seq) == []  # Dropped, as before: the behaviour is kept.
        assert queue(seq, other[0]) == [Q.ACK_EMPTY]
        assert drain(seq) == [other[0]]
        assert queue(seq, other[1]) == [Q.ACK_ROLLBACK]
    assert older_acks(journal) - before == 3  # Both of A's and B's.
    lines = errors(logs)
    assert [(e["journal"], e["producer"], e["clock"], e["last_ack"]) for e in lines] == [
        (journal, A.hex(), 51, 101),  # A's second is held back: one line an interval.
        (journal, B.hex(), 5, 10),
    ]
    assert lines[0]["held_back"] == 0 and "clock went back" in lines[0]["event"]


def test_a_reappended_copy_is_counted_alike_and_delivers_nothing_twice() -> None:
    """The case the rule exists for: an append holding two of A's transactions, appended again
    after its answer was lost. Its older ACK is dropped and counted like a regression: nothing
    the Sequencer keeps tells them apart at that point."""
    journal = "test/older-acks/copy"
    seq, gen = Sequencer(8), Gen()
    batch = [gen(A, 1, CONT), gen(A, 2, ACK), gen(A, 3, CONT), gen(A, 4, ACK)]
    batch = [on(journal, e) for e in batch]
    copy = [on(journal, gen(e.producer, e.clock, e.flags)) for e in batch]

    before = older_acks(journal)
    assert [e for env in batch if queue(seq, env)[0].commits for e in drain(seq)] == batch
    with structlog.testing.capture_logs() as logs:
        assert queue(seq, *copy) == [
            Q.CONTINUE_ALREADY_ACKED,
            Q.ACK_ROLLBACK,  # Older than the last ACK (4): counted.
            Q.CONTINUE_ALREADY_ACKED,
            Q.ACK_ROLLBACK,  # Equal to it: a re-sent ACK, not counted.
        ]
        assert drain(seq) == []
    assert older_acks(journal) - before == 1
    assert [(e["clock"], e["last_ack"]) for e in errors(logs)] == [(2, 4)]


def test_an_ack_older_than_a_presumed_bound_is_not_counted() -> None:
    """A reader starting inside A's transaction presumes the bound from the first clock it
    sees: an older ACK then closes the transaction it saw the tail of. No regression."""
    journal = "test/older-acks/presumed"
    seq, gen = Sequencer(8), Gen()
    envs = [on(journal, e) for e in (gen(A, 5, CONT), gen(A, 2, ACK), gen(A, 7, OUT))]
    before = older_acks(journal)
    with structlog.testing.capture_logs() as logs:
        assert queue(seq, *envs[:2]) == [Q.CONTINUE_BEGIN_SPAN, Q.ACK_ROLLBACK]
        assert queue(seq, envs[2]) == [Q.OUTSIDE_COMMIT] and drain(seq) == [envs[2]]
    assert older_acks(journal) == before and logs == []


def test_once_per_holds_lines_back_for_the_interval_and_counts_them() -> None:
    now = [0.0]
    limit = OncePer(OLDER_ACK_LOG_INTERVAL_S, keys_max=2, clock=lambda: now[0])
    assert limit.allow("a") == 0
    assert limit.allow("a") is None and limit.allow("a") is None
    assert limit.allow("b") == 0
    assert limit.allow("c") is None  # Two keys remembered, neither expired: held back.
    now[0] = OLDER_ACK_LOG_INTERVAL_S
    assert limit.allow("a") == 2  # An interval on: allowed, with the two held back.
    assert limit.allow("c") == 0  # "b" expired, making room.
