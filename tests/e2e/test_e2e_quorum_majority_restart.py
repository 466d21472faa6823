"""After every member of a quorum journal was killed, a majority that comes back elects and
serves appends without waiting for the last member (docs/design/quorum.md, Remaining 2: nodes
start from the term register's ensemble, not only from a whole route), on real broker
processes over real etcd. The member still down catches up once it is back."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from e2e_workload import requires_etcd
from quorum_e2e_kit import LEASE_TTL_S, Journal, quorum_cluster

from broker.testing.process_cluster import ProcessCluster

pytestmark = [pytest.mark.etcd, requires_etcd]

JOURNAL = "quorum/majority"


@pytest.fixture
async def cluster() -> AsyncIterator[ProcessCluster]:
    async with quorum_cluster(JOURNAL) as c:
        yield c


async def test_a_majority_elects_while_a_member_stays_down(cluster: ProcessCluster) -> None:
    journal = Journal(cluster, JOURNAL)
    await journal.append_round("before")
    leader = journal.leader
    assert leader is not None
    for b in cluster.brokers:
        await cluster.kill(b)
    back = journal.others(leader)  # the leader stays down
    for b in back:
        await cluster.start_broker(b)
    first_took = await journal.append_round("majority")
    assert first_took < LEASE_TTL_S + 3, first_took
    await journal.check_every_member(back)
    await cluster.start_broker(leader)
    await journal.append_round("all")
    await journal.check_every_member()
