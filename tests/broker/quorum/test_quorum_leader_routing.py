"""A quorum journal's leader as the primary clients are told, through real in-process brokers:
response headers (Append, Read, ListFragments) and List routes name the term's leader while the
assignments keep advertising the allocator's route; an append sent to any other broker (a
follower, a broker outside the route) is proxied to the leader and succeeds in one RPC from the
client's view (with `do_not_proxy` it is redirected); after the leader is lost, headers and
proxies follow the new one.

The leader is never the allocator's slot 0 here, by construction: the route's slot 0 is the
member whose name sorts last, and an election among members with equal logs chooses the first
name among the majority that answered (rules.choose_leader), which is never the last of three.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from broker_testkit import ROOT, Cluster, header_of_another_cluster, journal_spec, wait_until

from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set
from broker.quorum_shell.leader_route import register_leader
from broker.server import Broker
from broker.topology import assignment_of, format_id, journal_assignments

wait_s = 15.0


def _name(broker: Broker) -> str:
    return f"{broker.config.zone}#{broker.config.suffix}"


def _primary(route: pb.Route) -> str:
    return format_id(route.members[route.primary]) if route.primary >= 0 else ""


async def _leader(brokers: list[Broker], journal: str) -> Broker:
    """The broker whose node leads `journal` once the term register names it too (the
    mirror every broker routes by), waiting on the nodes' progress (bounded)."""
    async with asyncio.timeout(wait_s):
        while True:
            for broker in brokers:
                node = broker.quorum.nodes.get(journal)
                if node is not None and node.is_leader and node.coordinator.leader == node.name:
                    await wait_until(lambda n=node.name: _told(brokers[0], journal) == n, wait_s)
                    return broker
            nodes = [b.quorum.nodes[journal] for b in brokers if journal in b.quorum.nodes]
            for n in nodes:
                n.progress.clear()
            waits = [asyncio.ensure_future(n.progress.wait()) for n in nodes]
            try:
                await asyncio.wait(waits, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()


def _told(broker: Broker, journal: str) -> str:
    """The leader the broker's mirror (term register) names, "" if none."""
    term = register_leader(broker.ks, ROOT, journal, 0)
    return term.record.leader if term is not None else ""


async def _quorum_journal(cluster: Cluster, name: str, route: list[Broker]) -> str:
    spec = journal_spec(name, replication=3)
    spec.labels.CopyFrom(label_set([(gl.REPLICATION_MODE, gl.REPLICATION_MODE_QUORUM)]))
    await cluster.create(spec, route)
    return spec.name


async def _read_header(cluster: Cluster, broker: Broker, journal: str) -> pb.Header:
    call = cluster.stub(broker).Read(pb.ReadRequest(journal=journal, offset=0, block=False))
    async for resp in call:
        call.cancel()
        return resp.header
    raise AssertionError("no Read response")


async def _list_route(cluster: Cluster, broker: Broker, journal: str) -> pb.Route:
    selector = pb.LabelSelector(include=label_set([(gl.META_NAME, journal)]))
    async for resp in cluster.stub(broker).List(pb.ListRequest(selector=selector)):
        for j in resp.journals:
            if j.spec.name == journal:
                return j.route
    raise AssertionError(f"{journal} not listed")


async def _fragments_header(cluster: Cluster, broker: Broker, journal: str) -> pb.Header:
    resp = await cluster.stub(broker).ListFragments(pb.FragmentsRequest(journal=journal))
    assert resp.status == pb.OK, pb.Status.Name(resp.status)
    return resp.header


def _advertised_primaries(broker: Broker, journal: str) -> set[str]:
    routes = [assignment_of(e).route for e in journal_assignments(broker.ks, ROOT, journal)]
    return {_primary(r) if r is not None else "" for r in routes}


async def test_headers_name_the_leader_and_assignments_keep_the_allocators_route(
    cluster: Cluster,
) -> None:
    b0, b1, b2 = [await cluster.start_broker(f"zone-{i}", f"broker-{i}") for i in range(3)]
    outsider = await cluster.start_broker("zone-3", "broker-3")
    j = await _quorum_journal(cluster, "routing/headers", [b2, b0, b1])
    leader = await _leader([b0, b1, b2], j)
    assert leader is not b2  # see the module docstring

    for broker in (b0, b1, b2, outsider):
        assert _primary((await _read_header(cluster, broker, j)).route) == _name(leader)
        assert _primary(await _list_route(cluster, broker, j)) == _name(leader)
        assert _primary((await _fragments_header(cluster, broker, j)).route) == _name(leader)
    # The pulse still advertises the allocator's route, slot 0 as primary: what readiness and
    # the allocator compare.
    await wait_until(lambda: _advertised_primaries(b0, j) == {_name(b2)}, wait_s)


async def test_a_first_append_to_any_broker_is_proxied_to_the_leader(cluster: Cluster) -> None:
    b0, b1, b2 = [await cluster.start_broker(f"zone-{i}", f"broker-{i}") for i in range(3)]
    outsider = await cluster.start_broker("zone-3", "broker-3")
    j = await _quorum_journal(cluster, "routing/proxy", [b2, b0, b1])
    leader = await _leader([b0, b1, b2], j)
    follower = next(b for b in (b0, b1, b2) if b is not leader)

    # One RPC from the client's view: OK, committed, the header naming the leader.
    end = 0
    for broker, data in ((follower, b"via follower;"), (outsider, b"via outsider;")):
        resp = await cluster.append(broker, j, [data])
        assert resp.status == pb.OK, pb.Status.Name(resp.status)
        assert (resp.commit.begin, resp.commit.end) == (end, end + len(data))
        assert _primary(resp.header.route) == _name(leader)
        assert format_id(resp.header.process_id) == _name(leader)
        end += len(data)
    # A client that asks not to be proxied is redirected, and nothing is appended.
    redirected = await cluster.append(follower, j, [b"not here"], do_not_proxy=True)
    assert redirected.status == pb.NOT_JOURNAL_PRIMARY_BROKER
    assert _primary(redirected.header.route) == _name(leader)
    # A request a broker proxied (it carries that broker's header) is never proxied again:
    # were two brokers to disagree on the leader, it would bounce between them.
    hop = pb.Header()
    hop.CopyFrom(resp.header)
    hop.process_id.CopyFrom(
        pb.ProcessSpec.ID(zone=follower.config.zone, suffix=follower.config.suffix)
    )
    bounced = await cluster.append(follower, j, [b"not again"], header=hop)
    assert bounced.status == pb.NOT_JOURNAL_PRIMARY_BROKER
    # And a proxied request from another cluster is refused, appending nothing.
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await cluster.append(leader, j, [b"foreign"], header=header_of_another_cluster(resp.header))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "cluster ID" in (refused.value.details() or "")
    assert leader.quorum.nodes[j].read_committed() == b"via follower;via outsider;"


async def test_a_leader_change_is_followed(cluster: Cluster) -> None:
    brokers = [await cluster.start_broker(f"zone-{i}", f"broker-{i}") for i in range(3)]
    b0, b1, b2 = brokers
    j = await _quorum_journal(cluster, "routing/change", [b2, b0, b1])
    leader = await _leader(brokers, j)
    first = await cluster.append(b2, j, [b"before;"])
    assert first.status == pb.OK and _primary(first.header.route) == _name(leader)
    # Every survivor holds the entry, so the next election ties on logs (module docstring).
    for broker in brokers:
        applier = broker.quorum.appliers[j]
        async with asyncio.timeout(wait_s):
            while applier.applied < first.commit.end:
                applier.changed.clear()
                await applier.changed.wait()

    await cluster.stop_broker(leader)
    survivors = [b for b in brokers if b is not leader]
    new = await _leader(survivors, j)
    assert new is not leader and new is not b2
    assert _primary((await _read_header(cluster, b2, j)).route) == _name(new)
    assert _primary(await _list_route(cluster, b2, j)) == _name(new)
    # b2 is the allocator's primary of the route that is left, and not the leader: its
    # append is proxied to the new leader.
    second = await cluster.append(b2, j, [b"after"])
    assert second.status == pb.OK, pb.Status.Name(second.status)
    assert (second.commit.begin, second.commit.end) == (7, 12)
    assert _primary(second.header.route) == _name(new)
