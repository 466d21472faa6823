"""Exactly-once across consumer *processes* killed with -9, on SQLite and on PostgreSQL.

One ``gazette serve`` broker on a real etcd, and one ``gazette-consumer serve`` process running
the counting example (examples/counter) with two shards of two source journals each. Publishers
in this process write `MESSAGES` messages in `ROUNDS` rounds: committed ones (some appended
twice, as a retried append is), transactions that are acknowledged, rolled back (an earlier
ACK re-sent), or abandoned (never acknowledged). After each round the consumer process is
killed with SIGKILL at a seeded random point of its progress (the seed and each point are
printed) and restarted. At the end:

- the counts in the store equal what the publishers committed, key by key;
- a read-committed reader of the derived journal reads exactly one `Counted` per committed input
  message: per key, the totals 1, 2, ..., count, each once, each from a distinct source UUID.

Kill points are chosen on events: a random offset between the shard's read-through and what was
produced to that journal; the kill follows once Stat says the shard read through it, after a
seeded random delay (that delay places the kill mid-transaction or mid-commit; it synchronises
nothing). Everything else waits on Stat (the consumer's progress) and append responses.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from e2e_workload import journal_spec, read_journal, requires_etcd
from google.protobuf.duration_pb2 import Duration

from broker.client.append_service import AppendService
from broker.client.async_append import AsyncAppend
from broker.client.list_apply import apply_journals, upsert
from broker.client.route_cache import JournalClient
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import labels
from broker.protocol import protocol_pb2 as pb
from broker.testing.process_cluster import ProcessCluster
from examples.counter import Count, Counted, read_counts
from gazette_consumer.message import CONTENT_TYPE_JSON_LINES, JSONFraming, Partition, Publisher
from gazette_consumer.sequencer.read_iter import ReadCommittedIter
from gazette_consumer.shard_client import ShardClient
from gazette_consumer.shard_client import upsert as shard_upsert
from tests.broker.serve_testkit import free_port
from tests.gazette_consumer.consumer_testkit import ConsumerProcess, stat_through
from tests.gazette_consumer.shard_testkit import pg_engine

pytestmark = [pytest.mark.etcd, requires_etcd]

SEED = int(os.environ.get("GAZETTE_TEST_SEED", "20261122"))
MESSAGES = int(
    os.environ.get("GAZETTE_TEST_EO_MESSAGES", "100000")
)  # Input messages written, duplicates and rolled-back ones included.
ROUNDS = 10  # One kill -9 and restart after each.
LEASE_TTL_S = 3
ROOT = "/gazette/consumers/e2e-eo"
SHARDS = {
    "eo-a": ["eo/in-a0", "eo/in-a1"],
    "eo-b": ["eo/in-b0", "eo/in-b1"],
}
OUTPUT = "eo/out"
# Keys are per shard, so that each key's totals come from one shard: exactly 1..count.
KEYS = {shard: [f"{shard}-k{i}" for i in range(8)] for shard in SHARDS}
WAIT_S = 90.0
JSON = JSONFraming()


def json_journal(name: str, store: str) -> pb.JournalSpec:
    spec = journal_spec(name, 1, store, length=1 << 24, codec=pb.NONE)
    spec.labels.CopyFrom(labels.label_set([(labels.CONTENT_TYPE, CONTENT_TYPE_JSON_LINES)]))
    return spec


def counter_shard(shard: str) -> cpb.ShardSpec:
    return cpb.ShardSpec(
        id=shard,
        sources=[cpb.ShardSpec.Source(journal=j) for j in SHARDS[shard]],
        max_txn_duration=Duration(seconds=1),
        labels=pb.LabelSet(labels=[pb.Label(name="counter.example/output", value=OUTPUT)]),
    )


def to(journal: str) -> Callable[[Any], Partition]:
    partition = Partition(journal, CONTENT_TYPE_JSON_LINES)
    return lambda _message: partition


@dataclass
class Producers:
    """Seeded input: a plain publisher (committed messages, some duplicated) and transactional
    ones (acknowledged, rolled back, or abandoned transactions). `heads` is what was appended
    to each journal so far (from append responses); `delivered` the begin offset of the last
    append (a batch of messages) holding one that hands a reader a message (a committed
    message, or an ACK committing some). A shard's progress moves only with transactions,
    which need a delivered message, so it is sure to read past `delivered`, but not past the
    tail beyond (an open transaction, a duplicate or a rollback) until more is published.
    `expected` is what must count."""

    rng: random.Random
    appends: AppendService
    heads: dict[str, int] = field(default_factory=dict)
    delivered: dict[str, int] = field(default_factory=dict)
    expected: Counter[str] = field(default_factory=Counter)
    written: int = 0
    rollbacks: int = 0
    duplicates: int = 0

    def __post_init__(self) -> None:
        self.plain: Publisher[AsyncAppend] = Publisher(self.appends)
        self.txn = [Publisher[AsyncAppend](self.appends) for _ in range(3)]
        self.open: list[Counter[str]] = [Counter() for _ in self.txn]
        self.open_journals: list[set[str]] = [set() for _ in self.txn]
        self.last_acks: list[dict[str, bytes]] = [{} for _ in self.txn]

    def _track(self, append: AsyncAppend, *, delivers: bool = False) -> None:
        def done(_future: object) -> None:
            if not append.future.cancelled() and append.exception() is None:
                commit = append.result().commit
                journal = append.journal
                self.heads[journal] = max(self.heads.get(journal, 0), commit.end)
                if delivers:
                    self.delivered[journal] = max(self.delivered.get(journal, 0), commit.begin)

        append.future.add_done_callback(done)

    async def _duplicate(self, journal: str, message: Count) -> None:
        appended = await self.appends.start_append(journal)
        appended.write(JSON.marshal(message))
        appended.release()
        self._track(appended)
        self.duplicates += 1

    def _pick(self) -> tuple[str, str]:
        shard = self.rng.choice(sorted(SHARDS))
        return self.rng.choice(SHARDS[shard]), self.rng.choice(KEYS[shard])

    async def round(self, messages: int) -> None:
        rng = self.rng
        for i in range(messages):
            if i % 2000 == 0:
                await self.appends.flush()  # Let the consumer interleave with production.
            journal, key = self._pick()
            draw = rng.random()
            if draw < 0.4:
                message = Count(key=key)
                self._track(await self.plain.publish_committed(to(journal), message), delivers=True)
                self.expected[key] += 1
                if rng.random() < 0.05:
                    await self._duplicate(journal, message)
                continue
            p = rng.randrange(len(self.txn))
            if draw < 0.97:
                message = Count(key=key)
                self._track(await self.txn[p].publish_uncommitted(to(journal), message))
                self.open[p][key] += 1
                self.open_journals[p].add(journal)
                if rng.random() < 0.05:
                    await self._duplicate(journal, message)
            elif draw < 0.993 or not self._can_roll_back(p):
                await self._acknowledge(p)
            else:
                await self._roll_back(p)
        self.written += messages

    def _can_roll_back(self, p: int) -> bool:
        journals = self.open_journals[p]
        return bool(journals) and journals <= self.last_acks[p].keys()

    async def _acknowledge(self, p: int) -> None:
        intents = self.txn[p].build_ack_intents()
        self.last_acks[p].update(intents)
        self.expected.update(self.open[p])
        self.open[p].clear()
        committing, self.open_journals[p] = self.open_journals[p], set()
        for ack in await self.txn[p].write_ack_intents(intents):
            self._track(ack, delivers=ack.journal in committing)

    async def _roll_back(self, p: int) -> None:
        """Re-send the last ACK of each journal of the open transaction: readers roll it back."""
        self.txn[p].build_ack_intents()  # Forget the open transaction's intents.
        journals = sorted(self.open_journals[p])
        self.open[p].clear()
        self.open_journals[p].clear()
        resend = {j: self.last_acks[p][j] for j in journals}
        for ack in await self.txn[p].write_ack_intents(resend):
            self._track(ack)
        self.rollbacks += 1

    async def finish(self) -> dict[str, int]:
        """Acknowledge two producers' open transactions and abandon the third's (its
        messages are never acknowledged, so never count); then a committed end marker per
        journal. Returns each journal's offset after its marker."""
        for p in (0, 1):
            await self._acknowledge(p)
        ends = {}
        for shard, journals in sorted(SHARDS.items()):
            for journal in journals:
                marker = Count(key=f"{shard}-end")
                appended = await self.plain.publish_committed(to(journal), marker)
                self.expected[marker.key] += 1
                ends[journal] = (await appended).commit.end
        await self.appends.flush()
        return ends


@pytest.fixture(params=["sqlite", "postgres"])
async def database(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[dict[str, str]]:
    """The consumer's environment choosing its store: SQLite files, or a fresh PostgreSQL
    database."""
    if request.param == "sqlite":
        yield {"COUNTER_DATA_DIR": str(tmp_path / "db")}
        return
    async with pg_engine(request.getfixturevalue("pg_url")) as engine:
        yield {"COUNTER_DB_URL": engine.url.render_as_string(hide_password=False)}


def committed_counts(env: dict[str, str]) -> Counter[str]:
    out: Counter[str] = Counter()
    for shard in SHARDS:
        if "COUNTER_DB_URL" in env:
            engine = sa.create_engine(env["COUNTER_DB_URL"])
        else:
            engine = sa.create_engine(f"sqlite:///{Path(env['COUNTER_DATA_DIR'], shard)}.sqlite")
        try:
            out.update(read_counts(engine, shard))
        finally:
            engine.dispose()
    return out


# ~90 s on an idle 2-core machine (kill -9 cycles of three consumer processes, each a Python
# start-up): the suite's 120 s default leaves too little room under load.
@pytest.mark.timeout(300)
async def test_exactly_once_across_kill_9_of_the_consumer_process(
    database: dict[str, str], tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    print(f"seed {SEED}")
    started = time.monotonic()
    async with ProcessCluster([("zone-a", "broker-a1")], lease_ttl_s=LEASE_TTL_S) as cluster:
        journals = [j for sources in SHARDS.values() for j in sources] + [OUTPUT]
        await cluster.apply(json_journal(j, cluster.store_url) for j in journals)
        await cluster.wait_until(cluster.journals_ready(journals, 1))
        broker = cluster.brokers[0].endpoint.removeprefix("http://")
        consumer = ConsumerProcess(
            [
                *("--app", "examples.counter:Counter", "--etcd", cluster.etcd.endpoint),
                *("--root", ROOT, "--zone", "zone-a", "--id", "consumer-1", "--port", "0"),
                *("--broker", broker, "--lease-ttl", str(LEASE_TTL_S), "--drain-timeout", "5"),
            ],
            tmp_path / "consumer.log",
            env=database,
        )
        await consumer.start()
        try:
            async with ShardClient(consumer.endpoint) as shards:
                await shards.apply([shard_upsert(counter_shard(s)) for s in sorted(SHARDS)])
            client = cluster.client()
            async with AppendService(client) as appends:
                producers = Producers(rng, appends)
                for round_index in range(ROUNDS):
                    await producers.round(MESSAGES // ROUNDS)
                    await appends.flush()
                    await kill_at_a_random_point(consumer, producers, rng, round_index)
                    await consumer.start()
                ends = await producers.finish()
            produced_s = time.monotonic() - started
            for shard, sources in SHARDS.items():
                await stat_through(consumer, shard, {j: ends[j] for j in sources})
            # A graceful stop writes every ACK; a marker appended after it ends the output.
            assert await consumer.terminate() == 0
        finally:
            await consumer.kill()

        counts = committed_counts(database)
        assert counts == producers.expected
        async with AppendService(client) as appends:
            marker = await Publisher(appends).publish_committed(to(OUTPUT), Counted(key="end"))
            await marker
        derived = await read_derived(client, until_key="end")
        # Derived frames in the journal, read-uncommitted: re-runs of killed transactions
        # left theirs behind (rolled back by the restarted shard's recovery).
        raw = (await read_journal(client, OUTPUT)).splitlines()
        uncommitted = sum(1 for line in raw if b'"source":"' in line and b'"source":""' not in line)
        print(
            f"{producers.written} messages written ({producers.duplicates} duplicates, "
            f"{producers.rollbacks} rollbacks), {sum(counts.values())} counted, "
            f"{len(derived)} derived ({uncommitted - len(derived)} more rolled back); "
            f"{consumer.starts - 1} kills; "
            f"produced and consumed in {produced_s:.1f}s"
        )
        totals: dict[str, list[int]] = {}
        for message in derived:
            totals.setdefault(message.key, []).append(message.total)
        assert {key: sorted(values) for key, values in totals.items()} == {
            key: list(range(1, n + 1)) for key, n in producers.expected.items()
        }
        assert len({m.source for m in derived}) == len(derived) == sum(producers.expected.values())


async def kill_at_a_random_point(
    consumer: ConsumerProcess, producers: Producers, rng: random.Random, round_index: int
) -> None:
    shard = rng.choice(sorted(SHARDS))
    journal = rng.choice(SHARDS[shard])
    progress = await stat_through(consumer, shard)
    read = progress.read_through.get(journal, 0)
    head = producers.delivered.get(journal, 0)
    target = read + int(max(0, head - read) * rng.random())
    delay_s = rng.uniform(0.0, 0.25)
    print(f"kill {round_index + 1}: {shard} past {journal}@{target} (head {head}) +{delay_s:.3f}s")
    await stat_through(consumer, shard, {journal: target})
    await asyncio.sleep(delay_s)  # Where the kill lands; not a synchronisation.
    await consumer.kill()


async def read_derived(client: Any, *, until_key: str) -> list[Counted]:
    out: list[Counted] = []
    async with ReadCommittedIter(client, {OUTPUT: 0}, message_type=Counted) as it:
        async with asyncio.timeout(WAIT_S):
            while True:
                message: Counted = (await it.next()).message
                if message.key == until_key:
                    return out
                out.append(message)


# The embedded default: one `gazette-consumer serve --data-dir` process holds the keyspace, the
# broker and the consumer, and all three are killed together. Fewer messages and rounds: each
# restart also recovers the broker's spools and the keyspace.
EMBEDDED_MESSAGES = int(os.environ.get("GAZETTE_TEST_EO_EMBEDDED_MESSAGES", "20000"))
EMBEDDED_ROUNDS = 5
EMBEDDED_STORE = "file:///fragments/"  # Under --data-dir, the embedded broker's file root.


async def test_exactly_once_across_kill_9_of_the_embedded_process(tmp_path: Path) -> None:
    """Issue #12: a killed embedded process forgot its specs and the appends it acknowledged,
    then failed "writing recovered ACK intents" or wrote acknowledged offsets again. Now its
    keyspace and spools are durable under --data-dir: every restart continues exactly."""
    rng = random.Random(SEED + 1)
    print(f"seed {SEED + 1}")
    data_dir = tmp_path / "data"
    (data_dir / "fragments").mkdir(parents=True)
    env = {"COUNTER_DATA_DIR": str(data_dir / "db")}
    broker_port = free_port()
    consumer = ConsumerProcess(
        [
            *("--app", "examples.counter:Counter", "--data-dir", str(data_dir)),
            *("--root", ROOT, "--zone", "local", "--id", "consumer-1", "--port", "0"),
            *("--broker-port", str(broker_port), "--drain-timeout", "5"),
        ],
        tmp_path / "consumer.log",
        env=env,
    )
    await consumer.start()
    client = JournalClient(f"127.0.0.1:{broker_port}")
    try:
        journals = [j for sources in SHARDS.values() for j in sources] + [OUTPUT]
        await apply_journals(client, [upsert(json_journal(j, EMBEDDED_STORE)) for j in journals])
        async with ShardClient(consumer.endpoint) as shards:
            await shards.apply([shard_upsert(counter_shard(s)) for s in sorted(SHARDS)])
        async with AppendService(client) as appends:
            producers = Producers(rng, appends)
            for round_index in range(EMBEDDED_ROUNDS):
                await producers.round(EMBEDDED_MESSAGES // EMBEDDED_ROUNDS)
                await appends.flush()
                await kill_at_a_random_point(consumer, producers, rng, round_index)
                await consumer.start()  # Same --data-dir: nothing re-applied, nothing reset.
            ends = await producers.finish()
        for shard, sources in SHARDS.items():
            await stat_through(consumer, shard, {j: ends[j] for j in sources})
        counts = committed_counts(env)
        assert counts == producers.expected
        async with AppendService(client) as appends:
            marker = await Publisher(appends).publish_committed(to(OUTPUT), Counted(key="end"))
            await marker
        derived = await read_derived(client, until_key="end")
        print(
            f"{producers.written} messages written ({producers.duplicates} duplicates, "
            f"{producers.rollbacks} rollbacks), {sum(counts.values())} counted, "
            f"{len(derived)} derived; {consumer.starts - 1} kills of the embedded process"
        )
        totals: dict[str, list[int]] = {}
        for message in derived:
            totals.setdefault(message.key, []).append(message.total)
        assert {key: sorted(values) for key, values in totals.items()} == {
            key: list(range(1, n + 1)) for key, n in producers.expected.items()
        }
        assert len({m.source for m in derived}) == len(derived) == sum(producers.expected.values())
        assert await consumer.terminate() == 0
    finally:
        await client.close()
        await consumer.kill()
