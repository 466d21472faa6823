"""The read-committed pass by columns (bulk_commit.py) against the one-by-one Sequencer path it
replaces where it can: a range walk with `bulk=True` must deliver exactly the rows, in the
same order, and end in the same checkpoint as with `bulk=False` (every row through
`commit_pending`), whole or split into partitions, over journals with interleaved producers,
rolled-back transactions, re-sent (replayed) messages whose clocks go back, ACKs decoded in
later batches than their transactions, and messages without a UUID.
"""

from __future__ import annotations

import functools
import random
from itertools import pairwise
from typing import Any

import pytest

from gazette_consumer.message import NIL_UUID
from gazette_consumer.message.uuid import producer_id
from gazette_consumer.sequencer.types import SequencerCheckpoint
from spark_integration.bulk_commit import BulkSequencer
from spark_integration.json_lines import JSONLinesDecoder, bulk_batch
from spark_integration.message_batch import ProducerIntern
from spark_integration.range_decode import DecoderFactory
from spark_integration.range_read import CommittedRange, scan_committed
from spark_integration.sources import JournalSource
from tests.gazette_consumer.sequencer.read_iter_testkit import (
    ACK,
    CONTINUE,
    OUTSIDE,
    P1,
    P2,
    P3,
    Msg,
    broker_env,
    frames,
    msg,
)

P4 = producer_id(bytes.fromhex("010000000004"))
PRODUCERS = [P1, P2, P3, P4]


def history(seed: int, *, old_acks: bool) -> list[list[Msg]]:
    """Appends of a random history of four producers: OUTSIDE_TXN runs, transactions
    interleaved with each other's (spanning appends), committed or rolled back (a re-sent ACK
    of the last commit), re-sent runs of a producer's earlier messages (its clock going back;
    their ACKs too with `old_acks`: an ACK older than the last, where exactly-once degrades to
    at-least-once), and messages without a UUID."""
    rng = random.Random(seed)
    clocks = dict.fromkeys(PRODUCERS, 1000)
    last_ack = dict.fromkeys(PRODUCERS, 0)
    pending = dict.fromkeys(PRODUCERS, False)
    sent: dict[Any, list[Msg]] = {p: [] for p in PRODUCERS}
    appends: list[list[Msg]] = []
    n = 0

    def add(p: Any, flags: Any, text: str = "") -> Msg:
        clocks[p] += 1
        m = msg(p, clocks[p], flags, text)
        sent[p].append(m)
        return m

    for _ in range(rng.randint(20, 40)):
        batch: list[Msg] = []
        for _ in range(rng.randint(1, 6)):
            p = rng.choice(PRODUCERS)
            kind = rng.choices(
                ["outside", "continue", "ack", "rollback", "resend", "nil"], [3, 6, 3, 1, 1, 1]
            )[0]
            if kind == "outside" and not pending[p]:
                for _ in range(rng.randint(1, 20)):
                    batch.append(add(p, OUTSIDE, f"m{n}"))
                    n += 1
                last_ack[p] = clocks[p]  # What a rollback re-sends: the last commit's clock.
            elif kind == "continue" or (kind == "outside" and pending[p]):
                for _ in range(rng.randint(1, 30)):
                    q = p if rng.random() < 0.7 else rng.choice(PRODUCERS)
                    if q == p or pending[q]:
                        batch.append(add(q, CONTINUE, f"m{n}"))
                        pending[q] = True
                        n += 1
            elif kind == "ack":
                batch.append(add(p, ACK))
                last_ack[p], pending[p] = clocks[p], False
            elif kind == "rollback" and last_ack[p]:
                batch.append(msg(p, last_ack[p], ACK))  # Rolls the pending span back.
                pending[p] = False
            elif kind == "resend" and sent[p]:
                at = rng.randrange(len(sent[p]))
                again = sent[p][at : at + rng.randint(1, 8)]
                batch += [m for m in again if old_acks or m.text]
            elif kind == "nil":
                batch.append(Msg(uuid=NIL_UUID, text=f"m{n}"))
                n += 1
        appends.append(batch)
    for p in PRODUCERS:  # Most transactions end committed.
        if pending[p] and rng.random() < 0.7:
            appends.append([add(p, ACK)])
    return appends


def source(client: Any, journal: str) -> JournalSource:
    return JournalSource(journal, (), client=client, registry=None, fail_on_data_loss=True)


async def rows(walk: CommittedRange) -> list[tuple[int, str]]:
    return [
        (int(begin), line)
        async for batch in walk.batches()
        for begin, line in zip(batch.begins, batch.content.to_pylist(), strict=True)
    ]


async def split_read(
    client: Any,
    journal: str,
    cuts: list[int],
    head: int,
    ring_size: int,
    decoder: DecoderFactory,
    *,
    bulk: bool,
) -> tuple[list[tuple[int, str]], list[SequencerCheckpoint], int]:
    """What the partitions [0, c1), ... [cn, head) deliver, each from the checkpoint a scan
    from 0 plans (as streaming does), with the checkpoints and how many rows went in bulk."""
    out: list[tuple[int, str]] = []
    checkpoints: list[SequencerCheckpoint] = []
    bulk_rows = 0
    for lo, hi in pairwise([0, *cuts, head]):
        cp = await scan_committed(
            source(client, journal),
            0,
            lo,
            ring_size=ring_size,
            checkpoint=SequencerCheckpoint(read_through={journal: 0}),
            horizon=0,
            new_decoder=decoder,
            bulk=bulk,
        )
        checkpoints.append(cp)
        walk = CommittedRange(
            source(client, journal),
            lo,
            hi,
            ring_size=ring_size,
            checkpoint=cp,
            deliver_from=lo if lo else None,
            read_end=head,
            new_decoder=decoder,
            bulk=bulk,
        )
        out += await rows(walk)
        bulk_rows += walk.bulk_rows
    return out, checkpoints, bulk_rows


@pytest.mark.parametrize("seed", range(int(__import__("os").environ.get("BULK_SEEDS", "8"))))
async def test_bulk_walk_delivers_what_one_by_one_does(seed: int) -> None:
    rng = random.Random(seed)
    old_acks = seed % 2 == 1  # Re-sent ACKs older than the last: odd seeds.
    ring_size = rng.choice([4, 64, 8192])
    # Small pieces: a transaction's messages and its ACK are decoded in different batches.
    decoder = functools.partial(JSONLinesDecoder, piece_bytes=rng.choice([200, 700, 3000]))
    async with broker_env() as env:
        journal = await env.journal(f"bulk/s{seed}")
        bounds = [0]
        for batch in history(seed, old_acks=old_acks):
            if batch:
                bounds.append((await env.append_messages(journal, batch))[1])
        head = bounds[-1]
        counts = {"bulk": 0, "single": 0}
        whole: dict[bool, list[tuple[int, str]]] = {}
        for bulk in (True, False):
            walk = CommittedRange(
                source(env.client, journal),
                0,
                head,
                ring_size=ring_size,
                new_decoder=decoder,
                bulk=bulk,
            )
            whole[bulk] = await rows(walk)
            if bulk:
                counts["bulk"], counts["single"] = walk.bulk_rows, walk.single_rows
                bulk_checkpoint = walk.checkpoint()
            else:
                assert walk.bulk_rows == 0
                assert walk.checkpoint() == bulk_checkpoint
        assert whole[True] == whole[False]
        assert len({begin for begin, _ in whole[True]}) == len(whole[True]) > 100
        # Both paths were taken: rows decided by columns, and rows one by one.
        assert counts["bulk"] > 0 and counts["single"] > 0, counts

        inner = bounds[1:-1]
        for cuts in [rng.sample(inner, 1), sorted(rng.sample(inner, 3)), inner[::3]]:
            got, got_cps, bulk_rows = await split_read(
                env.client, journal, cuts, head, ring_size, decoder, bulk=True
            )
            want, want_cps, _ = await split_read(
                env.client, journal, cuts, head, ring_size, decoder, bulk=False
            )
            assert got_cps == want_cps, f"cuts {cuts}"
            assert got == want, f"cuts {cuts}"
            assert sorted(got) == sorted(whole[False]), f"cuts {cuts}"
            assert bulk_rows > 0


def decoded(journal: str, messages: list[Msg]) -> Any:
    """One batch of `messages`, as a partition decodes them."""
    batch = bulk_batch(journal, 0, frames(*messages))
    assert batch is not None
    return batch


def test_bulk_plan_of_interleaved_transactions_and_what_it_leaves() -> None:
    """Two transactions interleaved, one committed in the batch, one left pending; a producer
    re-sending an old message: its rows up to that one are decided in bulk, the rest one by
    one."""
    journal = "bulk/plan"
    messages = [
        msg(P1, 10, CONTINUE, "a1"),
        msg(P2, 20, CONTINUE, "b1"),
        msg(P1, 11, CONTINUE, "a2"),
        msg(P3, 30, OUTSIDE, "c1"),
        msg(P2, 21, CONTINUE, "b2"),
        msg(P1, 12, ACK),
        msg(P3, 29, OUTSIDE, "c0"),  # Its clock goes back: one by one from here.
        Msg(uuid=NIL_UUID, text="n1"),
    ]
    batch = decoded(journal, messages)
    seq = BulkSequencer(64, SequencerCheckpoint(read_through={journal: 0}))
    plan = seq.commit_bulk(batch, 0, len(batch), ProducerIntern())
    assert plan is not None
    # c1 committed alone; a1, a2 at P1's ACK (row 5); the NIL-UUID row at its own.
    assert plan.delivered.tolist() == [3, 0, 2, 7]
    assert plan.commits.tolist() == [3, 5, 5, 7]
    assert plan.fallback.tolist() == [6]
    seq.read_through_to(journal, batch.end)
    producers = {jp.producer: state for jp, state in seq.checkpoint().producers.items()}
    assert producers[P1].last_ack == 12 and producers[P1].begin == -1
    # P2's span is pending from b1, its clocks from before b1 presumed acknowledged.
    assert producers[P2].last_ack == 19 and producers[P2].begin == int(batch.begins[1])
    assert producers[P3].last_ack == 30 and producers[P3].begin == -1

    # A span pending from an earlier batch: extended in bulk up to its ACK, which goes one by
    # one (it replays the span's earlier part).
    more = bulk_batch(journal, batch.end, frames(msg(P2, 22, CONTINUE, "b3"), msg(P2, 23, ACK)))
    assert more is not None
    plan = seq.commit_bulk(more, 0, len(more), ProducerIntern())
    assert plan is not None
    assert plan.delivered.tolist() == [] and plan.fallback.tolist() == [1]
    producers = {jp.producer: state for jp, state in seq.checkpoint().producers.items()}
    assert producers[P2].begin == int(batch.begins[1])
