"""A replica whose assignment left its member while it failed does not start over (found by
audit, 2026-11-29).

Two runners stand for two consumer processes sharing one SQLite database: A, the shard's
earlier primary (paused, its assignment moved to B meanwhile), and B, its successor. What etcd
says of each one's assignment is `ShardStart.still_assigned` (a consumer member asks etcd
itself: LocalShards._still_assigned); here the test decides it. A fails transiently when it
comes back (its application raises OperationalError, as a database connection killed while it
was paused does). Before: A started over, restored the shard (the fence went up), and B's next
commit was fenced: B FAILED for good, and once A's member stopped it nobody served the shard.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
import sqlalchemy.exc

from broker.client.append_service import AppendService
from broker.keyspace.embedded import EmbeddedStore
from broker.protocol import consumer_pb2 as cpb
from gazette_consumer.local_shards import LocalShards
from gazette_consumer.shard_handle import ShardRole, ShardStart
from gazette_consumer.shard_runner import ShardRetryPolicy, ShardRunner
from gazette_consumer.stores.sql import CHECKPOINTS_TABLE, create_sqlite_engine
from gazette_consumer.topology import new_keyspace, shard_key
from tests.gazette_consumer.shard_testkit import (
    CountingApp,
    Notifier,
    Producer,
    broker_env,
    prepare_engine,
    read_counts,
    shard_spec,
)

Code = cpb.ReplicaStatus.Code
RETRY = ShardRetryPolicy(initial_s=0.05, max_s=0.2, attempts_max=10)
SPEC = shard_spec("shard-z", ["in/z"])


class FlakyApp(CountingApp):
    """Fails transiently (as a database whose connection was killed) on "flaky" messages."""

    async def consume_message(self, shard: Any, store: Any, envelope: Any, publisher: Any) -> None:
        if envelope.message.text.startswith("flaky"):
            raise sqlalchemy.exc.OperationalError("SELECT 1", {}, Exception("connection killed"))
        await super().consume_message(shard, store, envelope, publisher)


async def _fence(engine: sa.Engine, fqn: str) -> int:
    with engine.connect() as connection:
        return int(
            connection.exec_driver_sql(
                f"SELECT fence FROM {CHECKPOINTS_TABLE} WHERE shard_fqn = ?", (fqn,)
            ).scalar_one()
        )


@dataclass
class TwoProcesses:
    """Runner A (its application fails transiently on "flaky" messages) and runner B, sharing
    one SQLite database and one source journal, with a producer of each kind of message."""

    runner_a: ShardRunner
    runner_b: ShardRunner
    engine_b: sa.Engine
    source: str
    fqn: str
    producer: Producer
    flaky: Producer
    changed: Notifier


@contextlib.asynccontextmanager
async def two_processes(tmp_path: Path) -> AsyncIterator[TwoProcesses]:
    engine_a = await prepare_engine(create_sqlite_engine(tmp_path / "shards.db"))
    engine_b = create_sqlite_engine(tmp_path / "shards.db")
    try:
        async with (
            broker_env() as env,
            AppendService(env.client) as appends,
            ShardRunner(FlakyApp(engine_a), env.client, root="/t", retry=RETRY) as runner_a,
            ShardRunner(CountingApp(engine_b), env.client, root="/t", retry=RETRY) as runner_b,
        ):
            yield TwoProcesses(
                runner_a,
                runner_b,
                engine_b,
                await env.journal("in/z"),
                runner_a.fqn(SPEC.id),
                Producer(appends, "ok"),
                Producer(appends, "flaky"),
                Notifier(),
            )
    finally:
        engine_a.dispose()
        engine_b.dispose()


async def test_a_zombie_that_fails_after_its_assignment_left_is_not_retried(
    tmp_path: Path,
) -> None:
    holder = {"member": "a"}

    async def held_by_a() -> bool:
        return holder["member"] == "a"

    async def held_by_b() -> bool:
        return holder["member"] == "b"

    async with two_processes(tmp_path) as t:
        source, changed = t.source, t.changed
        a = t.runner_a.start_shard(
            ShardStart(SPEC, ShardRole.PRIMARY, t.fqn, changed.notify, held_by_a)
        )
        end = (await (await t.producer.committed(source, "k"))).commit.end
        await changed.read_through(a, source, end)

        holder["member"] = "b"  # A's assignment moved to B while A was paused.
        b = t.runner_b.start_shard(
            ShardStart(SPEC, ShardRole.PRIMARY, t.fqn, changed.notify, held_by_b)
        )
        await changed.until(lambda: b.status().code == Code.PRIMARY)
        fence = await _fence(t.engine_b, t.fqn)

        await t.flaky.committed(source, "f")  # A fails on it (transiently), and B counts it.
        await changed.until(lambda: a.status().code == Code.FAILED)
        assert "the shard's assignment left this member: not retried" in a.status().errors[0]
        for _ in range(3):
            end = (await (await t.producer.committed(source, "k"))).commit.end
        await changed.read_through(b, source, end)
        assert b.status().code == Code.PRIMARY
        assert await _fence(t.engine_b, t.fqn) == fence  # A never restored again.
        assert await read_counts(t.engine_b, "shard-z") == {"k": 4, "f": 1}


async def test_a_replica_that_cannot_ask_etcd_fails_after_a_bound(tmp_path: Path) -> None:
    """etcd cannot be read (the check raises): the failed replica asks again after back-offs,
    at most the retry policy's attempts, then fails naming why, rather than restore the shard
    without knowing, or wait without end."""
    asked = 0

    async def unreachable() -> bool:
        nonlocal asked
        asked += 1
        raise ConnectionError("etcd unreachable")

    async with two_processes(tmp_path) as t:
        a = t.runner_a.start_shard(
            ShardStart(SPEC, ShardRole.PRIMARY, t.fqn, t.changed.notify, unreachable)
        )
        end = (await (await t.producer.committed(t.source, "k"))).commit.end
        await t.changed.read_through(a, t.source, end)
        await t.flaky.committed(t.source, "f")  # A fails on it (transiently).
        await t.changed.until(lambda: a.status().code == Code.FAILED)
        assert "etcd could not say whether this member still holds" in a.status().errors[0]
        assert asked == RETRY.attempts_max


async def test_a_member_asks_etcd_whether_it_still_holds_an_assignment() -> None:
    """LocalShards' check reads etcd itself: its mirror (not watching here: a paused process's)
    shows the assignment, and etcd says whether this member still holds it under that lease,
    in any slot (a promotion moves it to slot 0: found by review, a promoted standby that
    failed meanwhile was taken for a zombie)."""
    root, shard = "/consumers/zombie", "shard-z"
    backend = EmbeddedStore().connect()
    try:
        await backend.put(
            shard_key(root, shard).encode(), shard_spec(shard, ["in/z"]).SerializeToString()
        )
        lease, _ = await backend.lease_grant(60)
        successors_lease, _ = await backend.lease_grant(60)
        standby, primary = (
            f"{root}/assign/{shard}#zone-a#member-a#{slot}".encode() for slot in (1, 0)
        )
        status = cpb.ReplicaStatus(code=Code.STANDBY).SerializeToString()
        await backend.put(standby, status, lease=lease)
        ks = new_keyspace(root)
        await ks.load(backend)

        def refuse(start: ShardStart) -> Any:
            raise AssertionError("no shard is started here")

        local = LocalShards(ks, backend, root, "zone-a", "member-a", refuse)
        assert await local._still_assigned(shard)
        assert not await local._still_assigned("shard-other")
        await backend.delete(standby)  # Promoted (the mirror has not seen it): slot 0 now.
        await backend.put(primary, status, lease=lease)
        assert await local._still_assigned(shard)
        await backend.delete(primary)  # The assignment moved to another member.
        assert not await local._still_assigned(shard)
        await backend.put(primary, status, lease=successors_lease)  # A successor's, same name.
        assert not await local._still_assigned(shard)
    finally:
        await backend.close()
