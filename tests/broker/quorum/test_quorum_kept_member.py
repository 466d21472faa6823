"""A broker the term register names in its ensemble runs its member's node, assigned or not
(docs/design/quorum.md, "Built (branch f-quorum)"), across its restarts too: the ensemble's
quorum counts its vote. Three in-process brokers with data directories on the embedded
keyspace; assignments written as the allocator writes them.

The allocator takes X's replica away and has no broker to put it on yet (the route is not
whole, so no ensemble change is wanted: the register keeps {L, X, Y}, settled). X's node
stays, and comes back when X's broker restarts; then L's broker stops, and Y and X elect and
commit. Before, X's node stopped with its assignment (and a kept node did not come back after
a restart): Y alone, one of three, could never elect again.
"""

from __future__ import annotations

from pathlib import Path

from broker_testkit import ROOT, Cluster

from broker.protocol import protocol_pb2 as pb
from broker.quorum_shell.node import QuorumNode
from broker.quorum_shell.status import journal_status
from broker.server import Broker
from tests.broker.quorum.quorum_brokers_testkit import (
    append_until_ok,
    broker_name,
    create_quorum_journal,
    start_broker,
    start_brokers,
    term_record,
    until,
)

J = "quorum/kept"
# Bound of each wait (an election takes one or two 1-s election timeouts).
wait_s = 30.0


async def _append(cluster: Cluster, via: Broker, data: bytes) -> pb.AppendResponse:
    return await append_until_ok(cluster, via, J, data, wait_s)


async def test_a_member_named_by_the_register_keeps_its_node_unassigned_and_restarted(
    cluster: Cluster, tmp_path: Path
) -> None:
    brokers = await start_brokers(cluster, tmp_path, 3)
    await create_quorum_journal(cluster, J, brokers)
    first = await _append(cluster, brokers[0], b"before\n")
    await until(
        "the register settled with a leader",
        lambda: (r := term_record(brokers[0], J)) is not None and bool(r.leader) and r.settled,
    )
    settled = term_record(brokers[0], J)
    assert settled is not None
    index = {broker_name(b): i for i, b in enumerate(brokers)}
    leader = brokers[index[settled.leader]]
    x, y = (b for b in brokers if b is not leader)

    # X's replica taken away, none added yet: the register keeps naming X.
    await cluster.assign(J, [leader, y])
    assert J not in x.resolver.replicas
    await until(f"{broker_name(x)} keeps its node", lambda: J in x.quorum.nodes)
    assert J in x.quorum.kept
    status = journal_status(x.ks, ROOT, J, x.quorum.nodes[J])
    assert status.member == broker_name(x) and status.kept

    # X's broker restarts: its node comes back (the register still names X, settled).
    i_x = index[broker_name(x)]
    await cluster.stop_broker(x)
    x = brokers[i_x] = await start_broker(cluster, tmp_path, i_x)
    await until(f"{broker_name(x)}'s node is back after its restart", lambda: J in x.quorum.nodes)
    assert J in x.quorum.kept
    record = term_record(x, J)
    assert record is not None and record.ensemble == settled.ensemble and record.settled

    # L's broker stops: Y and X are two of three, and elect.
    await cluster.stop_broker(leader)
    resp = await _append(cluster, y, b"after\n")
    assert resp.commit.begin == first.commit.end
    record = term_record(y, J)
    assert record is not None and record.term > settled.term
    assert record.leader in (broker_name(x), broker_name(y)) and record.ensemble == settled.ensemble
    for b in (x, y):
        node = b.quorum.nodes[J]

        def knows_commit(n: QuorumNode = node) -> bool:
            return n.commit_offset >= resp.commit.end

        await until(f"{broker_name(b)} knows the commit", knows_commit)
        assert node.read_committed(0) == b"before\nafter\n"
