"""Consumer members end to end over the embedded keyspace (and one test on a real etcd): the
allocator places primaries and hot standbys on distinct members, replicas advertise their
statuses, a lost member's primaries are promoted elsewhere, a draining member hands off, and a
failing shard is visible and restartable without disturbing the others."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from broker.allocator import MemberNotFoundError
from broker.keyspace.backend import Backend, LeaseNotFoundError
from broker.keyspace.embedded import EmbeddedStore
from broker.protocol import consumer_pb2 as cpb
from gazette_consumer.shard_handle import ShardHandle, ShardRole, ShardStart
from gazette_consumer.shard_runner import ShardRunner
from gazette_consumer.topology import lookup_member
from tests.gazette_consumer.consumer_testkit import (
    ROOT,
    FakeShard,
    Group,
    codes,
    primary_and_standbys,
    shard_spec,
)
from tests.gazette_consumer.shard_testkit import CountingApp, Producer, shard_env

SHARDS = [f"shard-{i:03d}" for i in range(6)]
READ_THROUGH = "gazette_consumer_shard_read_through_bytes"
TRANSACTIONS = "gazette_consumer_shard_transactions_total"


@pytest.fixture
async def group() -> AsyncIterator[Group]:
    g = await Group.open()
    try:
        yield g
    finally:
        await g.close()


async def two_members_with_standbys(group: Group) -> None:
    await group.join("zone-a", "consumer-a")
    await group.join("zone-b", "consumer-b")
    for shard in SHARDS:
        await group.put_shard(shard_spec(shard, hot_standbys=1))
    await group.until(primary_and_standbys(group, SHARDS, standbys=1))


async def test_each_shard_gets_a_primary_and_a_standby_on_different_members(group: Group) -> None:
    await two_members_with_standbys(group)
    # The replicas the members run match the assignments: the role, the FQN, once each.
    for node in group.nodes:
        me = (node.member.config.zone, node.member.config.suffix)
        for shard, assignments in group.assignments().items():
            [mine] = [a for a in assignments if (a.zone, a.suffix) == me]
            fake = node.shards.running(shard)
            assert fake.role is (ShardRole.PRIMARY if mine.slot == 0 else ShardRole.STANDBY)
            assert fake.fqn == f"{ROOT}/items/{shard}"
        assert len(node.shards.started) == len(SHARDS)
    # Primaries are spread: each member leads half.
    primaries = [a.suffix for g in group.assignments().values() for a in g if a.slot == 0]
    assert sorted(primaries.count(s) for s in {"consumer-a", "consumer-b"}) == [3, 3]


async def test_a_revoked_member_fails_and_its_primaries_are_promoted(group: Group) -> None:
    await two_members_with_standbys(group)
    a, b = group.nodes
    led_by_a = {
        s
        for s, g in group.assignments().items()
        for x in g
        if x.slot == 0 and x.suffix == "consumer-a"
    }
    assert len(led_by_a) == 3

    await group.admin.lease_revoke(a.member.lease_id)
    # A finds its key gone and fails, stopping every replica it ran.
    with pytest.raises(BaseExceptionGroup) as failed:
        async with asyncio.timeout(30):
            await a.member.wait()
    assert failed.group_contains(MemberNotFoundError) or failed.group_contains(LeaseNotFoundError)
    assert all(fake.stopped.is_set() for fake in a.shards.started)
    group.nodes.remove(a)  # Its failure is expected from here on.

    def b_leads_all() -> str | None:
        for shard, g in group.assignments().items():
            if [(x.suffix, x.slot, x.status.code) for x in g] != [
                ("consumer-b", 0, cpb.ReplicaStatus.PRIMARY)
            ]:
                return f"{shard}: {codes(g)}"
        return None

    await group.until(b_leads_all)
    # B's standbys of A's shards were promoted in place, not restarted.
    for shard in led_by_a:
        fake = b.shards.running(shard)
        assert fake.promoted
    assert len(b.shards.started) == len(SHARDS)
    await a.member.backend.close()


async def test_an_expired_lease_promotes_the_standbys() -> None:
    now = [1000.0]
    store = EmbeddedStore(clock=lambda: now[0])

    async def connect() -> Backend:
        return store.connect()

    group = await Group.open(connect)
    try:
        await two_members_with_standbys(group)
        a, b = group.nodes
        # A crashes: its tasks end without revoking its lease, so its keys stay until the
        # lease expires. Time passes in two steps, B refreshing its lease in between (as its
        # keep-alive would), so only A's lease runs out.
        await a.member.abort()
        group.nodes.remove(a)
        assert lookup_member(group.ks, ROOT, "zone-a", "consumer-a") is not None
        now[0] += 15.0
        await group.admin.lease_keepalive_once(b.member.lease_id)
        now[0] += 10.0
        store.expire_leases()
        await group.until(
            lambda: (
                None
                if all(
                    [(x.suffix, x.slot, x.status.code) for x in g]
                    == [("consumer-b", 0, cpb.ReplicaStatus.PRIMARY)]
                    for g in group.assignments().values()
                )
                and len(group.assignments()) == len(SHARDS)
                else str({s: codes(g) for s, g in group.assignments().items()})
            )
        )
        assert lookup_member(group.ks, ROOT, "zone-a", "consumer-a") is None
        await a.member.backend.close()
    finally:
        await group.close()


async def test_graceful_stop_hands_every_shard_off(group: Group) -> None:
    """A draining member keeps each replica until another member's is ready to replace it
    (the allocator never leaves a shard with fewer consistent replicas than it wants), so a
    third member must be there to take over: with as many members as replicas, a drain can
    only time out (see ConsumerConfig.drain_timeout_s)."""
    await two_members_with_standbys(group)
    a, b = group.nodes
    c = await group.join("zone-c", "consumer-c")
    led_by_a = {
        s
        for s, g in group.assignments().items()
        for x in g
        if x.slot == 0 and x.suffix == "consumer-a"
    }
    async with asyncio.timeout(30):
        await a.member.stop()
    group.nodes.remove(a)
    await a.member.backend.close()
    # A drained before it stopped: every shard is led and backed up by B and C, the shards A
    # led were promoted in place (not restarted), and nothing of A remains.
    assert all(fake.stopped.is_set() for fake in a.shards.started)
    # (The allocator may still be packing slots: B and C converge on their own.)
    await group.until(primary_and_standbys(group, SHARDS, standbys=1))
    assert {x.suffix for g in group.assignments().values() for x in g} == {
        "consumer-b",
        "consumer-c",
    }
    promoted = {f.spec.id for n in (b, c) for f in n.shards.started if f.promoted}
    assert promoted == led_by_a


async def test_a_standby_is_only_consistent_once_ready(group: Group) -> None:
    """A held (BACKFILL) standby does not count: the draining primary stays until it is
    ready, then hands off."""
    a = await group.join("zone-a", "consumer-a")
    await group.put_shard(shard_spec("shard-solo"))
    await group.until(primary_and_standbys(group, ["shard-solo"], standbys=0))
    b = await group.join("zone-b", "consumer-b", hold=True)

    drain = asyncio.create_task(a.member.drain())
    await group.until(
        lambda: (
            None
            if {x.suffix: x.status.code for x in group.assignments()["shard-solo"]}
            == {"consumer-a": cpb.ReplicaStatus.PRIMARY, "consumer-b": cpb.ReplicaStatus.BACKFILL}
            else str(codes(group.assignments()["shard-solo"]))
        )
    )
    assert not drain.done()
    b.shards.running("shard-solo").ready()
    async with asyncio.timeout(30):
        assert await drain
    await group.until(
        lambda: (
            None
            if [(x.suffix, x.slot) for x in group.assignments()["shard-solo"]]
            == [("consumer-b", 0)]
            else str(codes(group.assignments()["shard-solo"]))
        )
    )
    assert b.shards.running("shard-solo").promoted


async def test_a_failed_shard_is_advertised_and_restarts_after_unassign(group: Group) -> None:
    node = await group.join("zone-a", "consumer-a")
    for shard in ("shard-ok", "shard-bad"):
        await group.put_shard(shard_spec(shard))
    await group.until(primary_and_standbys(group, ["shard-ok", "shard-bad"], standbys=0))

    node.shards.running("shard-bad").fail("ValueError: consume_message: bad input")
    await group.until(
        lambda: (
            None
            if group.assignments()["shard-bad"][0].status.code == cpb.ReplicaStatus.FAILED
            else str(codes(group.assignments()["shard-bad"]))
        )
    )
    [bad] = group.assignments()["shard-bad"]
    assert list(bad.status.errors) == ["ValueError: consume_message: bad input"]
    assert group.assignments()["shard-ok"][0].status.code == cpb.ReplicaStatus.PRIMARY

    # Unassigning the failed replica (what `gazctl shards unassign --failed` does) makes the
    # allocator assign it afresh: a new replica starts; the healthy shard is untouched.
    [entry] = [e for e in group.ks.search(f"{ROOT}/assign/shard-bad#")]
    await group.admin.delete(entry.kv.key)
    await group.until(primary_and_standbys(group, ["shard-ok", "shard-bad"], standbys=0))
    started = [f.spec.id for f in node.shards.started]
    assert started.count("shard-bad") == 2 and started.count("shard-ok") == 1


async def test_a_start_shard_that_raises_fails_only_its_shard(group: Group) -> None:
    started: list[str] = []

    def start(start: ShardStart) -> ShardHandle:
        started.append(start.spec.id)
        raise RuntimeError(f"cannot build a store for {start.spec.id}")

    # The factory of this member breaks; the member must stay up and report the shard FAILED.
    node = await group.join("zone-a", "consumer-a", start_shard=start)
    await group.put_shard(shard_spec("shard-x"))
    await group.until(
        lambda: (
            None
            if group.assignments().get("shard-x")
            and group.assignments()["shard-x"][0].status.code == cpb.ReplicaStatus.FAILED
            else str(codes(group.assignments().get("shard-x", [])))
        )
    )
    [a] = group.assignments()["shard-x"]
    assert list(a.status.errors) == ["RuntimeError: cannot build a store for shard-x"]
    assert started == ["shard-x"]
    assert node.member.failure is None


async def test_disabling_a_shard_stops_its_replicas_and_drops_its_metrics(
    group: Group, tmp_path: Path
) -> None:
    read_through = {"shard": "shard-d", "journal": "in/d"}

    async def primary_read(runner: ShardRunner, end: int) -> None:
        """Until the shard's primary has read in/d through `end`."""
        await group.until(primary_and_standbys(group, ["shard-d"], standbys=0))
        primary = runner.shard("shard-d").primary
        assert primary is not None
        async with asyncio.timeout(30):
            await primary.wait_until(lambda p: p.progress().read_through.get("in/d", 0) >= end)

    async with shard_env(tmp_path) as (env, engine, appends):
        await env.journal("in/d")
        producer = Producer(appends, "p")
        async with ShardRunner(CountingApp(engine), env.client, root=ROOT) as runner:
            await group.join("zone-a", "consumer-a", start_shard=runner.start_shard)
            spec = shard_spec("shard-d", sources=("in/d",))
            await group.put_shard(spec)
            end = (await (await producer.committed("in/d", "k"))).commit.end
            await primary_read(runner, end)
            assert REGISTRY.get_sample_value(READ_THROUGH, read_through) == end

            spec.disable = True
            await group.put_shard(spec)
            await group.until(lambda: None if not group.assignments() else str(group.assignments()))
            async with asyncio.timeout(30):
                await runner.shard("shard-d").wait_stopped()
            # Gone from the process: its series are no longer exported.
            assert REGISTRY.get_sample_value(READ_THROUGH, read_through) is None
            assert REGISTRY.get_sample_value(TRANSACTIONS, {"shard": "shard-d"}) is None

            # Back in the process: it records and exports again, its series started afresh.
            spec.disable = False
            await group.put_shard(spec)
            end = (await (await producer.committed("in/d", "k"))).commit.end
            await primary_read(runner, end)
            assert REGISTRY.get_sample_value(READ_THROUGH, read_through) == end
            assert REGISTRY.get_sample_value(TRANSACTIONS, {"shard": "shard-d"}) == 1


@pytest.mark.etcd
async def test_primaries_and_standbys_on_real_etcd() -> None:
    if shutil.which("etcd") is None:
        pytest.skip("etcd not installed: run `make system-deps`")
    from broker.keyspace.etcd import EtcdBackend
    from broker.testing.etcd_server import EtcdServer

    async with EtcdServer() as server:

        async def connect() -> Backend:
            return EtcdBackend([server.endpoint], dial_timeout_s=5, request_timeout_s=5)

        group = await Group.open(connect)
        try:
            await two_members_with_standbys(group)
            a = group.nodes[0]
            await group.admin.lease_revoke(a.member.lease_id)
            with pytest.raises(BaseExceptionGroup):
                async with asyncio.timeout(30):
                    await a.member.wait()
            group.nodes.remove(a)
            await group.until(
                lambda: (
                    None
                    if all(
                        [(x.suffix, x.status.code) for x in g]
                        == [("consumer-b", cpb.ReplicaStatus.PRIMARY)]
                        for g in group.assignments().values()
                    )
                    else "not yet"
                )
            )
            await a.member.backend.close()
        finally:
            await group.close()


class BrokenShard(FakeShard):
    """A replica whose promotion and stop raise (a shard runner bug)."""

    def promote(self) -> None:
        raise RuntimeError("promote is broken")

    async def stop(self) -> None:
        self.stopped.set()
        raise RuntimeError("stop is broken")


async def test_a_replica_that_breaks_on_promotion_fails_alone(group: Group) -> None:
    broken: list[BrokenShard] = []

    def start(start: ShardStart) -> ShardHandle:
        broken.append(BrokenShard(start))
        return broken[-1]

    a = await group.join("zone-a", "consumer-a")
    await group.join("zone-b", "consumer-b", start_shard=start)
    for shard in ("shard-1", "shard-2"):
        await group.put_shard(shard_spec(shard, hot_standbys=1))
    await group.until(primary_and_standbys(group, ["shard-1", "shard-2"], standbys=1))
    standbys_on_b = {f.spec.id for f in broken if f.role is ShardRole.STANDBY}
    assert standbys_on_b

    # A goes (without draining): B's standbys are promoted, and B's broken promote() fails
    # just those shards, visibly; B itself keeps running.
    await a.member.stop(graceful=False)
    group.nodes.remove(a)
    await a.member.backend.close()

    def promoted_ones_failed() -> str | None:
        failed = {
            s
            for s, g in group.assignments().items()
            for x in g
            if x.slot == 0 and x.status.code == cpb.ReplicaStatus.FAILED
        }
        return (
            None
            if failed == standbys_on_b
            else str({s: codes(g) for s, g in group.assignments().items()})
        )

    await group.until(promoted_ones_failed)
    [x] = [x for x in group.assignments()[sorted(standbys_on_b)[0]] if x.slot == 0]
    assert list(x.status.errors) == ["RuntimeError: promote is broken"]

    # Unassigning the failed replica stops it (its stop() raises: logged, not fatal) and the
    # allocator assigns the shard afresh, as primary this time.
    shard = x.shard
    [entry] = [e for e in group.ks.search(f"{ROOT}/assign/{shard}#")]
    await group.admin.delete(entry.kv.key)
    await group.until(
        lambda: (
            None
            if [(y.slot, y.status.code) for y in group.assignments().get(shard, [])]
            == [(0, cpb.ReplicaStatus.PRIMARY)]
            else str(codes(group.assignments().get(shard, [])))
        )
    )
    assert [f.spec.id for f in broken].count(shard) == 2
    assert group.nodes[0].member.failure is None


async def test_a_drain_with_nowhere_to_go_times_out_and_keeps_every_replica(group: Group) -> None:
    """With as many members as replicas, handing off would leave shards short of ready
    replicas: the drain gives up after drain_timeout_s, and nothing was taken away."""
    a = await group.join("zone-a", "consumer-a", drain_timeout_s=0.5)
    await group.join("zone-b", "consumer-b")
    for shard in SHARDS[:2]:
        await group.put_shard(shard_spec(shard, hot_standbys=1))
    await group.until(primary_and_standbys(group, SHARDS[:2], standbys=1))
    assert await a.member.drain() is False
    check = primary_and_standbys(group, SHARDS[:2], standbys=1)
    assert check() is None, check()
    assert not any(f.stopped.is_set() for f in a.shards.started)


async def test_a_draining_member_announces_itself_exiting(group: Group) -> None:
    """As Gazette's (ConsumerSpec.exiting, SetExiting): a draining member marks its spec
    exiting, keeping its shard limit, and is assigned no new shard."""
    a = await group.join("zone-a", "consumer-a")
    await group.put_shard(shard_spec("shard-solo"))
    await group.until(primary_and_standbys(group, ["shard-solo"], standbys=0))
    b = await group.join("zone-b", "consumer-b", hold=True)

    drain = asyncio.create_task(a.member.drain())

    def exiting() -> str | None:
        member = lookup_member(group.ks, ROOT, "zone-a", "consumer-a")
        return None if member is not None and member.spec.exiting else "not yet exiting"

    await group.until(exiting)
    member = lookup_member(group.ks, ROOT, "zone-a", "consumer-a")
    assert member is not None and member.spec.shard_limit == a.member.config.shard_limit
    # A shard created now goes to B alone.
    await group.put_shard(shard_spec("shard-new"))
    await group.until(
        lambda: (
            None
            if [x.suffix for x in group.assignments().get("shard-new", [])] == ["consumer-b"]
            else str(group.assignments().get("shard-new"))
        )
    )
    b.shards.running("shard-solo").ready()
    async with asyncio.timeout(30):
        assert await drain
    assert all(x.suffix == "consumer-b" for g in group.assignments().values() for x in g)
