"""`Sequencer.commit_columns` (column_runs.py), the entry point of a reader that decides a
producer's certain messages by columns: it leaves the producer's state (the checkpoint) as
queueing each message one by one does, takes no more than is certain given that state, and
declines whole, changing nothing, where one by one would raise or an emission is in progress.
(tests/spark_integration/test_bulk_commit.py holds its caller to the one-by-one path over
random histories.)"""

from __future__ import annotations

from collections.abc import Sequence

from gazette_consumer.sequencer import ColumnRun, SeqEnvelope, Sequencer, SequencerCheckpoint
from tests.gazette_consumer.sequencer.sequencer_testkit import ACK, CONT, OUT, A, B, Gen, J, drain


def run_of(envs: Sequence[SeqEnvelope]) -> ColumnRun:
    """The ColumnRun of one producer's certain messages, measured one by one."""
    closes = [i for i, e in enumerate(envs) if e.flags != CONT]
    first_close = closes[0] if closes else len(envs)
    last_close = closes[-1] if closes else -1
    return ColumnRun(
        count=len(envs),
        first_clock=envs[0].clock,
        first_begin=envs[0].begin,
        last_clock=envs[-1].clock,
        first_close=first_close,
        pre_close_clock=envs[first_close - 1].clock if first_close else 0,
        last_close=last_close,
        last_close_clock=envs[last_close].clock if closes else 0,
        reopen_begin=envs[last_close + 1].begin if last_close + 1 < len(envs) else 0,
    )


def one_by_one(seq: Sequencer, gen: Gen, envs: Sequence[SeqEnvelope]) -> list[SeqEnvelope]:
    out = []
    for env in envs:
        seq.queue_uncommitted(env)
        if seq.replay_required is not None:
            gen.replay(seq)
        out += drain(seq)
    return out


def start() -> SequencerCheckpoint:
    return SequencerCheckpoint(read_through={J: 0})


def test_runs_leave_the_state_one_by_one_leaves() -> None:
    gen = Gen()
    a = [gen(A, 10, CONT), gen(A, 11, CONT), gen(A, 12, ACK), gen(A, 13, OUT), gen(A, 14, CONT)]
    b = [gen(B, 5, OUT), gen(B, 6, CONT)]
    expected, tested = Sequencer(8, start()), Sequencer(8, start())
    one_by_one(expected, gen, sorted(a + b, key=lambda e: e.begin))

    assert tested.commit_columns(J, 0, [(A, run_of(a)), (B, run_of(b))]) == [5, 2]
    tested.read_through_to(J, gen.all[-1].end)
    assert tested.checkpoint() == expected.checkpoint()

    # A's span is pending from the batch before: extended by columns up to its ACK, which goes
    # one by one (it replays the span's earlier part).
    more = [gen(A, 15, CONT), gen(A, 16, ACK), gen(A, 17, OUT)]
    delivered = one_by_one(expected, gen, more)
    assert tested.commit_columns(J, more[0].begin, [(A, run_of(more))]) == [1]
    assert one_by_one(tested, gen, more[1:]) == delivered
    tested.read_through_to(J, gen.all[-1].end)
    assert tested.checkpoint() == expected.checkpoint()


def test_what_is_not_certain_is_declined_changing_nothing() -> None:
    gen = Gen()
    seq = Sequencer(8, start())
    first = [gen(A, 10, OUT), gen(A, 11, CONT)]
    assert seq.commit_columns(J, 0, [(A, run_of(first))]) == [2]
    seq.read_through_to(J, gen.all[-1].end)
    before = seq.checkpoint()

    resent = [gen(A, 11, CONT), gen(A, 12, ACK)]  # Its first clock is not new.
    assert seq.commit_columns(J, resent[0].begin, [(A, run_of(resent))]) is None
    # Before the read-through offset: queue_trusted would raise OffsetRegressionError.
    assert seq.commit_columns(J, 0, [(B, run_of([gen(B, 1, OUT)]))]) is None
    assert seq.checkpoint() == before

    # While an emission is in progress.
    seq.queue_uncommitted(gen(B, 2, OUT))
    assert seq.commit_columns(J, gen.offset, [(B, run_of([gen(B, 3, OUT)]))]) is None
    assert [e.clock for e in drain(seq)] == [2]


def test_messages_without_a_uuid_alone_commit() -> None:
    seq = Sequencer(8, start())
    assert seq.commit_columns(J, 0, [], untracked=1) == []
    assert seq.commit_columns(J, 0, []) is None
