"""kill -9 of a `gazette serve` process on a real etcd: once its lease expires, every journal it
served regains three consistent replicas (over both zones) and a primary, every byte appended
before the kill reads back, and appends succeed again."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
from e2e_workload import (
    FOUR_BROKERS,
    Writers,
    by_journal,
    count_duplicates,
    journals_and_victim,
    read_journal,
    record,
    requires_etcd,
)

from broker.client.appender import append
from broker.protocol import protocol_pb2 as pb
from broker.testing.process_cluster import ProcessCluster

pytestmark = [pytest.mark.etcd, requires_etcd]

LEASE_TTL_S = 3
# Lease expiry plus re-allocation and re-synchronisation: seconds, with room for loaded cores.
recovery_bound_s = 30.0


@pytest.fixture
async def cluster() -> AsyncIterator[ProcessCluster]:
    async with ProcessCluster(FOUR_BROKERS, lease_ttl_s=LEASE_TTL_S) as c:
        yield c


async def test_killed_broker_journals_regain_replicas_and_keep_their_bytes(
    cluster: ProcessCluster,
) -> None:
    names = [f"crash/journal-{i}" for i in range(8)]
    # The victim is the primary of the most journals; clients talk to another broker.
    victim, held, client = await journals_and_victim(cluster, names)
    writers = Writers(client, names, count=4)
    writers.start()
    await writers.wait_for(200)
    await writers.stop()
    assert writers.failed == []
    before_kill = list(writers.committed)

    await cluster.kill(victim)
    killed_at = time.monotonic()
    # Until the lease expires the journals still name the victim; then they move.
    await cluster.wait_until(cluster.member_gone(victim), timeout_s=LEASE_TTL_S + 10)
    await cluster.wait_until(
        cluster.journals_ready(names, 3, zones_min=2, exclude=[victim.suffix]),
        timeout_s=recovery_bound_s,
    )
    assert time.monotonic() - killed_at < recovery_bound_s
    assert held and all(victim.id not in cluster.route(n).members for n in held)

    committed = by_journal(before_kill)
    duplicates = await count_duplicates(client, names, committed)
    assert duplicates <= writers.retries  # Only a retried append can be there twice.

    # The new primaries take appends, after every byte from before.
    for journal in held:
        data = record(99, 0, journal)
        resp = await append(client, pb.AppendRequest(journal=journal), data)
        last_end = max(c.end for c in committed[journal])
        assert resp.commit.begin == last_end
        assert (await read_journal(client, journal))[last_end:] == data
