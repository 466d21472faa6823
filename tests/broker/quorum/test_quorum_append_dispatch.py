"""Appends by replication mode, through real in-process brokers: a journal without the label
or labelled all-replicas takes Gazette's path unchanged; a quorum journal is served by its
quorum nodes: appends commit at the term's leader, other members proxy (or redirect) to it."""

from __future__ import annotations

import asyncio
import hashlib

import grpc
import pytest
from broker_testkit import ROOT, Cluster, journal_spec, local_content

from broker.fragment.naming import sum_from_digest
from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set
from broker.quorum.errors import NotLeaderError
from broker.server import Broker
from broker.topology import assignment_key, item_key

wait_s = 15.0


@pytest.mark.parametrize("mode", [None, gl.REPLICATION_MODE_ALL_REPLICAS])
async def test_all_replicas_journals_append_and_replicate(
    cluster: Cluster, mode: str | None
) -> None:
    brokers = [await cluster.start_broker(f"zone-{i}", f"broker-{i}") for i in range(3)]
    spec = journal_spec("mode/journal", replication=3)
    if mode is not None:
        spec.labels.CopyFrom(label_set([(gl.REPLICATION_MODE, mode)]))
    await cluster.create(spec, brokers)
    first = await cluster.append(brokers[1], spec.name, [b"hello, ", b"world"])
    second = await cluster.append(brokers[0], spec.name, [b"!"])
    assert first.status == second.status == pb.OK
    assert (first.commit.begin, first.commit.end, second.commit.end) == (0, 12, 13)
    for broker in brokers:
        assert local_content(broker, spec.name) == (0, b"hello, world!")


async def _leader_of(brokers: list[Broker], journal: str) -> Broker:
    """The broker whose quorum node leads `journal`, once one does (waits on the nodes'
    progress events, bounded)."""
    async with asyncio.timeout(wait_s):
        while True:
            nodes = [b.quorum.nodes.get(journal) for b in brokers]
            for broker, node in zip(brokers, nodes, strict=True):
                if node is not None and node.is_leader and node.coordinator.leader:
                    return broker
            # The nodes start as the brokers see the assignments, which create() waited for.
            live = [n.progress for n in nodes if n is not None]
            assert len(live) == len(brokers)
            for event in live:
                event.clear()
            waits = [asyncio.ensure_future(e.wait()) for e in live]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()


async def test_quorum_journal_appends_commit_at_the_leader(cluster: Cluster) -> None:
    brokers = [await cluster.start_broker(f"zone-{i}", f"broker-{i}") for i in range(3)]
    spec = journal_spec("mode/quorum", replication=3)
    spec.labels.CopyFrom(label_set([(gl.REPLICATION_MODE, gl.REPLICATION_MODE_QUORUM)]))
    await cluster.create(spec, brokers)
    leader = await _leader_of(brokers, spec.name)

    first = await cluster.append(leader, spec.name, [b"hello, ", b"quorum"])
    second = await cluster.append(leader, spec.name, [b"!"])
    assert first.status == second.status == pb.OK
    assert (first.commit.begin, first.commit.end, second.commit.end) == (0, 13, 14)
    assert first.commit.sum == sum_from_digest(hashlib.sha1(b"hello, quorum").digest())
    members = [f"{m.zone}#{m.suffix}" for m in first.header.route.members]
    leader_id = f"{leader.config.zone}#{leader.config.suffix}"
    assert members[first.header.route.primary] == leader_id

    # Another member redirects a client that asks not to be proxied to the leader, appending
    # nothing (test_quorum_leader_routing.py: otherwise it proxies).
    other = next(b for b in brokers if b is not leader)
    redirected = await cluster.append(other, spec.name, [b"not here"], do_not_proxy=True)
    assert redirected.status == pb.NOT_JOURNAL_PRIMARY_BROKER
    assert members[redirected.header.route.primary] == leader_id

    # A stream without the commit marker appends nothing.
    with pytest.raises(grpc.aio.AioRpcError, match="without the empty commit chunk"):
        await cluster.append(leader, spec.name, [b"torn"], commit=False)
    third = await cluster.append(leader, spec.name, [b"?"])
    assert (third.commit.begin, third.commit.end) == (14, 15)
    node = leader.quorum.nodes[spec.name]
    assert node.read_committed() == b"hello, quorum!?"
    # Every member applies what it knows committed to its spool: its local fragments, and
    # the Read RPC it serves, hold exactly the committed content.
    for broker in brokers:
        applier = broker.quorum.appliers[spec.name]
        async with asyncio.timeout(wait_s):
            while applier.applied < third.commit.end:
                applier.changed.clear()
                await applier.changed.wait()
        assert applier.error is None
        assert local_content(broker, spec.name) == (0, b"hello, quorum!?")
        assert await _read(cluster, broker, spec.name) == b"hello, quorum!?"


async def _read(cluster: Cluster, broker: Broker, journal: str) -> bytes:
    """The journal's content as `broker` serves it from offset 0, without blocking."""
    out = bytearray()
    call = cluster.stub(broker).Read(pb.ReadRequest(journal=journal, offset=0, block=False))
    async for resp in call:
        if resp.status == pb.OFFSET_NOT_YET_AVAILABLE:
            break
        assert resp.status == pb.OK, pb.Status.Name(resp.status)
        out += resp.content
    return bytes(out)


async def test_a_node_stays_while_the_register_names_it_and_stops_after(
    cluster: Cluster,
) -> None:
    """The allocator takes a replica from a broker: its node stays while the term register
    names its member (the ensemble's quorum counts it), and stops once the leader has moved
    the ensemble to the allocator's route (the replica's new broker added, it removed)."""
    brokers = [await cluster.start_broker(f"zone-{i}", f"broker-{i}") for i in range(4)]
    spec = journal_spec("mode/moving", replication=3)
    spec.labels.CopyFrom(label_set([(gl.REPLICATION_MODE, gl.REPLICATION_MODE_QUORUM)]))
    await cluster.create(spec, brokers[:3])
    leader = await _leader_of(brokers[:3], spec.name)
    assert (await cluster.append(leader, spec.name, [b"kept"])).status == pb.OK
    leaving = next(b for b in brokers[:3] if b is not leader)
    node = leaving.quorum.nodes[spec.name]
    # The route shrinks (no successor yet: no ensemble change is wanted): the leaving
    # broker's node stays, kept for the register.
    slot = brokers.index(leaving)
    key = assignment_key(ROOT, spec.name, leaving.config.zone, leaving.config.suffix, slot)
    header, deleted = await cluster.admin.delete(key.encode())
    assert deleted == 1
    await cluster.sync(header.revision)
    assert leaving.quorum.nodes[spec.name] is node and spec.name in leaving.quorum.kept
    resp = await cluster.append(leader, spec.name, [b"+more"])
    assert resp.status == pb.OK and resp.commit.begin == 4
    # The successor is assigned: the leader adds it, then removes the leaving member, whose
    # node stops once the register no longer names it.
    stay = [b for b in brokers[:3] if b is not leaving]
    await cluster.assign(spec.name, [*stay, brokers[3]])
    async with asyncio.timeout(wait_s):
        assert node._loop_task is not None
        await asyncio.gather(node._loop_task, return_exceptions=True)  # Stopped: cancelled.
    assert spec.name not in leaving.quorum.nodes
    resp = await cluster.append(stay[0], spec.name, [b"!"])
    assert resp.status == pb.OK and resp.commit.begin == 9


async def test_an_append_whose_node_stopped_meanwhile_is_refused_as_not_leader(
    cluster: Cluster,
) -> None:
    """An Append RPC resolves the journal's node, then reads the client's content; if the node
    stops meanwhile (the soak's quorum-leader-zombie found it: the broker lost the journal
    while it was stopped; here its spec is deleted, which stops every node of it at once),
    committing must refuse it as not the leader (the client retries against the route), not
    fail with a bare KeyError (grpc's UNKNOWN "Unexpected KeyError", which a recorder takes as
    final: its shard FAILED)."""
    brokers = [await cluster.start_broker(f"zone-{i}", f"broker-{i}") for i in range(3)]
    spec = journal_spec("mode/stopped", replication=3)
    spec.labels.CopyFrom(label_set([(gl.REPLICATION_MODE, gl.REPLICATION_MODE_QUORUM)]))
    await cluster.create(spec, brokers)
    leader = await _leader_of(brokers, spec.name)
    assert (await cluster.append(leader, spec.name, [b"kept"])).status == pb.OK
    header, deleted = await cluster.admin.delete(item_key(ROOT, spec.name).encode())
    assert deleted == 1
    await cluster.sync(header.revision)
    assert spec.name not in leader.quorum.nodes
    # The step after the content is read, with the node gone.
    with pytest.raises(NotLeaderError):
        await leader.quorum.append(spec.name, b"late", spec.fragment.compression_codec)
