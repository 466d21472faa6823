"""A proxying broker routes around a member that cannot answer (broker.proxy_retry).

In-process brokers over the embedded keyspace, plus a *ghost*: a member whose BrokerSpec and
assignments are in the keyspace (its lease not yet expired) but whose endpoint is a socket that
accepts connections and closes them at once, as a broker that has just died. Broker C is outside
the journal's route and proxies every request:

- a read and a fragment listing go to another member of the route when the ghost (the
  primary, which C would pick) fails, within the same RPC;
- an append, which only the primary takes, is held while the ghost fails, and goes to the new
  primary as soon as the route changes, within the same RPC.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
import grpc.aio
import pytest
from broker_testkit import ROOT, Cluster, journal_spec

from broker.keyspace.backend import OpDelete, OpPut, prefix_end
from broker.protocol import protocol_pb2 as pb
from broker.proxy_retry import proxy_attempts_max
from broker.server import Broker
from broker.topology import assignment_key, member_key

J = "proxy/journal"
GHOST = pb.ProcessSpec.ID(zone="zone-g", suffix="ghost-broker")
# Bound on any one wait of these tests (each takes well under a second).
wait_s = 10.0


@dataclass
class Ghost:
    """A listening socket that closes every connection it accepts; counts them."""

    server: asyncio.Server
    endpoint: str
    connections: int = 0
    connected: asyncio.Event = field(default_factory=asyncio.Event)


@contextlib.asynccontextmanager
async def ghost() -> AsyncIterator[Ghost]:
    g: Ghost | None = None

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert g is not None
        g.connections += 1
        g.connected.set()
        writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    g = Ghost(server, f"http://127.0.0.1:{port}")
    try:
        yield g
    finally:
        server.close()
        await server.wait_closed()


async def _set_route(cluster: Cluster, members: list[tuple[str, str, int]]) -> None:
    """Assign J to ``members`` (zone, suffix, lease; the first is the primary) in one etcd
    transaction, so that a broker staying in the route keeps its replica; wait until every
    broker has seen it."""
    prefix = f"{ROOT}/assign/{J}#".encode()
    existing = {kv.key for kv in (await cluster.admin.range(prefix, prefix_end(prefix))).kvs}
    wanted = {
        assignment_key(ROOT, J, zone, suffix, slot).encode(): lease
        for slot, (zone, suffix, lease) in enumerate(members)
    }
    ops: list[OpPut | OpDelete] = [OpDelete(key) for key in sorted(existing - set(wanted))]
    ops += [OpPut(key, b"", lease) for key, lease in wanted.items()]
    response = await cluster.admin.txn([], ops)
    await cluster.sync(response.header.revision)


async def _route_through_ghost(cluster: Cluster, g: Ghost, replica: Broker) -> None:
    """Announce the ghost under a lease of its own, and make J's route [ghost (primary),
    ``replica``]."""
    lease, _ = await cluster.admin.lease_grant(60)
    spec = pb.BrokerSpec(
        process_spec=pb.ProcessSpec(id=GHOST, endpoint=g.endpoint), journal_limit=10
    )
    await cluster.admin.put(
        member_key(ROOT, GHOST.zone, GHOST.suffix).encode(), spec.SerializeToString(), lease=lease
    )
    await _set_route(
        cluster,
        [
            (GHOST.zone, GHOST.suffix, lease),
            (replica.config.zone, replica.config.suffix, replica.lease_id),
        ],
    )


def _member(b: Broker) -> tuple[str, str, int]:
    return b.config.zone, b.config.suffix, b.lease_id


async def _read_all(cluster: Cluster, via: Broker) -> bytes:
    out = bytearray()
    request = pb.ReadRequest(journal=J, offset=0, block=False)
    async for response in cluster.stub(via).Read(request):
        out += response.content
    return bytes(out)


async def test_reads_and_listings_go_to_another_member_when_one_fails(cluster: Cluster) -> None:
    a = await cluster.start_broker("zone-a", "broker-a")
    b = await cluster.start_broker("zone-b", "broker-b")
    c = await cluster.start_broker("zone-c", "broker-c")
    await cluster.create(journal_spec(J, replication=2), [a, b])
    assert (await cluster.append(a, J, [b"hello, "])).status == pb.OK
    assert (await cluster.append(a, J, [b"world"])).status == pb.OK
    async with ghost() as g:
        await _route_through_ghost(cluster, g, a)
        # C, outside the route and in neither zone, proxies to the primary: the ghost.
        assert await _read_all(cluster, c) == b"hello, world"
        listing = await cluster.stub(c).ListFragments(pb.FragmentsRequest(journal=J))
        assert listing.status == pb.OK and listing.fragments[-1].spec.end == len(b"hello, world")
        assert g.connections >= 1  # The ghost was tried (and failed) first.
        # Now C's pool knows the ghost is unreachable: it goes to the replica at once.
        before = g.connections
        assert await _read_all(cluster, c) == b"hello, world"
        assert g.connections == before


async def test_a_proxied_append_waits_for_the_route_to_leave_a_dead_primary(
    cluster: Cluster,
) -> None:
    a = await cluster.start_broker("zone-a", "broker-a")
    b = await cluster.start_broker("zone-b", "broker-b")
    c = await cluster.start_broker("zone-c", "broker-c")
    await cluster.create(journal_spec(J, replication=2), [a, b])
    assert (await cluster.append(a, J, [b"before "])).status == pb.OK
    async with ghost() as g:
        await _route_through_ghost(cluster, g, a)
        appending = asyncio.create_task(cluster.append(c, J, [b"after"]))
        # C tried the ghost, which failed before reading anything of the append ...
        await asyncio.wait_for(g.connected.wait(), wait_s)
        # ... and the route moves on (the ghost's lease expired; the allocator re-assigns).
        await _set_route(cluster, [_member(a), _member(b)])
        response = await asyncio.wait_for(appending, wait_s)
        assert response.status == pb.OK
        assert response.header.process_id == a.id
        assert response.commit.begin == len(b"before ")
    assert await _read_all(cluster, c) == b"before after"


async def test_a_proxied_append_gives_up_after_its_attempts(cluster: Cluster) -> None:
    a = await cluster.start_broker("zone-a", "broker-a")
    c = await cluster.start_broker("zone-c", "broker-c")
    await cluster.create(journal_spec(J, replication=2), [a])
    async with ghost() as g:
        await _route_through_ghost(cluster, g, a)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await asyncio.wait_for(cluster.append(c, J, [b"lost"]), wait_s)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        # One connection per failed attempt; the others were waits for a route change.
        assert 1 < g.connections <= proxy_attempts_max
