"""A SIGSTOPped primary does not keep its journal from appending once it has moved.

Real `gazette serve` processes over real etcd, a 3-s lease. An all-replicas journal of
replication 3 appends through its primary A, so A's replication streams to its two peers stay
open, each holding its peer's spool (replicate_api.py: a stream holds the spool for its whole
life). A is SIGSTOPped: its sockets stay open, so no stream is reset and nothing more arrives
on them. Once A's lease expires the allocator assigns the journal to the live brokers and a
new primary builds its pipeline to the same peers, whose spools A's streams still hold.

Appends through a live broker must then commit within a bound (the lease, the allocator, and
the keepalive that finds A's streams dead), and every earlier acknowledged append must be read
back, once. Without a keepalive on the peers' side of those streams they waited for A for
ever, and so did every append.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from e2e_workload import FOUR_BROKERS, journal_spec, read_journal, requires_etcd

from broker.client.appender import append
from broker.protocol import protocol_pb2 as pb
from broker.testing.process_cluster import ProcessCluster

pytestmark = [pytest.mark.etcd, requires_etcd]

JOURNAL = "stopped-primary/all-replicas"
LEASE_TTL_S = 3
# The lease, the allocator's move, a pipeline's failed attempt and the keepalive that ends the
# stopped primary's streams, with room for a loaded machine.
APPEND_AFTER_STOP_S_MAX = 45.0


@pytest.fixture
async def cluster() -> AsyncIterator[ProcessCluster]:
    async with ProcessCluster(FOUR_BROKERS, lease_ttl_s=LEASE_TTL_S) as c:
        yield c


async def test_appends_commit_after_the_stopped_primary_loses_its_journal(
    cluster: ProcessCluster,
) -> None:
    await cluster.apply([journal_spec(JOURNAL, 3, cluster.store_url)])
    await cluster.wait_until(cluster.journals_ready([JOURNAL], 3, zones_min=2))
    route = cluster.route(JOURNAL)
    primary = cluster.broker(route.members[route.primary].suffix)
    acknowledged: list[bytes] = []
    via_primary = cluster.client(primary)
    for i in range(5):
        record = f"before-{i}\n".encode()
        resp = await append(via_primary, pb.AppendRequest(journal=JOURNAL), record)
        assert resp.status == pb.OK
        acknowledged.append(record)

    peers = [m.suffix for m in route.members if m.suffix != primary.suffix]
    cluster.pause(primary)
    try:
        live = cluster.broker(peers[0])
        client = cluster.client(live)
        loop = asyncio.get_running_loop()
        start = loop.time()
        async with asyncio.timeout(APPEND_AFTER_STOP_S_MAX):
            resp = await append(client, pb.AppendRequest(journal=JOURNAL), b"after\n")
        took_s = loop.time() - start
        assert resp.status == pb.OK
        acknowledged.append(b"after\n")
        assert primary.suffix not in [m.suffix for m in resp.header.route.members]
        # And the next one at once, on the new pipeline.
        async with asyncio.timeout(10.0):
            resp = await append(client, pb.AppendRequest(journal=JOURNAL), b"next\n")
        assert resp.status == pb.OK
        acknowledged.append(b"next\n")
        content = await read_journal(client, JOURNAL)
    finally:
        cluster.resume(primary)
    lines = [line + b"\n" for line in content.split(b"\n") if line]
    for record in acknowledged:
        assert record in lines, (record, took_s)
    # A retried append may be written twice (at-least-once appends); earlier ones were not.
    for record in acknowledged[:5]:
        assert lines.count(record) == 1
