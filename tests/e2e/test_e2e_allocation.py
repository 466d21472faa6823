"""Three `gazette serve` processes in two zones on a real etcd: a hundred journals of replication
3 are allocated within seconds, and a client that reaches a broker other than a journal's
primary still appends and reads (the broker proxies)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from e2e_workload import journal_spec, read_journal, requires_etcd

from broker.client.appender import Appender
from broker.client.reader import Reader
from broker.protocol import protocol_pb2 as pb
from broker.testing.process_cluster import ProcessCluster

pytestmark = [pytest.mark.etcd, requires_etcd, pytest.mark.asyncio(loop_scope="module")]

BROKERS = [("zone-a", "broker-a1"), ("zone-a", "broker-a2"), ("zone-b", "broker-b1")]
# "Within seconds": generous for two loaded cores; it takes about two here.
allocation_bound_s = 30.0


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster() -> AsyncIterator[ProcessCluster]:
    async with ProcessCluster(BROKERS) as c:
        yield c


async def test_hundred_journals_are_assigned_with_primaries_over_both_zones(
    cluster: ProcessCluster,
) -> None:
    names = [f"alloc/journal-{i:03d}" for i in range(100)]
    started = time.monotonic()
    await cluster.apply(journal_spec(n, 3, cluster.store_url) for n in names)
    # Ready: three consistent replicas (each advertises the route its primary synchronised),
    # a primary, members in both zones.
    await cluster.wait_until(
        cluster.journals_ready(names, 3, zones_min=2), timeout_s=allocation_bound_s
    )
    elapsed_s = time.monotonic() - started
    assert elapsed_s < allocation_bound_s

    primaries = Counter(p.suffix for n in names if (p := cluster.primary(n)) is not None)
    assert sum(primaries.values()) == 100
    # Primaries are spread, not piled on the allocator's leader.
    assert set(primaries) == {suffix for _, suffix in BROKERS}
    assert min(primaries.values()) >= 20, primaries


async def test_a_client_of_a_non_primary_broker_appends_and_reads(cluster: ProcessCluster) -> None:
    # Replication 2 of 3 brokers: one broker is a replica, another not in the route at all.
    journal = "alloc/proxied"
    await cluster.apply([journal_spec(journal, 2, cluster.store_url)])
    await cluster.wait_until(cluster.journals_ready([journal], 2))
    route = cluster.route(journal)
    primary = route.members[route.primary]
    replica = next(m for m in route.members if m != primary)
    outsider = next(b for b in cluster.brokers if b.id not in route.members)

    expected = b""
    for via in (cluster.broker(replica.suffix), outsider):
        client = cluster.client(via)  # Knows no route: its first request goes to `via`.
        data = f"through {via.suffix}\n".encode()
        async with Appender(client, pb.AppendRequest(journal=journal)) as appender:
            await appender.write(data)
        assert appender.response is not None and appender.response.status == pb.OK
        # The primary answered (relayed by `via`), and the client learned the route.
        assert appender.response.header.process_id == primary
        assert client.endpoint_for(journal, require_primary=True) == route.endpoints[route.primary]
        expected += data

        fresh = cluster.client(via)
        reader = Reader(fresh, pb.ReadRequest(journal=journal, offset=0, block=False))
        chunk = await reader.read_chunk()
        await reader.close()
        # Served by a member of the route (the replica itself, or proxied by the outsider).
        # (Its header: a fragment persisted under the read is answered again, without one.)
        assert reader.header.process_id in route.members
        assert chunk.offset == 0 and expected.startswith(chunk.content)
        assert await read_journal(cluster.client(via), journal) == expected
