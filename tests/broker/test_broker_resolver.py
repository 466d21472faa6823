"""The resolver: statuses, headers, waiting for revisions, and the life of local replicas."""

from __future__ import annotations

import asyncio

import pytest
from broker_testkit import Cluster, journal_spec, replica_of

from broker.protocol import protocol_pb2 as pb
from broker.resolver import ResolveError, ResolverStoppedError
from broker.topology import make_header

J = "res/journal"


async def test_resolution_statuses_and_headers(cluster: Cluster) -> None:
    a = await cluster.start_broker("zone-a", "broker-a", pulse_enabled=False)
    b = await cluster.start_broker("zone-b", "broker-b", pulse_enabled=False)
    c = await cluster.start_broker("zone-c", "broker-c", pulse_enabled=False)
    await cluster.create(journal_spec(J, replication=2), [a, b])

    res = await c.resolver.resolve(J, require_primary=True, may_proxy=True)
    assert res.status == pb.OK and res.header.process_id == a.id and res.replica is None
    assert list(res.header.route.endpoints) == [a.endpoint, b.endpoint]
    assert res.header.etcd.revision == c.ks.header.revision

    res = await c.resolver.resolve(J, require_primary=True, may_proxy=False)
    assert res.status == pb.NOT_JOURNAL_PRIMARY_BROKER and res.header.process_id == c.id
    res = await c.resolver.resolve(J, require_primary=False, may_proxy=False)
    assert res.status == pb.NOT_JOURNAL_BROKER
    res = await b.resolver.resolve(J, require_primary=False, may_proxy=False)
    assert res.status == pb.OK and res.is_local and res.replica is replica_of(b, J)
    res = await a.resolver.resolve(J + ";meta", require_primary=True, may_proxy=False)
    assert res.status == pb.OK and res.journal == J

    res = await a.resolver.resolve("no/such/journal", require_primary=True, may_proxy=True)
    assert res.status == pb.JOURNAL_NOT_FOUND
    await cluster.put_spec(journal_spec("other/journal"))
    await cluster.assign("other/journal", [])
    res = await a.resolver.resolve("other/journal", require_primary=True, may_proxy=True)
    assert res.status == pb.NO_JOURNAL_PRIMARY_BROKER
    res = await a.resolver.resolve("other/journal", require_primary=False, may_proxy=True)
    assert res.status == pb.INSUFFICIENT_JOURNAL_BROKERS

    suspended = journal_spec(J, replication=2)
    suspended.suspend.level = pb.JournalSpec.Suspend.FULL
    await cluster.sync(await cluster.put_spec(suspended))
    res = await a.resolver.resolve(J, require_primary=True, may_proxy=True)
    assert res.status == pb.SUSPENDED


async def test_resolve_waits_for_a_revision_within_its_bound(cluster: Cluster) -> None:
    a = await cluster.start_broker("zone-a", "broker-a", revision_wait_s=0.05)
    await cluster.create(journal_spec(J), [a])
    with pytest.raises(TimeoutError):
        await a.resolver.resolve(
            J, require_primary=True, may_proxy=True, min_revision=a.ks.header.revision + 100
        )


async def test_proxied_requests_must_be_for_us_and_our_cluster(cluster: Cluster) -> None:
    a = await cluster.start_broker("zone-a", "broker-a")
    b = await cluster.start_broker("zone-b", "broker-b")
    await cluster.create(journal_spec(J), [a])
    res = await b.resolver.resolve(J, require_primary=True, may_proxy=True)

    # The header a proxying broker attaches: addressed to the primary.
    res_a = await a.resolver.resolve(
        J, require_primary=True, may_proxy=False, proxy_header=res.header
    )
    assert res_a.status == pb.OK

    wrong_member = make_header(b.id, res.header.route, res.header.etcd)
    with pytest.raises(ResolveError, match="not us"):
        await a.resolver.resolve(
            J, require_primary=True, may_proxy=False, proxy_header=wrong_member
        )
    other_cluster = make_header(a.id, res.header.route, res.header.etcd)
    other_cluster.etcd.cluster_id = 1234
    with pytest.raises(ResolveError, match="cluster ID"):
        await a.resolver.resolve(
            J, require_primary=True, may_proxy=False, proxy_header=other_cluster
        )


async def test_local_replicas_follow_assignments(cluster: Cluster) -> None:
    a = await cluster.start_broker("zone-a", "broker-a", pulse_enabled=False)
    b = await cluster.start_broker("zone-b", "broker-b", pulse_enabled=False)
    await cluster.create(journal_spec(J, replication=2), [a])
    assert set(a.resolver.replicas) == {J} and b.resolver.replicas == {}
    replica = replica_of(a, J)

    res = await a.resolver.resolve(J, require_primary=True, may_proxy=False)
    assert not res.invalidated.is_set()
    await cluster.assign(J, [a, b])
    # Same replica, but resolutions made before the change are invalidated.
    assert replica_of(a, J) is replica and res.invalidated.is_set()
    assert set(b.resolver.replicas) == {J}

    await cluster.assign(J, [b])
    assert a.resolver.replicas == {} and replica.stopping
    await replica.wait_stopped()


async def test_stopped_resolver_refuses_to_resolve_locally(cluster: Cluster) -> None:
    a = await cluster.start_broker("zone-a", "broker-a", pulse_enabled=False)
    await cluster.create(journal_spec(J), [a])
    replica = replica_of(a, J)
    a.resolver.stop_serving()
    await replica.wait_stopped()
    with pytest.raises(ResolverStoppedError):
        await a.resolver.resolve(J, require_primary=True, may_proxy=False)


async def test_a_replica_leaving_the_route_ends_its_replication_stream(cluster: Cluster) -> None:
    a = await cluster.start_broker("zone-a", "broker-a", pulse_enabled=False)
    b = await cluster.start_broker("zone-b", "broker-b", pulse_enabled=False, shutdown_wait_s=30)
    await cluster.create(journal_spec(J, replication=2), [a, b])
    assert (await cluster.append(a, J, [b"x"])).status == pb.OK
    leaving = replica_of(b, J)
    assert not leaving.spool_slot.available()  # Held by the primary's Replicate stream.

    await cluster.put_spec(journal_spec(J, replication=1))
    await cluster.assign(J, [a])
    # The stream gives the spool back at once; the shutdown does not wait out its bound.
    async with asyncio.timeout(10):
        await leaving.wait_stopped()
    resp = await cluster.append(a, J, [b"y"])
    assert (resp.status, resp.commit.begin) == (pb.OK, 1)


async def test_a_journal_is_routed_once_per_revision_and_again_when_it_moves(
    cluster: Cluster,
) -> None:
    a = await cluster.start_broker("zone-a", "broker-a", pulse_enabled=False)
    b = await cluster.start_broker("zone-b", "broker-b", pulse_enabled=False)
    await cluster.create(journal_spec(J, replication=2), [a])
    first = await b.resolver.resolve(J, require_primary=True, may_proxy=True)
    again = await b.resolver.resolve(J, require_primary=False, may_proxy=True)
    # At one revision, the route is read from the mirror once and shared, read-only; each
    # resolution has its own header and status.
    assert again.route is first.route and again.header is not first.header
    assert (first.status, again.status) == (pb.OK, pb.OK)
    assert list(first.header.route.members) == [a.id]

    await cluster.assign(J, [b, a])  # Every broker sees it before this returns.
    moved = await b.resolver.resolve(J, require_primary=True, may_proxy=True)
    assert moved.route is not first.route
    assert list(moved.header.route.members) == [a.id, b.id]
    assert moved.header.process_id == b.id and moved.is_local
    assert moved.header.etcd.revision > first.header.etcd.revision
