"""Registers on a quorum journal, through real in-process brokers and the Append RPC: the same
semantics and statuses as an all-replicas journal (check, union, subtract; REGISTER_MISMATCH
with the journal's registers; a register update needs content), and every member's spool ends
with the committed registers."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from broker_testkit import Cluster, journal_spec, replica_of

from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set
from broker.protocol.limits import labels_per_set_max
from broker.server import Broker

wait_s = 15.0
OWNER_A = label_set([("owner", "a")])
OWNER_B = label_set([("owner", "b")])


async def _leader_of(brokers: list[Broker], journal: str) -> Broker:
    async with asyncio.timeout(wait_s):
        while True:
            for broker in brokers:
                node = broker.quorum.nodes.get(journal)
                if node is not None and node.is_leader and node.coordinator.leader:
                    return broker
                if node is not None:
                    node.progress.clear()
            nodes = [b.quorum.nodes[journal] for b in brokers if journal in b.quorum.nodes]
            waits = [asyncio.ensure_future(n.progress.wait()) for n in nodes]
            try:
                await asyncio.wait(waits, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()


async def test_registers_check_union_and_subtract_on_a_quorum_journal(cluster: Cluster) -> None:
    brokers = [await cluster.start_broker(f"zone-{i}", f"broker-{i}") for i in range(3)]
    spec = journal_spec("quorum/registers", replication=3)
    spec.labels.CopyFrom(label_set([(gl.REPLICATION_MODE, gl.REPLICATION_MODE_QUORUM)]))
    await cluster.create(spec, brokers)
    leader = await _leader_of(brokers, spec.name)
    j = spec.name

    # Empty registers match any check (Gazette's rule); a union sets them.
    first = await cluster.append(
        leader,
        j,
        [b"a"],
        check_registers=pb.LabelSelector(include=OWNER_B),
        union_registers=OWNER_A,
    )
    assert first.status == pb.OK, pb.Status.Name(first.status)
    assert first.registers == OWNER_A and (first.commit.begin, first.commit.end) == (0, 1)

    # A failed check: REGISTER_MISMATCH with the journal's registers, nothing appended.
    refused = await cluster.append(
        leader, j, [b"nope"], check_registers=pb.LabelSelector(include=OWNER_B)
    )
    assert refused.status == pb.REGISTER_MISMATCH and refused.registers == OWNER_A
    excluded = await cluster.append(
        leader, j, [b"nope"], check_registers=pb.LabelSelector(exclude=OWNER_A)
    )
    assert excluded.status == pb.REGISTER_MISMATCH

    # A compare-and-swap: check a, subtract a, union b.
    swapped = await cluster.append(
        leader,
        j,
        [b"b"],
        check_registers=pb.LabelSelector(include=OWNER_A),
        subtract_registers=OWNER_A,
        union_registers=OWNER_B,
    )
    assert swapped.status == pb.OK and swapped.registers == OWNER_B
    assert (swapped.commit.begin, swapped.commit.end) == (1, 2)

    # Bad input changes nothing: an update without content, registers over their bound.
    with pytest.raises(grpc.aio.AioRpcError) as empty:
        await cluster.append(leader, j, [], union_registers=OWNER_A)
    assert empty.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    too_many = label_set([(f"r{i:03d}", "x") for i in range(labels_per_set_max)])
    with pytest.raises(grpc.aio.AioRpcError) as over:
        await cluster.append(leader, j, [b"x"], union_registers=too_many)
    assert over.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "labels_per_set_max" in (over.value.details() or "")
    plain = await cluster.append(leader, j, [b"c"])
    assert plain.status == pb.OK and plain.registers == OWNER_B and plain.commit.begin == 2

    # Every member applies the committed registers to its spool with the content.
    for broker in brokers:
        applier = broker.quorum.appliers[j]
        async with asyncio.timeout(wait_s):
            while applier.applied < plain.commit.end:
                applier.changed.clear()
                await applier.changed.wait()
        assert applier.error is None
        spool = await replica_of(broker, j).spool_slot.take(asyncio.Event())
        try:
            assert spool.registers == OWNER_B
        finally:
            replica_of(broker, j).spool_slot.put(spool)
