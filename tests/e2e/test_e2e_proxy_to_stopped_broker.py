"""An append proxied to a SIGSTOPped broker fails within seconds, UNAVAILABLE (which clients
retry), instead of waiting for it forever (docs/reliability.md, "An append proxied to a
SIGSTOPped broker waits for it forever").

Real `gazette serve` processes over real etcd: a journal's primary is SIGSTOPped (its sockets
stay open, so no connection is refused or reset), and an append is sent to the other broker,
which proxies it to the primary. The brokers' lease TTL is long, so the route keeps naming the
stopped primary throughout: only the peer channel's HTTP/2 keepalive (grpc_transport.py) can
end the proxied call. Before it, the call ran until the client's own deadline. A second append
then needs a new connection, whose handshake the stopped primary never completes: it fails
after the peer channels' connect timeout (gRPC's default was 20 s)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from e2e_workload import journal_spec, requires_etcd

from broker.client.route_cache import open_channel
from broker.grpc_transport import (
    peer_connect_timeout_s,
    peer_keepalive_time_s,
    peer_keepalive_timeout_s,
)
from broker.protocol import protocol_pb2 as pb
from broker.protocol import protocol_pb2_grpc as pbg
from broker.testing.process_cluster import BrokerProcess, ProcessCluster

pytestmark = [pytest.mark.etcd, requires_etcd]

JOURNAL = "proxy/stopped"
TWO_BROKERS = [("zone-a", "broker-a1"), ("zone-b", "broker-b1")]
# Far beyond the test: the stopped primary stays in the route (no failover ends the call).
LEASE_TTL_S = 60
# The client's own deadline: what the proxied call ran into before keepalive.
client_deadline_s = 20.0
# A proxied append to a stopped primary fails within this: one keepalive interval and one
# ping timeout, plus scheduling slack on a shared machine.
proxied_failure_bound_s = peer_keepalive_time_s + peer_keepalive_timeout_s + 3.0
# On a new connection: the handshake's timeout, at most twice (the proxying broker tries again
# while the route names the primary: broker/proxy_retry.py, about 3 s of waits), plus slack.
new_connection_failure_bound_s = 2 * peer_connect_timeout_s + 3.0 + 3.0


@pytest.fixture
async def cluster() -> AsyncIterator[ProcessCluster]:
    async with ProcessCluster(TWO_BROKERS, lease_ttl_s=LEASE_TTL_S) as c:
        yield c


async def _append_via(b: BrokerProcess, data: bytes) -> pb.AppendResponse:
    """One Append RPC to `b` (no client retry), within `client_deadline_s`."""
    channel = open_channel(b.endpoint)
    try:
        requests = [pb.AppendRequest(journal=JOURNAL), pb.AppendRequest(content=data)]
        requests.append(pb.AppendRequest())  # the end of the content: commit
        resp: pb.AppendResponse = await pbg.JournalStub(channel).Append(
            iter(requests), timeout=client_deadline_s
        )
        return resp
    finally:
        await channel.close()


async def test_an_append_proxied_to_a_stopped_broker_fails_within_the_keepalive_bound(
    cluster: ProcessCluster,
) -> None:
    await cluster.apply([journal_spec(JOURNAL, 1, cluster.store_url)])
    await cluster.wait_until(cluster.journals_ready([JOURNAL], 1))
    primary = cluster.primary(JOURNAL)
    assert primary is not None
    proxy = next(b for b in cluster.brokers if b is not primary)

    # The proxying broker's channel to the primary is up (as in a running cluster).
    resp = await _append_via(proxy, b"before\n")
    assert resp.status == pb.OK and resp.header.process_id.suffix == primary.suffix

    cluster.pause(primary)  # SIGSTOP: sockets open, nothing answered
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await _append_via(proxy, b"stopped\n")
    elapsed_s = loop.time() - started
    # The connection is gone: the next proxied append opens a new one, whose handshake the
    # stopped primary never completes.
    started = loop.time()
    with pytest.raises(grpc.aio.AioRpcError) as failed_cold:
        await _append_via(proxy, b"stopped, new connection\n")
    cold_s = loop.time() - started
    cluster.resume(primary)

    code = failed.value.code()
    assert code is grpc.StatusCode.UNAVAILABLE, (
        f"{code} after {elapsed_s:.1f} s: {failed.value.details()}"
    )
    assert elapsed_s < proxied_failure_bound_s, (
        f"failed after {elapsed_s:.1f} s (bound {proxied_failure_bound_s} s)"
    )
    code = failed_cold.value.code()
    assert code is grpc.StatusCode.UNAVAILABLE, (
        f"{code} after {cold_s:.1f} s: {failed_cold.value.details()}"
    )
    assert cold_s < new_connection_failure_bound_s, (
        f"failed after {cold_s:.1f} s on a new connection (bound {new_connection_failure_bound_s} s)"
    )
