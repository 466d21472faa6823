"""Routing heals after a broker dies (issue #12): real etcd, three ``gazette serve`` processes
(zones z1, z1, z2) each with its HTTP gateway, one journal at replication 3.

2 MB are PUT through a gateway, every gateway and a gRPC client of every broker read it back
(so that each has learnt the journal's route, naming the primary), then the primary is killed
with SIGKILL. Every surviving broker must still serve the journal whole, at once, through its
gateway (HTTP) and gRPC: its cached route names a dead broker, and the read has to drop that
route rather than answer UNAVAILABLE until the cache expires. Once the dead broker's lease has
expired and the journal's route has shrunk, the same holds. Finally the dead broker is started
again (on a new gRPC endpoint), and PUTs through every gateway reach the journal's primary.
"""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from e2e_workload import journal_spec, read_journal, requires_etcd

from broker.client.route_cache import JournalClient
from broker.testing.ports import free_port
from broker.testing.process_cluster import BrokerProcess, ProcessCluster

pytestmark = [pytest.mark.etcd, requires_etcd]

LEASE_TTL_S = 3
JOURNAL = "routing/failover"
THREE_BROKERS = [("z1", "broker-1"), ("z1", "broker-2"), ("z2", "broker-3")]
# Lease expiry, re-allocation and re-synchronisation of the journal, with room for loaded cores.
recovery_bound_s = LEASE_TTL_S + 20.0
# PUTs refused as retriable (503) while a new route synchronises, and the back-off between.
put_attempts_max = 8
put_backoff_max_s = 2.0
# Any one HTTP request.
request_timeout_s = 30.0


class GatewayCluster(ProcessCluster):
    """A ProcessCluster whose brokers each serve an HTTP gateway on a port of their own."""

    def __init__(self, brokers: list[tuple[str, str]], **kwargs: object) -> None:
        super().__init__(brokers, **kwargs)  # type: ignore[arg-type]
        self.base_args = list(self.extra_args)
        self.http_ports = {suffix: free_port() for _, suffix in brokers}

    async def start_broker(self, b: BrokerProcess) -> None:
        # Read by the base class before its first await: each broker gets its own port.
        self.extra_args = [*self.base_args, "--http-port", str(self.http_ports[b.suffix])]
        await super().start_broker(b)

    def gateway(self, b: BrokerProcess) -> str:
        return f"http://127.0.0.1:{self.http_ports[b.suffix]}"


@pytest.fixture
async def cluster() -> AsyncIterator[GatewayCluster]:
    async with GatewayCluster(THREE_BROKERS, lease_ttl_s=LEASE_TTL_S) as c:
        yield c


def _content(size: int) -> bytes:
    line = b"0123456789abcdefghijklmnopqrstuvwxyz-routing-failover-record\n"
    return (line * (size // len(line) + 1))[:size]


async def _get(http: aiohttp.ClientSession, url: str) -> tuple[int, bytes]:
    async with http.get(f"{url}/{JOURNAL}", params={"offset": "0", "block": "false"}) as resp:
        return resp.status, await resp.read()


async def _put(http: aiohttp.ClientSession, url: str, data: bytes) -> tuple[int, str]:
    async with http.put(f"{url}/{JOURNAL}", data=io.BytesIO(data)) as resp:
        return resp.status, await resp.text()


def _route_without(cluster: GatewayCluster, victim: BrokerProcess) -> str | None:
    route = cluster.route(JOURNAL)
    if victim.id in route.members:
        return f"route still names {victim.suffix}: {route}"
    if route.primary < 0:
        return f"no primary yet: {route}"
    return None


async def _read_everywhere(
    http: aiohttp.ClientSession,
    cluster: GatewayCluster,
    clients: dict[str, JournalClient],
    brokers: list[BrokerProcess],
    data: bytes,
) -> None:
    """Read the journal whole through each broker's gateway, then through a gRPC client of it
    (one per broker, kept across reads: its route cache too)."""
    for b in brokers:
        status, body = await _get(http, cluster.gateway(b))
        assert status == 206, f"{b.suffix}: {status} {body[:300]!r}"
        assert body == data, b.suffix
        if b.endpoint not in clients:
            clients[b.endpoint] = cluster.client(b)
        client = clients[b.endpoint]
        assert await read_journal(client, JOURNAL) == data, b.suffix


async def test_every_survivor_serves_the_journal_after_its_primary_is_killed(
    cluster: GatewayCluster,
) -> None:
    await cluster.apply([journal_spec(JOURNAL, 3, cluster.store_url)])
    await cluster.wait_until(cluster.journals_ready([JOURNAL], 3, zones_min=2))
    primary = cluster.primary(JOURNAL)
    assert primary is not None
    survivors = [b for b in cluster.brokers if b is not primary]
    data = _content(2 << 20)
    clients: dict[str, JournalClient] = {}  # By broker endpoint.

    timeout = aiohttp.ClientTimeout(total=request_timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        # Through a gateway whose broker is not the primary: its answer teaches the route.
        status, text = await _put(http, cluster.gateway(survivors[0]), data)
        assert status == 200, text
        # Every gateway and gRPC client learns the route (naming the primary).
        await _read_everywhere(http, cluster, clients, cluster.brokers, data)

        await cluster.kill(primary)
        killed_at = time.monotonic()
        # At once, the dead primary's lease still running: every survivor is a replica and
        # serves the journal, whatever its cached route says.
        await _read_everywhere(http, cluster, clients, survivors, data)

        # The lease expires and the journal's route shrinks to the survivors.
        await cluster.wait_until(cluster.member_gone(primary), timeout_s=recovery_bound_s)
        await cluster.wait_until(lambda: _route_without(cluster, primary), recovery_bound_s)
        await _read_everywhere(http, cluster, clients, survivors, data)
        assert time.monotonic() - killed_at < recovery_bound_s

        # Two brokers cannot take appends at replication 3 (INSUFFICIENT_JOURNAL_BROKERS). The
        # dead broker comes back (a new gRPC endpoint); once the journal is whole again, appends
        # through every gateway reach its primary, whatever each had cached.
        await cluster.start_broker(primary)
        await cluster.wait_until(cluster.journals_ready([JOURNAL], 3, zones_min=2))
        expected = bytearray(data)
        for b in cluster.brokers:
            more = f"appended through {b.suffix}\n".encode()
            for attempt in range(put_attempts_max):
                status, text = await _put(http, cluster.gateway(b), more)
                # Until the primary has synchronised the new route, a PUT may be refused as
                # retriable (503), having appended nothing.
                if status != 503:
                    break
                await asyncio.sleep(min(put_backoff_max_s, 0.05 * 2**attempt))
            assert status == 200, f"{b.suffix}: {status} {text}"
            expected += more
        await _read_everywhere(http, cluster, clients, cluster.brokers, bytes(expected))
