"""Dispatch: the bounded route cache, endpoint choice, endpoint parsing and the channel pool."""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio
import pytest

from broker.client.route_cache import (
    ChannelPool,
    EndpointError,
    JournalClient,
    RouteCache,
    endpoint_of_header,
    grpc_target,
    pick_endpoint,
)
from broker.pipeline import Dialer
from broker.protocol import protocol_pb2 as pb

A = pb.ProcessSpec.ID(zone="zone-a", suffix="broker-a")
B = pb.ProcessSpec.ID(zone="zone-b", suffix="broker-b")
C = pb.ProcessSpec.ID(zone="zone-c", suffix="broker-c")


def route(
    primary: int = 1, endpoints: tuple[str, ...] = ("http://a:1", "http://b:1", "http://c:1")
) -> pb.Route:
    return pb.Route(members=[A, B, C], primary=primary, endpoints=list(endpoints))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_route_cache_is_a_bounded_lru_with_a_ttl() -> None:
    clock = Clock()
    cache = RouteCache(routes_max=2, ttl_s=10.0, clock=clock)
    cache.update("j/one", route())
    cache.update("j/two", route())
    assert cache.get("j/one") == route()  # Touch: j/two is now the least recently used.
    cache.update("j/three", route())
    assert len(cache) == 2 and cache.get("j/two") is None and cache.get("j/one") is not None
    clock.now = 10.5
    assert cache.get("j/one") is None  # Expired.
    cache.update("j/three", pb.Route(primary=-1))  # No members: the broker knows none.
    assert cache.get("j/three") is None and len(cache) == 0


def test_route_cache_keeps_copies() -> None:
    cache = RouteCache()
    r = route()
    cache.update("j/one", r)
    r.primary = 0
    got = cache.get("j/one")
    assert got is not None and got.primary == 1
    got.primary = 2
    again = cache.get("j/one")
    assert again is not None and again.primary == 1


def test_pick_endpoint() -> None:
    assert pick_endpoint(route(), require_primary=True) == "http://b:1"
    assert pick_endpoint(route(), require_primary=False, zone="zone-c") == "http://c:1"
    assert pick_endpoint(route(), require_primary=False, zone="elsewhere") == "http://b:1"
    assert pick_endpoint(route(primary=-1), require_primary=True) == ""
    assert pick_endpoint(route(primary=-1), require_primary=False) == "http://a:1"
    # A member without a BrokerSpec has no endpoint; endpoints missing altogether: no choice.
    assert pick_endpoint(route(1, ("http://a:1", "", "http://c:1")), require_primary=True) == ""
    assert pick_endpoint(pb.Route(members=[A], primary=0), require_primary=True) == ""


def test_endpoint_of_header() -> None:
    header = pb.Header(route=route())
    header.process_id.CopyFrom(C)
    assert endpoint_of_header(header) == "http://c:1"
    header.process_id.CopyFrom(pb.ProcessSpec.ID(zone="x", suffix="nobody"))
    assert endpoint_of_header(header) == ""


def test_grpc_targets() -> None:
    assert grpc_target("http://127.0.0.1:8080") == ("127.0.0.1:8080", False)
    assert grpc_target("https://broker.example:443/") == ("broker.example:443", True)
    assert grpc_target("unix:///tmp/broker.sock") == ("unix:///tmp/broker.sock", False)
    assert grpc_target("localhost:8080") == ("localhost:8080", False)
    for bad in ("", "ftp://host:1", "http://", "http://[::1"):
        with pytest.raises(EndpointError):
            grpc_target(bad)


async def test_journal_client_dispatch() -> None:
    client = JournalClient("http://default:1", zone="zone-a")
    assert client.endpoint_for("j/one", require_primary=False) == "http://default:1"
    header = pb.Header(route=route())
    client.update_route("j/one", header)
    assert client.endpoint_for("j/one", require_primary=False) == "http://a:1"  # Same zone.
    assert client.endpoint_for("j/one", require_primary=True) == "http://b:1"
    client.update_route("j/one", None)
    assert client.endpoint_for("j/one", require_primary=True) == "http://default:1"
    await client.close()


async def _closed(channel: grpc.aio.Channel) -> None:
    async with asyncio.timeout(10):
        while (state := channel.get_state()) is not grpc.ChannelConnectivity.SHUTDOWN:
            await channel.wait_for_state_change(state)


async def test_channel_pool_is_bounded() -> None:
    pool = ChannelPool(channels_max=2)
    first = pool.get("http://127.0.0.1:1")
    assert pool.get("http://127.0.0.1:1") is first
    pool.get("http://127.0.0.1:2")
    pool.get("http://127.0.0.1:3")  # Evicts the least recently used (the first).
    assert len(pool) == 2
    await _closed(first)  # Closed in the background, not left open until the pool closes.
    assert pool.get("http://127.0.0.1:1") is not first
    await pool.close()
    assert len(pool) == 0
    with pytest.raises(ValueError):
        ChannelPool(channels_max=0)


async def test_a_brokers_peer_channels_are_bounded() -> None:
    dialer = Dialer(channels_max=2)
    for port in (1, 2, 3):
        dialer.stub(f"http://127.0.0.1:{port}")
    assert len(dialer) == 2  # One per endpoint, the least recently used closed past the bound.
    await dialer.close()
    assert len(dialer) == 0
