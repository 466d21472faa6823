"""A quorum node and its broker's replica of the journal come and go apart (journals.py: a
broker the term register names runs the node whether or not the journal is assigned to it):
the applier (apply.py) applies committed content to whichever replica the broker has now, and
a Read served by that replica sees every acknowledged append. Three in-process brokers on the
embedded keyspace, memory spools and no fragment store (so a replica holds only what its own
applier gave it), assignments written as the allocator writes them.
"""

from __future__ import annotations

from broker_testkit import Cluster

from broker.protocol import protocol_pb2 as pb
from broker.server import Broker
from tests.broker.quorum.quorum_brokers_testkit import (
    append_until_ok,
    broker_name,
    create_quorum_journal,
    term_record,
    until,
)

J = "quorum/replica-lifecycle"
wait_s = 30.0


async def _append(cluster: Cluster, via: Broker, data: bytes) -> pb.AppendResponse:
    return await append_until_ok(cluster, via, J, data, wait_s)


async def _read_here(cluster: Cluster, broker: Broker) -> tuple[bytes, int]:
    """A non-blocking Read of the whole journal served by `broker` itself (not proxied): the
    content and the highest write head it reported."""
    content, head = bytearray(), -1
    request = pb.ReadRequest(journal=J, offset=0, block=False, do_not_proxy=True)
    async for resp in cluster.stub(broker).Read(request):
        if resp.HasField("header"):  # served here, not proxied
            assert resp.header.process_id.suffix == broker.config.suffix, resp.header
        if not resp.content:
            head = max(head, resp.write_head)
        content += resp.content
    return bytes(content), head


async def _three_brokers(cluster: Cluster) -> tuple[Broker, Broker, Broker]:
    """Three brokers and the journal on them, elected and settled: (leader, x, y)."""
    brokers = [await cluster.start_broker(f"zone-{i}", f"broker-{i}") for i in range(3)]
    await create_quorum_journal(cluster, J, brokers)
    await _append(cluster, brokers[0], b"first\n")
    await until(
        "the register settled with a leader",
        lambda: (r := term_record(brokers[0], J)) is not None and bool(r.leader) and r.settled,
    )
    record = term_record(brokers[0], J)
    assert record is not None
    leader = next(b for b in brokers if broker_name(b) == record.leader)
    x, y = (b for b in brokers if b is not leader)
    return leader, x, y


async def test_a_replica_replaced_under_a_running_node_serves_what_was_committed(
    cluster: Cluster,
) -> None:
    """X's replica is taken away (its node stays: the register names X) and given back with
    no append in between. The new replica's spool starts empty; a Read through X must still
    serve every acknowledged byte. Before, the applier counted what it had applied to the
    previous replica's spool as applied: the read barrier passed at once and X answered an
    empty journal (write head 0) until the next commit."""
    leader, x, y = await _three_brokers(cluster)
    resp = await _append(cluster, leader, b"second\n")
    end = resp.commit.end
    await until("X applied both appends", lambda: x.quorum.appliers[J].applied >= end)
    before = x.resolver.replicas[J]

    await cluster.assign(J, [leader, y])  # X's replica stops; its node is kept
    assert J not in x.resolver.replicas and J in x.quorum.kept
    await cluster.assign(J, [leader, x, y])  # and comes back, new, with nothing committed since
    after = x.resolver.replicas.get(J)
    assert after is not None and after is not before

    content, head = await _read_here(cluster, x)
    assert content == b"first\nsecond\n"
    assert head >= end


async def test_content_committed_while_there_is_no_replica_is_served_once_one_starts(
    cluster: Cluster,
) -> None:
    """X's replica is taken away (its node stays, and acknowledges as a member), an append
    commits, and X's replica comes back with no append after it. The resolver's signal that
    it started a replica (`replica_started`) is what brings X's applier to it: there is no
    other trigger, and a Read through X serves the append at once. Before, the applier looked
    for the replica every 0.1 s (`replica_wait_poll_s`); with that poll made long, the read
    barrier gave up (UNAVAILABLE after read_index_wait_s)."""
    leader, x, y = await _three_brokers(cluster)
    await cluster.assign(J, [leader, y])
    assert J not in x.resolver.replicas and J in x.quorum.kept
    resp = await _append(cluster, leader, b"while X had no replica\n")
    end = resp.commit.end
    node = x.quorum.nodes[J]
    await until("X's node knows the commit", lambda: node.commit_offset >= end)

    await cluster.assign(J, [leader, x, y])
    assert J in x.resolver.replicas
    content, head = await _read_here(cluster, x)
    assert content == b"first\nwhile X had no replica\n"
    assert head >= end
