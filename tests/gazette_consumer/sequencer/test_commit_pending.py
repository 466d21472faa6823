"""`commit_pending` (a batch's committed messages into a list) against the general protocol
(`queue_uncommitted` then `step()` until False): the same messages in the same order (ACKs
aside), the same checkpoints, pending spans and ring, for any stream cut into any batches,
replays and restarts from checkpoints included."""

from __future__ import annotations

from collections import deque

import structlog
from hypothesis import event, given, settings
from hypothesis import strategies as st

from gazette_consumer.sequencer import FLAG_ACK_TXN, SeqEnvelope, Sequencer
from gazette_consumer.sequencer.commit_pending import commit_pending
from tests.gazette_consumer.sequencer.test_sequencer_fast_path import (
    ACK,
    CONT,
    EXAMPLES,
    MSGS,
    OUT,
    A,
    B,
    Gen,
    Msg,
    _prunes_some,
    assert_same,
    general,
    journals_of,
    replayed,
    ring_state,
)


def batched(
    seq: Sequencer[SeqEnvelope],
    journals: dict[str, list[SeqEnvelope]],
    batch: list[SeqEnvelope],
    span_look_max: int | None,
) -> list[SeqEnvelope]:
    """As a batch reader drives it: replays served, then committed messages dequeued."""
    out: list[SeqEnvelope] = []
    pending = deque(batch)
    while (ack := commit_pending(seq, pending, out, span_look_max=span_look_max)) is not None:
        event("replay")
        assert seq.replay_required is not None and ack.flags == FLAG_ACK_TXN
        replayed(journals, seq)
        while (env := seq.dequeue()) is not None:
            if env.flags != FLAG_ACK_TXN:
                out.append(env)
    return out


def without_acks(envs: list[SeqEnvelope]) -> list[SeqEnvelope]:
    return [e for e in envs if e.flags != FLAG_ACK_TXN]


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    streams=st.lists(st.lists(MSGS, max_size=80), min_size=1, max_size=3),
    ring_size=st.one_of(st.integers(1, 4), st.integers(1, 64), st.integers(1, 1024)),
    schedule=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 30), st.integers(0, 9))),
    zero_every=st.sampled_from([0, 0, 7]),
    span_look_max=st.sampled_from([None, 1, 3, 32]),
)
def test_commit_pending_matches_the_general_path(
    streams: list[list[Msg]],
    ring_size: int,
    schedule: list[tuple[int, int, int]],
    zero_every: int,
    span_look_max: int | None,
) -> None:
    journals = journals_of(streams, zero_every)
    names = sorted(journals)
    reference: Sequencer[SeqEnvelope] = Sequencer(ring_size)
    tested: Sequencer[SeqEnvelope] = Sequencer(ring_size)
    pos = dict.fromkeys(names, 0)
    steps = [*schedule, *((j, 1 << 20, 0) for j in range(len(names)))]
    with structlog.testing.capture_logs():  # Unusual flags and clocks are logged errors.
        for j, count, action in steps:
            journal = names[j % len(names)]
            batch = journals[journal][pos[journal] : pos[journal] + count]
            pos[journal] += len(batch)
            want = without_acks(general(reference, journals, batch))
            assert batched(tested, journals, batch, span_look_max) == want
            assert_same(reference, tested)
            assert ring_state(tested) == ring_state(reference)
            if action == 0:
                horizon = _prunes_some(journals)
                cp = reference.checkpoint(horizon)
                assert tested.checkpoint(horizon) == cp
                reference, tested = Sequencer(ring_size, cp), Sequencer(ring_size, cp)
                for name in names:
                    offset = cp.read_through.get(name, 0)
                    envs = journals[name]
                    pos[name] = next(
                        (i for i, e in enumerate(envs) if e.begin >= offset), len(envs)
                    )


def test_runs_transactions_and_a_replay_in_one_batch() -> None:
    """Each fast path in one batch, and a transaction longer than the ring: its ACK stops
    the call for a replay, and the next call goes on after it."""
    gen = Gen()
    envs = [
        gen(A, 1, OUT),
        gen(A, 2, OUT),
        gen(A, 3, OUT),  # A run.
        gen(A, 10, CONT),
        gen(A, 11, CONT),
        gen(A, 12, ACK),  # A whole transaction.
    ]
    long_txn = [gen(B, 100 + i, CONT) for i in range(6)]
    envs += [*long_txn, gen(B, 106, ACK), gen(A, 13, OUT)]  # The ring of 4 lost its start.
    journals = {gen.journal: envs}
    seq: Sequencer[SeqEnvelope] = Sequencer(4)
    out: list[SeqEnvelope] = []
    # The first batch ends inside B's transaction: its messages are linked into the ring.
    assert commit_pending(seq, deque(envs[:9]), out) is None
    assert out == envs[:5]  # The run, then the transaction without its ACK.
    pending = deque(envs[9:])
    ack = commit_pending(seq, pending, out)
    assert ack is envs[-2] and seq.replay_required is not None
    replayed(journals, seq)
    while (env := seq.dequeue()) is not None:
        out.append(env)
    assert out[5:] == [*long_txn, envs[-2]]
    rest: list[SeqEnvelope] = []
    assert commit_pending(seq, pending, rest) is None and not pending
    assert rest == [envs[-1]]
