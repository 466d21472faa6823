"""Exactly-once counting across abrupt restarts, on SQLite and PostgreSQL.

Producers write committed messages, transactions that are acknowledged or rolled back, and
duplicates (a message appended again right after itself, as a retried append does). A counting
shard, which also publishes one derived message per message it consumes, is cancelled at random
points (mid-transaction, right after a commit started, right after an ACK landed) and restarted
from its store. At the end the counts in SQL, and the derived messages a read-committed reader
sees, must match exactly what the producers committed.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from broker.client.append_service import AppendService
from broker.protocol import consumer_pb2 as cpb
from gazette_consumer.shard_runner import LocalShard, ShardRunner
from tests.gazette_consumer.shard_testkit import (
    CountingApp,
    Event,
    Notifier,
    Producer,
    broker_env,
    pg_engine,
    read_committed,
    read_counts,
    shard_spec,
    sqlite_engine,
)

SEED = 20260611
KEYS = [f"k{i}" for i in range(6)]
ROUNDS = 10  # Restarts: one after each round of production but the last.
OPS_PER_ROUND = 80
PLAIN_FIRST = 5  # Committed messages opening each round: every kill trigger has some to see.
FLUSH_EVERY = 8
SHARD = "shard-eo"


@pytest.fixture(params=["sqlite", "postgres"])
async def engine(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Engine]:
    if request.param == "sqlite":
        async with sqlite_engine(tmp_path) as engine:
            yield engine
    else:
        async with pg_engine(request.getfixturevalue("pg_url")) as engine:
            yield engine


def failed(handle: LocalShard) -> bool:
    return handle.status().code == cpb.ReplicaStatus.FAILED


class Workload:
    """Seeded production into two source journals, by one plain and two transactional
    producers."""

    def __init__(self, rng: random.Random, appends: AppendService, sources: list[str]) -> None:
        self.rng = rng
        self.sources = sources
        self.plain = Producer(appends, "plain")
        self.txn = [Producer(appends, "txn1"), Producer(appends, "txn2")]
        self.appends = appends
        self.rollbacks = 0

    async def prime(self) -> None:
        # An acknowledged transaction on every journal, so later ones can be rolled back.
        for producer in self.txn:
            for journal in self.sources:
                await producer.uncommitted(journal, self.rng.choice(KEYS))
            await producer.acknowledge()

    async def round(self) -> None:
        rng = self.rng
        for op in range(OPS_PER_ROUND):
            if op % FLUSH_EVERY == 0:
                # Let appends land now and then, so that the shard consumes while the producers
                # produce (many small transactions) rather than one backlog per round.
                await self.appends.flush()
            journal, key = rng.choice(self.sources), rng.choice(KEYS)
            duplicate = rng.random() < 0.15
            draw = rng.random()
            if op < PLAIN_FIRST or draw < 0.35:
                await self.plain.committed(journal, key, duplicate=duplicate)
                continue
            producer = rng.choice(self.txn)
            if draw < 0.8:
                await producer.uncommitted(journal, key, duplicate=duplicate)
            elif draw < 0.92 or not producer.can_roll_back():
                await producer.acknowledge()
            else:
                await producer.roll_back()
                self.rollbacks += 1

    async def finish(self) -> dict[str, int]:
        """Close open transactions, append an end marker to each source; the marker offsets."""
        for producer in self.txn:
            await producer.acknowledge()
        ends = {}
        for journal in self.sources:
            marker = Event(key="end", text=f"end-{journal}")
            appended = await self.plain.committed_together(journal, [marker])
            ends[journal] = (await appended).commit.end
        return ends

    def expected(self) -> Counter[str]:
        total = Counter(self.plain.expected)
        for producer in self.txn:
            total.update(producer.expected)
        return total


async def test_exactly_once_counts_across_abrupt_restarts(engine: Engine) -> None:
    rng = random.Random(SEED)
    async with broker_env() as env, AppendService(env.client) as appends:
        sources = [await env.journal("in/eo-a"), await env.journal("in/eo-b")]
        output = await env.journal("out/eo")
        app = CountingApp(engine, output=output)
        changed = Notifier()
        progress_changes = 0

        def on_change() -> None:
            nonlocal progress_changes
            progress_changes += 1
            changed.notify()

        workload = Workload(rng, appends, sources)
        await workload.prime()
        spec = shard_spec(SHARD, sources, max_txn_s=0.05)
        kills: Counter[str] = Counter()
        async with ShardRunner(app, env.client, root="/test/exactly-once") as runner:
            handle: LocalShard = runner.start(spec, on_change=on_change)
            for round_index in range(ROUNDS):
                # Kill triggers count from here: the round brings at least PLAIN_FIRST new
                # messages, hence consumes and a commit, whenever the shard gets to them.
                consumed, finishes, changes = (
                    app.consumed_total,
                    len(app.finishes),
                    progress_changes,
                )
                await workload.round()
                if round_index == ROUNDS - 1:
                    break
                # Kill at a random point of the shard's work, then restart it from its store.
                trigger = rng.choice(["consumed", "commit started", "acknowledged"])
                kills[trigger] += 1
                if trigger == "consumed":
                    consumed += rng.randint(1, PLAIN_FIRST)
                    await app.events.until(
                        lambda c=consumed, h=handle: app.consumed_total >= c or failed(h)
                    )
                elif trigger == "commit started":
                    await app.events.until(
                        lambda f=finishes, h=handle: len(app.finishes) > f or failed(h)
                    )
                else:
                    await changed.until(lambda c=changes: progress_changes > c)
                await runner.stop(SHARD)
                assert handle.status().errors == [], handle.status().errors
                handle = runner.start(spec, on_change=on_change)

            ends = await workload.finish()
            await changed.until(
                lambda: all(handle.progress().read_through.get(j, 0) >= e for j, e in ends.items())
            )
            assert handle.status().errors == []

        expected = workload.expected()  # The end markers included.
        print(
            "STATS",
            kills,
            workload.rollbacks,
            app.consumed_total,
            sum(expected.values()),
            len(app.finishes),
            app.begins,
        )
        assert sum(kills.values()) == ROUNDS - 1 and workload.rollbacks > 0
        assert await read_counts(engine, SHARD) == dict(expected)

        # Downstream: each consumed message's derived message is read exactly once.
        await workload.plain.committed_together(output, [Event(key="out-end", text="marker")])
        derived = await read_committed(env.client, output, until_text="marker")
        sources_of = [e.message.text for e in derived[:-1]]
        assert len(sources_of) == len(set(sources_of)), "a derived message was read twice"
        assert Counter(e.message.key for e in derived[:-1]) == expected
