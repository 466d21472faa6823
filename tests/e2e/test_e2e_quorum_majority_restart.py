"""After every member of a quorum journal was killed, a majority that comes back elects and
serves appends without waiting for the last member (docs/design/quorum.md, Remaining 2: nodes
start from the term register's ensemble, not only from a whole route), on real broker
processes over real etcd. The member still down catches up once it is back."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from e2e_workload import journal_spec, requires_etcd
from quorum_e2e_kit import Journal

from broker.protocol import labels as gl
from broker.protocol.labels import label_set
from broker.testing.process_cluster import ProcessCluster

pytestmark = [pytest.mark.etcd, requires_etcd]

JOURNAL = "quorum/majority"
LEASE_TTL_S = 3
THREE_BROKERS = [("zone-a", "broker-a1"), ("zone-a", "broker-a2"), ("zone-b", "broker-b1")]


@pytest.fixture
async def cluster() -> AsyncIterator[ProcessCluster]:
    async with ProcessCluster(THREE_BROKERS, lease_ttl_s=LEASE_TTL_S) as c:
        spec = journal_spec(JOURNAL, 3, c.store_url)
        spec.labels.CopyFrom(label_set([(gl.REPLICATION_MODE, gl.REPLICATION_MODE_QUORUM)]))
        await c.apply([spec])
        await c.wait_until(c.journals_ready([JOURNAL], 3, zones_min=2))
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
