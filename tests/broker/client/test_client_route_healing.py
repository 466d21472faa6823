"""Routing heals: cached routes naming a broker that is gone are dropped or steered around, the
pool knows which endpoints it cannot reach and drops their channels after a while, and a
ReroutingReader re-dispatches a read whose broker cannot serve. The dead broker is a loopback
port nobody listens on; the live one a real in-process broker."""

from __future__ import annotations

import asyncio
import itertools
import socket

import grpc
import grpc.aio
import pytest
from broker_testkit import one_broker_with

from broker.client.appender import append
from broker.client.reader import Reader
from broker.client.rerouting_reader import (
    ReroutingReader,
    backoff_max_s,
    rerouting_backoff_s,
)
from broker.client.route_cache import (
    ChannelPool,
    JournalClient,
    RouteCache,
    pick_endpoint,
    reconnect_backoff_max_ms,
    unreachable_channel_ttl_s,
    unreachable_sweep_interval_s,
)
from broker.pipeline import Dialer
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import JournalNotFoundError

A = pb.ProcessSpec.ID(zone="zone-a", suffix="broker-a")
B = pb.ProcessSpec.ID(zone="zone-b", suffix="broker-b")
J = "heal/journal"


def _dead_endpoint() -> str:
    """An endpoint with nothing listening (the port was free a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


async def _fail_to_connect(pool: ChannelPool, endpoint: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await pool.stub(endpoint).Apply(pb.ApplyRequest(), timeout=10)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_routes_naming_a_dead_endpoint_are_dropped() -> None:
    cache = RouteCache()
    cache.update(
        "j/one", pb.Route(members=[A, B], primary=0, endpoints=["http://a:1", "http://b:1"])
    )
    cache.update("j/two", pb.Route(members=[B], primary=0, endpoints=["http://b:1"]))
    cache.update("j/three", pb.Route(members=[A], primary=0, endpoints=["http://a:1"]))
    assert cache.drop_endpoint("http://b:1") == 2
    assert cache.get("j/one") is None and cache.get("j/two") is None
    assert cache.get("j/three") is not None
    assert cache.drop_endpoint("http://b:1") == 0


def test_pick_endpoint_never_picks_an_excluded_endpoint() -> None:
    route = pb.Route(members=[A, B], primary=1, endpoints=["http://a:1", "http://b:1"])
    dead = {"http://b:1"}
    assert pick_endpoint(route, require_primary=True, exclude=dead) == ""
    assert pick_endpoint(route, require_primary=False, exclude=dead) == "http://a:1"
    assert pick_endpoint(route, require_primary=False, zone="zone-b", exclude=dead) == "http://a:1"
    both = {"http://a:1", "http://b:1"}
    assert pick_endpoint(route, require_primary=False, exclude=both) == ""


async def test_the_pool_knows_an_unreachable_endpoint_and_drops_its_channel() -> None:
    clock = Clock()
    pool = ChannelPool(clock=clock)
    dead, other = _dead_endpoint(), _dead_endpoint()
    assert not pool.unreachable(dead)  # No channel: nothing known.
    await _fail_to_connect(pool, dead)
    assert pool.unreachable(dead)
    channel = pool.get(dead)  # Kept meanwhile: it reconnects with a bounded back-off.
    clock.now += unreachable_sweep_interval_s
    pool.get(other)  # A sweep notes the dead endpoint ...
    assert pool.get(dead) is channel
    clock.now += unreachable_channel_ttl_s + unreachable_sweep_interval_s
    pool.get(other)  # ... and the next one past its TTL drops its channel.
    assert not pool.unreachable(dead) and len(pool) == 1
    assert pool.get(dead) is not channel
    await pool.close()
    assert len(pool) == 0


async def test_a_client_steers_around_an_unreachable_route_member() -> None:
    dead = _dead_endpoint()
    client = JournalClient("http://default:1", zone="zone-b")
    route = pb.Route(members=[A, B], primary=1, endpoints=["http://a:1", dead])
    client.update_route(J, pb.Header(route=route))
    assert client.endpoint_for(J, require_primary=False) == dead  # Same zone.
    await _fail_to_connect(client.channels, dead)
    # Reads go to another member; appends (the primary is dead) to the default broker, and the
    # stale route is dropped.
    assert client.endpoint_for(J, require_primary=False) == "http://a:1"
    assert client.routes.get(J) is not None
    assert client.endpoint_for(J, require_primary=True) == "http://default:1"
    assert client.routes.get(J) is None
    await client.close()


def test_rerouting_backoff_grows_to_a_bound() -> None:
    delays = [rerouting_backoff_s(attempt) for attempt in range(1, 12)]
    assert delays == sorted(delays) and delays[0] > 0 and delays[-1] == backoff_max_s


async def test_a_read_routed_to_a_dead_broker_is_rerouted() -> None:
    async with one_broker_with([J]) as (_, client):
        await append(client, pb.AppendRequest(journal=J), b"hello, healed\n")
        dead = _dead_endpoint()
        # A route naming only a broker that died (as its own answer last taught it).
        stale = pb.Header(route=pb.Route(members=[B], primary=0, endpoints=[dead]))
        request = pb.ReadRequest(journal=J, offset=0, block=False)
        pauses: list[float] = []

        async def pause(delay_s: float) -> None:
            pauses.append(delay_s)

        for rerouting in (False, True):
            # A new client each time: its pool does not know the endpoint is dead yet.
            fresh = JournalClient(client.endpoint)
            fresh.update_route(J, stale)
            if not rerouting:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await Reader(fresh, request).read_chunk()  # A plain Reader just fails.
                assert info.value.code() == grpc.StatusCode.UNAVAILABLE
                await fresh.close()
                continue
            reader = ReroutingReader(fresh, request, sleep=pause)
            try:
                chunk = await reader.read_chunk()
            finally:
                await reader.close()
            assert chunk.offset == 0 and chunk.content == b"hello, healed\n"
            assert reader.reroutes == 1 and pauses == [rerouting_backoff_s(1)]
            # The broker's answer taught the current route.
            route = fresh.routes.get(J)
            assert route is not None and dead not in route.endpoints
            await fresh.close()


async def test_a_rerouting_reader_raises_what_no_route_can_fix() -> None:
    async with one_broker_with([J]) as (_, client):
        pauses: list[float] = []

        async def pause(delay_s: float) -> None:
            pauses.append(delay_s)

        missing = ReroutingReader(client, pb.ReadRequest(journal="heal/missing"), sleep=pause)
        with pytest.raises(JournalNotFoundError):
            await missing.read_chunk()
        await missing.close()
        # A broker that stays unreachable: the last failure, after attempts_max tries.
        dead = _dead_endpoint()
        client.endpoint = dead
        lost = ReroutingReader(client, pb.ReadRequest(journal=J), attempts_max=3, sleep=pause)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await lost.read_chunk()
        await lost.close()
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert pauses == [rerouting_backoff_s(1), rerouting_backoff_s(2)]


# Long enough for the reconnect back-off to reach its bound several times over.
watch_reconnects_s = 3.0
# The longest gap between two attempts once the back-off is at its bound: the bound plus
# gRPC's jitter (20%) plus scheduling slack on a loaded machine.
reconnect_gap_max_s = reconnect_backoff_max_ms / 1000 * 1.2 + 0.25


@pytest.mark.parametrize("side", ["pool", "dialer"])
async def test_a_channel_to_a_dead_broker_keeps_trying_every_half_second(side: str) -> None:
    # Until a channel's next attempt to connect, its RPCs fail at once ("failed to connect"),
    # even once the broker is back at its endpoint (restarted): with a 2 s bound, a restarted
    # broker's peers reached it 1-2 s after it served, in the short soak. The endpoint here
    # accepts connections and closes them at once, so that each attempt is seen.
    attempts: list[float] = []
    loop = asyncio.get_running_loop()

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        attempts.append(loop.time())
        writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    endpoint = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    pool, dialer = ChannelPool(), Dialer()
    stub = pool.stub(endpoint) if side == "pool" else dialer.stub(endpoint)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.ListFragments(pb.FragmentsRequest(journal=J), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        started = loop.time()
        # The channel reconnects on its own: watch it (each attempt is an event of the
        # server; this only bounds how long we look).
        await asyncio.sleep(watch_reconnects_s)
    finally:
        server.close()
        await server.wait_closed()
        await pool.close()
        await dialer.close()
    later = [t for t in attempts if t >= started + 1.0]  # Once the back-off is at its bound.
    gaps = [b - a for a, b in itertools.pairwise(later)]
    assert len(later) >= 3, attempts
    assert max(gaps) <= reconnect_gap_max_s, gaps


async def test_a_client_whose_default_broker_died_goes_to_another_it_knows() -> None:
    # A consumer's default broker is killed: requests of journals with no usable route went
    # to it, and failed until it came back, even for journals that had failed over to live
    # brokers (found by the soak). Another broker learned from a route answers instead.
    async with one_broker_with([J, "heal/other"]) as (_, client):
        live = client.endpoint
        dead = _dead_endpoint()
        fresh = JournalClient(dead)
        try:
            # A route the client learned while its default broker served.
            fresh.update_route(
                "heal/other",
                pb.Header(route=pb.Route(members=[A], primary=0, endpoints=[live])),
            )
            await _fail_to_connect(fresh.channels, dead)
            response = await append(fresh, pb.AppendRequest(journal=J), b"via a live broker\n")
            assert response.header.process_id == A
            assert response.commit.end == len(b"via a live broker\n")
            assert fresh.endpoint_for(J, require_primary=True) == live
            assert fresh.default_endpoint() == live
        finally:
            await fresh.close()
