"""Zombie fencing across consumer processes: two processes both believe they are the primary of
one shard; only the newer commits, and the older one's shard fails on its next commit.

Two ``gazette-consumer serve`` processes of the counting example share the shard's SQL store
(one SQLite file, or one PostgreSQL database) and the broker, but not their etcd: each has an
etcd server of its own, so each assigns the shard to itself, as two sides of a partition (or a
primary whose lease expired unnoticed) would. The shard's FQN (``<root>/items/<id>``) is the
same in both, so both restore the same checkpoint row.

1. The older process (A) counts a first batch and commits it.
2. The newer process (B) starts: its restore increments the fence, and recovers A's checkpoint.
3. A second batch: A's next commit fails with FencedError, and its shard reports FAILED with
   the error (seen through ``gazctl shards list`` and in A's log); B commits the batch.
4. The counts are exact (the first batch once, the second once, from B); a read-committed
   reader of the derived journal reads each derived message once: A's uncommitted ones of the
   second batch were never acknowledged.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from e2e_workload import apply_json_journals, gazctl, requires_etcd
from google.protobuf.duration_pb2 import Duration

from broker.client.append_service import AppendService
from broker.client.async_append import AsyncAppend
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import protocol_pb2 as pb
from broker.testing.etcd_server import EtcdServer
from broker.testing.process_cluster import ProcessCluster
from examples.counter import Count, Counted, read_counts
from gazette_consumer.message import CONTENT_TYPE_JSON_LINES, Partition, Publisher
from gazette_consumer.sequencer.read_iter import ReadCommittedIter
from gazette_consumer.shard_client import ShardClient
from gazette_consumer.shard_client import upsert as shard_upsert
from tests.gazette_consumer.consumer_testkit import ConsumerProcess, stat_through
from tests.gazette_consumer.shard_testkit import pg_engine

pytestmark = [pytest.mark.etcd, requires_etcd]

ROOT = "/gazette/consumers/e2e-zombie"
SHARD = "zombie-000"
SOURCE = "zombie/in"
OUTPUT = "zombie/out"
BATCH = 200
KEYS = ("red", "green", "blue")
WAIT_S = 60.0


@pytest.fixture(params=["sqlite", "postgres"])
async def database(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[dict[str, str]]:
    if request.param == "sqlite":
        yield {"COUNTER_DATA_DIR": str(tmp_path / "db")}
        return
    async with pg_engine(request.getfixturevalue("pg_url")) as engine:
        yield {"COUNTER_DB_URL": engine.url.render_as_string(hide_password=False)}


def counts_of(env: dict[str, str]) -> dict[str, int]:
    if "COUNTER_DB_URL" in env:
        engine = sa.create_engine(env["COUNTER_DB_URL"])
    else:
        engine = sa.create_engine(f"sqlite:///{Path(env['COUNTER_DATA_DIR'], SHARD)}.sqlite")
    try:
        return read_counts(engine, SHARD)
    finally:
        engine.dispose()


def shard_spec() -> cpb.ShardSpec:
    return cpb.ShardSpec(
        id=SHARD,
        sources=[cpb.ShardSpec.Source(journal=SOURCE)],
        max_txn_duration=Duration(nanos=200_000_000),
        labels=pb.LabelSet(labels=[pb.Label(name="counter.example/output", value=OUTPUT)]),
    )


def gazctl_list(consumer: ConsumerProcess) -> list[dict[str, str]]:
    address = consumer.endpoint.removeprefix("http://")
    done = gazctl(
        "shards", "list", "--format", "json", env={"CONSUMER_ADDRESS": address}, timeout_s=WAIT_S
    )
    assert done.returncode == 0, done.stderr
    records: list[dict[str, str]] = json.loads(done.stdout)
    return records


async def shard_failed(consumer: ConsumerProcess) -> cpb.ReplicaStatus:
    """The shard's replica status at ``consumer`` once it is FAILED. Polled, bounded: there is
    no event to wait on across processes for a status change."""
    deadline = time.monotonic() + WAIT_S
    async with ShardClient(consumer.endpoint) as client:
        while True:
            listed = await client.list_shards()
            statuses = [status for shard in listed.shards for status in shard.status]
            failed = [s for s in statuses if s.code == cpb.ReplicaStatus.FAILED]
            if failed:
                return failed[0]
            assert time.monotonic() < deadline, f"not failed: {listed}"
            await asyncio.sleep(0.1)


async def test_the_newer_primary_fences_the_older_process(
    database: dict[str, str], tmp_path: Path
) -> None:
    async with (
        ProcessCluster([("zone-a", "broker-a1")], lease_ttl_s=3) as cluster,
        EtcdServer(tmp_path / "etcd-b") as etcd_b,
    ):
        await apply_json_journals(cluster, [SOURCE, OUTPUT])
        broker = cluster.brokers[0].endpoint.removeprefix("http://")

        def consumer(name: str, etcd: str) -> ConsumerProcess:
            return ConsumerProcess(
                [
                    *("--app", "examples.counter:Counter", "--etcd", etcd, "--root", ROOT),
                    *("--zone", "zone-a", "--id", name, "--port", "0", "--broker", broker),
                    *("--drain-timeout", "1"),
                ],
                tmp_path / f"{name}.log",
                env=database,
            )

        older = consumer("consumer-a", cluster.etcd.endpoint)
        newer = consumer("consumer-b", etcd_b.endpoint)
        client = cluster.client()
        expected: Counter[str] = Counter()
        try:
            async with AppendService(client) as appends:
                publisher: Publisher[AsyncAppend] = Publisher(appends)
                source = Partition(SOURCE, CONTENT_TYPE_JSON_LINES)

                async def batch(tag: str) -> int:
                    last = None
                    for i in range(BATCH):
                        key = KEYS[i % len(KEYS)]
                        last = await publisher.publish_committed(lambda _m: source, Count(key=key))
                        expected[key] += 1
                    assert last is not None
                    return (await last).commit.end

                await older.start()
                async with ShardClient(older.endpoint) as shards:
                    await shards.apply([shard_upsert(shard_spec())])
                first_end = await batch("first")
                await stat_through(older, SHARD, {SOURCE: first_end})
                assert counts_of(database) == dict(expected)

                # The newer primary: its own etcd, the same shard FQN and store.
                await newer.start()
                async with ShardClient(newer.endpoint) as shards:
                    await shards.apply([shard_upsert(shard_spec())])
                await stat_through(newer, SHARD, {SOURCE: first_end})
                assert counts_of(database) == dict(expected)  # Recovered, not re-counted.

                second_end = await batch("second")
                await stat_through(newer, SHARD, {SOURCE: second_end})
                status = await shard_failed(older)
            assert any("FencedError" in error for error in status.errors), status
            assert any("fence is no longer" in error for error in status.errors), status
            listed = gazctl_list(older)
            assert [r["status"] for r in listed] == ["FAILED"], listed
            assert "shard failed" in (log := (tmp_path / "consumer-a.log").read_text())
            assert "FencedError" in log
            # Exact counts. (The counter writes absolute totals, which the older would have
            # computed alike: the derived stream below is what shows it never committed.)
            assert counts_of(database) == dict(expected)
            assert await newer.terminate() == 0
        finally:
            await older.kill()
            await newer.kill()

        async with AppendService(client) as appends:
            marker = Publisher[AsyncAppend](appends).publish_committed(
                lambda _m: Partition(OUTPUT, CONTENT_TYPE_JSON_LINES), Counted(key="end")
            )
            await (await marker)
        derived: list[Counted] = []
        async with ReadCommittedIter(client, {OUTPUT: 0}, message_type=Counted) as it:
            async with asyncio.timeout(WAIT_S):
                while (message := (await it.next()).message).key != "end":
                    derived.append(message)
        # Had the older committed the second batch, its ACKs would have been written and its
        # derived messages (the same totals again) would be read here too.
        totals: dict[str, list[int]] = {}
        for m in derived:
            totals.setdefault(m.key, []).append(m.total)
        assert {k: sorted(v) for k, v in totals.items()} == {
            k: list(range(1, n + 1)) for k, n in expected.items()
        }
