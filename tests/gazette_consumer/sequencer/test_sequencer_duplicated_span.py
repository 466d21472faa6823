"""An append batch holding several transactions of one producer, appended twice, is delivered once.

Found by the soak (f16-soak, mixed mode, a journal's primary killed -9 and restarted at once):
the AppendService had coalesced a producer's CONTINUE_TXN messages and two of its ACK_TXNs into
one append; the replicas committed it, but its primary died before answering, and the client
appended the whole batch again, after the first copy. Reading the copy, its first ACK is older
than the last ACK read. Gazette's sequencer takes that for an upstream that restored an older
checkpoint and lowers its bound to the older clock ("loss of exactly-once semantics"), so the
copy's later transaction was delivered a second time and the soak's summer failed its shard
with a sequence violation. This Sequencer keeps the bound (classify.py): an older ACK drops the
pending span and nothing at or below the bound is delivered again.
"""

from __future__ import annotations

import random

import pytest

from gazette_consumer.sequencer import SeqEnvelope, Sequencer
from tests.gazette_consumer.sequencer.sequencer_testkit import ACK, CONT, A, B, Gen, drain, queue


def _read(seq: Sequencer, gen: Gen, envs: list[SeqEnvelope]) -> list[object]:
    """Queue `envs` one at a time as a reader would, serving replays; the messages delivered."""
    out: list[object] = []
    for env in envs:
        queue(seq, env)
        if seq.replay_required is not None:
            gen.replay(seq)
        out.extend(e.message for e in drain(seq))
    return out


def test_a_batch_of_two_transactions_appended_twice_is_delivered_once() -> None:
    seq, gen = Sequencer(16), Gen(named=True)
    batch = [(1, CONT), (2, ACK), (3, CONT), (4, ACK)]
    first = [gen(A, clock, flags) for clock, flags in batch]
    assert _read(seq, gen, first) == [f"{A.hex()}@{c}" for c in (1, 2, 3, 4)]
    second = [gen(A, clock, flags) for clock, flags in batch]
    assert _read(seq, gen, second) == []  # Gazette's rule delivers 3 and its ACK again.


def test_a_copy_ending_in_an_open_transaction_delivers_it_once_at_its_ack() -> None:
    """The copy drops the original's pending span (its older ACK, then its equal one) and
    begins it again from the copy: the later ACK delivers each message of it once."""
    seq, gen = Sequencer(16), Gen(named=True)
    batch = [(1, CONT), (2, ACK), (3, CONT), (4, ACK), (5, CONT)]
    first = [gen(A, clock, flags) for clock, flags in batch]
    assert _read(seq, gen, first) == [f"{A.hex()}@{c}" for c in (1, 2, 3, 4)]
    second = [gen(A, clock, flags) for clock, flags in batch]
    assert _read(seq, gen, second) == []
    assert _read(seq, gen, [gen(A, 6, CONT), gen(A, 7, ACK)]) == [
        f"{A.hex()}@{c}" for c in (5, 6, 7)
    ]


@pytest.mark.parametrize("seed", range(40))
def test_random_batches_appended_twice_deliver_each_committed_message_once(seed: int) -> None:
    """Two producers' transactions (some rolled back by a re-sent ACK), cut into append batches
    at random points, batches interleaved between the producers, and some batches appended a
    second time right after the first (the client retried one whose first try committed).
    A small ring makes long transactions replay. Every committed message, once, in order."""
    rnd = random.Random(seed)
    seq, gen = Sequencer(4), Gen(named=True)
    streams: dict[bytes, list[tuple[int, int]]] = {}
    expected: dict[bytes, list[str]] = {}
    for producer in (A, B):
        clock, last_ack, stream, committed = 0, 0, [], []
        for _ in range(rnd.randint(3, 12)):
            span = []
            for _ in range(rnd.randint(0, 7)):
                clock += 1
                span.append((clock, CONT))
            if last_ack and rnd.random() < 0.2:
                stream += [*span, (last_ack, ACK)]  # Rolled back: the last ACK again.
                continue
            clock += 1
            stream += [*span, (clock, ACK)]
            committed += [f"{producer.hex()}@{c}" for c, _ in span] + [f"{producer.hex()}@{clock}"]
            last_ack = clock
        streams[producer] = stream
        expected[producer] = committed

    # Cut each producer's stream into batches, then interleave them, some twice in a row.
    batches: dict[bytes, list[list[tuple[int, int]]]] = {}
    for producer, stream in streams.items():
        cuts = sorted(rnd.sample(range(1, len(stream)), min(len(stream) - 1, rnd.randint(1, 6))))
        batches[producer] = [
            stream[i:j] for i, j in zip([0, *cuts], [*cuts, len(stream)], strict=True)
        ]
    delivered: list[object] = []
    duplicated = 0
    while any(batches.values()):
        producer = rnd.choice([p for p, bs in batches.items() if bs])
        batch = batches[producer].pop(0)
        copies = 2 if rnd.random() < 0.4 else 1
        duplicated += copies - 1
        for _ in range(copies):
            delivered += _read(seq, gen, [gen(producer, c, f) for c, f in batch])
    for producer in (A, B):
        mine = [m for m in delivered if isinstance(m, str) and m.startswith(producer.hex())]
        assert mine == expected[producer], f"seed {seed}: {duplicated} batches appended twice"
