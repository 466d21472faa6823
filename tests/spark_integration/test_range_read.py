"""range_read's read-committed walk of a journal range (no Spark needed), against the
ReadCommittedIter consumers use: the same committed messages, whole or split at any append
boundary through the checkpoint `scan_committed` plans with, with rings small enough to replay.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest

from gazette_consumer.sequencer.read_iter import ReadCommittedIter
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
    msg,
)

PRODUCERS = [P1, P2, P3]


def history(seed: int) -> list[list[Msg]]:
    """Appends of a random history: runs of messages committed alone, transactions committed,
    rolled back (a re-sent ACK of the last commit) or left pending, re-sent duplicates, and
    producers interleaved within one append."""
    rng = random.Random(seed)
    clocks = dict.fromkeys(PRODUCERS, 100)
    last_ack = dict.fromkeys(PRODUCERS, 0)
    appends: list[list[Msg]] = []
    n = 0
    for _ in range(rng.randint(6, 14)):
        batch: list[Msg] = []
        for _ in range(rng.randint(1, 4)):
            p = rng.choice(PRODUCERS)
            kind = rng.choice(["outside", "txn", "txn", "rollback", "dup"])
            if kind == "outside":
                for _ in range(rng.randint(1, 30)):
                    clocks[p] += 1
                    batch.append(msg(p, clocks[p], OUTSIDE, f"m{n}"))
                    n += 1
            elif kind in ("txn", "rollback"):
                for _ in range(rng.randint(1, 25)):
                    clocks[p] += 1
                    batch.append(msg(p, clocks[p], CONTINUE, f"m{n}"))
                    n += 1
                    if rng.random() < 0.2:  # Another producer's message in between.
                        q = rng.choice(PRODUCERS)
                        if q != p:
                            clocks[q] += 1
                            batch.append(msg(q, clocks[q], OUTSIDE, f"m{n}"))
                            n += 1
                if kind == "txn":
                    clocks[p] += 1
                    last_ack[p] = clocks[p]
                    batch.append(msg(p, clocks[p], ACK))
                elif last_ack[p]:
                    batch.append(msg(p, last_ack[p], ACK))  # Rolls the transaction back.
            elif messages := [m for m in batch if m.text]:
                batch.append(rng.choice(messages))  # A re-sent message.
        appends.append(batch)
    return appends


def source(client: Any, journal: str) -> JournalSource:
    """The journal's content through the broker alone."""
    return JournalSource(journal, (), client=client, registry=None, fail_on_data_loss=True)


async def texts(walk: CommittedRange) -> list[str]:
    return [
        json.loads(line)["text"]
        async for batch in walk.batches()
        for line in batch.content.to_pylist()
    ]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("ring_size", [4, 64, 8192])
async def test_committed_ranges_read_what_consumers_read(seed: int, ring_size: int) -> None:
    async with broker_env() as env:
        journal = await env.journal(f"range/s{seed}-r{ring_size}")
        bounds = [0]
        appends = history(seed)
        written = {m.text for batch in appends for m in batch if m.text}
        for batch in appends:
            if batch:
                bounds.append((await env.append_messages(journal, batch))[1])
        head = bounds[-1]

        it = ReadCommittedIter(env.client, {journal: 0}, message_type=Msg, ring_size=ring_size)
        expected: list[str] = []
        while True:
            got = it.try_next()
            if got is None:
                if it.checkpoint().read_through.get(journal, 0) >= head:
                    break  # Everything was read; what was not returned is not committed.
                async with asyncio.timeout(30):
                    got = await it.next()
            expected.append(got.message.text)
        await it.close()
        assert len(set(expected)) == len(expected) > 50
        assert len(expected) < len(written)  # Some were rolled back or left pending.

        whole = CommittedRange(source(env.client, journal), 0, head, ring_size=ring_size)
        assert await texts(whole) == expected
        if ring_size == 4:
            assert whole.replays > 0  # Spans longer than the ring were replayed.

        # Split at every append boundary: the second part starts from the first's checkpoint.
        for mid in bounds[1:-1]:
            cp = await scan_committed(
                source(env.client, journal),
                0,
                mid,
                ring_size=ring_size,
                checkpoint=whole_checkpoint(journal),
                horizon=0,
            )
            first = CommittedRange(source(env.client, journal), 0, mid, ring_size=ring_size)
            second = CommittedRange(
                source(env.client, journal), mid, head, ring_size=ring_size, checkpoint=cp
            )
            got = await texts(first) + await texts(second)
            assert got == expected, f"split at {mid}"


def whole_checkpoint(journal: str) -> Any:
    from gazette_consumer.sequencer.types import SequencerCheckpoint

    return SequencerCheckpoint(read_through={journal: 0})
