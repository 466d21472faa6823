"""A quorum journal's members killed (-9) and restarted on their data directories, on real
broker processes over real etcd (issue #16's "restart members in any order"): every member's
log file is replayed, so no acknowledged append is lost, no offset is written twice, every
member serves exactly the acknowledged content, and a new leader serves appends within the
lease TTL + 3 s once the route is whole again.

Nodes start only with a whole route (quorum_shell/journals.py), so "in any order" is the order
the processes come back; the protocol then re-elects from the replayed logs.

The case an in-memory log loses (test_follower_restart_then_leader_loss): a follower is down
while appends commit on the two others; one of those two restarts, then the leader is killed.
Only logs that survived the kills still hold those appends (with the in-memory log of part two
the next append lands at offset 0)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest
from e2e_workload import requires_etcd
from quorum_e2e_kit import LEASE_TTL_S, Journal, quorum_cluster

from broker.testing.process_cluster import BrokerProcess, ProcessCluster

pytestmark = [pytest.mark.etcd, requires_etcd]

JOURNAL = "quorum/restart"


@pytest.fixture
async def cluster() -> AsyncIterator[ProcessCluster]:
    async with quorum_cluster(JOURNAL) as c:
        yield c


async def _restart_in_order(cluster: ProcessCluster, order: Sequence[BrokerProcess]) -> float:
    """Start the (killed) brokers one after the other; the time the last one served."""
    for b in order:
        await cluster.start_broker(b)
    return asyncio.get_running_loop().time()


@pytest.mark.parametrize("order", ["leader-first", "leader-last"])
async def test_all_members_killed_and_restarted(cluster: ProcessCluster, order: str) -> None:
    journal = Journal(cluster, JOURNAL)
    await journal.append_round("before")
    leader = journal.leader
    assert leader is not None
    for b in cluster.brokers:
        await cluster.kill(b)  # kill -9, all three: logs, spools and etcd remain.
    followers = journal.others(leader)
    sequence = [leader, *followers] if order == "leader-first" else [*followers, leader]
    whole_at = await _restart_in_order(cluster, sequence)
    first_took = await journal.append_round("after")
    # A new leader serves within the lease TTL + 3 s of the route being whole again.
    assert first_took < LEASE_TTL_S + 3, (first_took, whole_at)
    await journal.check_every_member()


async def test_follower_restart_then_leader_loss(cluster: ProcessCluster) -> None:
    journal = Journal(cluster, JOURNAL)
    await journal.append_round("all-up")
    leader = journal.leader
    assert leader is not None
    down, restarted = journal.others(leader)
    await cluster.kill(down)
    # Committed by the leader and `restarted` alone.
    await journal.append_round("two-up")
    await cluster.restart(restarted)  # kill -9 and start: it must come back with its log.
    await cluster.kill(leader)  # The leader is lost (kill -9).
    # Only `restarted` and the (stopped) leader hold the two-up appends (`down` never had
    # them); `down` and the leader come back, and any majority that elects includes one of
    # the two holders: their logs must have survived the kill. (A lost disk:
    # test_e2e_quorum_lost_disk.py.)
    await cluster.start_broker(down)
    await cluster.start_broker(leader)
    first_took = await journal.append_round("after")
    assert first_took < LEASE_TTL_S + 3, first_took
    await journal.check_every_member()
