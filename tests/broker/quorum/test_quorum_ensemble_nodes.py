"""Ensemble changes on quorum nodes as brokers host them (loopback gRPC, data directories,
the term register in an embedded keyspace): a node started by a broker outside the
register's ensemble (the allocator moved a replica to it) does not depose the leader, and
a replacement wanted by the route completes: the new member holds every byte and counts."""

from __future__ import annotations

from broker.quorum.coordinator import CoordState
from tests.broker.quorum.quorum_nodes_testkit import NAMES, Cluster, append_all

MOVED = ("m1", "m2", "m3")  # m0's replica moved to m3
# Leader timeout 1.5 s, plus up to as much jitter: two of them without a new term.
quiet_ms = 6000


async def test_a_node_outside_the_ensemble_does_not_depose_the_leader(
    quorum_nodes: Cluster,
) -> None:
    c = quorum_nodes
    for name in NAMES:
        await c.start(name)
    expected = bytearray()
    await append_all(c, "a", 3, expected)
    # The allocator assigned m3 with the route it sees; no one wants a change.
    m3 = await c.start("m3", ensemble=MOVED)
    start = m3.now()
    await c.until(lambda: m3.now() > start + quiet_ms, "m3 ran two leader timeouts")
    assert m3.coordinator.state is CoordState.MONITORING
    # m3 claimed no term (before: one every leader timeout, each deposing the leader). The
    # members may still elect on their own (a starved machine delays heartbeats): not m3's.
    assert m3.coordinator.terms_claimed == 0, "m3 deposed the leader"
    await append_all(c, "b", 2, expected)


async def test_a_replaced_member_is_caught_up_and_counts(quorum_nodes: Cluster) -> None:
    c = quorum_nodes
    for name in NAMES:
        await c.start(name)
    expected = bytearray()
    await append_all(c, "a", 5, expected)
    # m0's broker is gone for good; the allocator moved its replica to m3: every broker now
    # sees the whole route m1, m2, m3 (QuorumJournals.observe sets `wanted` from it).
    await c.kill("m0")
    await c.start("m3", ensemble=MOVED)
    for n in c.live.values():
        n.node.wanted = MOVED

    def moved() -> bool:
        leader = c.leader()
        if leader is None:
            return False
        record = leader.coordinator.record
        return (
            record is not None
            and record.ensemble == MOVED
            and record.settled
            and leader.member.term == record.term
        )

    await c.until(moved, "the register settled on m1, m2, m3")
    await append_all(c, "b", 3, expected)
    m3 = c.live["m3"].node
    await c.until(lambda: m3.commit_offset >= len(expected), "m3 knows the commit")
    assert m3.read_committed(0) == bytes(expected)  # every byte, from m3's own log
    # A second original member stops: m3 must count for a majority of m1, m2, m3.
    leader = c.leader()
    assert leader is not None
    victim = "m1" if leader.name != "m1" else "m2"
    await c.kill(victim)
    await append_all(c, "c", 3, expected)  # with m0 and the victim down: the leader and m3
    await c.until(lambda: m3.commit_offset >= len(expected), "m3 knows the last commit")
    assert m3.read_committed(0) == bytes(expected)
