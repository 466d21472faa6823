"""Clients whose remembered primary is gone (it exited or crashed): an Appender starts over at
the default broker before sending anything, `append()` and RetryReader forget the route of an
unreachable broker, and neither loops when the default broker is unreachable too."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest
from broker_testkit import Cluster, journal_spec

from broker.client.appender import Appender, append
from broker.client.retry_reader import RetryReader
from broker.client.route_cache import JournalClient
from broker.protocol import protocol_pb2 as pb
from broker.server import Broker

J = "redirect/journal"


def dead_endpoint() -> str:
    """An endpoint nothing listens on (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def stale_route(primary: pb.ProcessSpec.ID, endpoint: str) -> pb.Route:
    """The journal's route as a client remembers it: ``primary`` at ``endpoint``."""
    return pb.Route(members=[primary], primary=0, endpoints=[endpoint])


@pytest.fixture
async def served() -> AsyncIterator[tuple[Cluster, Broker]]:
    cluster = Cluster()
    try:
        broker = await cluster.start_broker("zone-a", "broker-a")
        await cluster.create(journal_spec(J), [broker])
        yield cluster, broker
    finally:
        await cluster.close()


async def test_appender_starts_over_at_the_default_broker(
    served: tuple[Cluster, Broker],
) -> None:
    _, broker = served
    client = JournalClient(broker.endpoint)
    client.routes.update(J, stale_route(broker.id, dead_endpoint()))
    async with Appender(client, pb.AppendRequest(journal=J)) as appender:
        await appender.write(b"hello")
    assert appender.response is not None and appender.response.commit.end == 5
    # The answer taught the current route.
    assert client.endpoint_for(J, require_primary=True) == broker.endpoint
    await client.close()


async def test_appender_does_not_loop_when_the_default_broker_is_unreachable() -> None:
    client = JournalClient(dead_endpoint())
    client.routes.update(
        J, stale_route(pb.ProcessSpec.ID(zone="zone-x", suffix="gone"), dead_endpoint())
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async with Appender(client, pb.AppendRequest(journal=J)) as appender:
            await appender.write(b"hello")
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert client.routes.get(J) is None  # Forgotten on the way.
    await client.close()


async def test_append_forgets_the_route_of_an_unreachable_broker(
    served: tuple[Cluster, Broker],
) -> None:
    _, broker = served
    # The default endpoint is unreachable at first: append() retries, and each retry first
    # forgets the route, then tries the primary it is taught (by the test) after a failure.
    client = JournalClient(dead_endpoint())
    taught: list[float] = []

    async def sleep(delay: float) -> None:
        taught.append(delay)
        assert client.routes.get(J) is None  # The failed attempt forgot it.
        client.routes.update(J, stale_route(broker.id, broker.endpoint))

    client.routes.update(J, stale_route(broker.id, dead_endpoint()))
    response = await append(client, pb.AppendRequest(journal=J), b"hello", sleep=sleep)
    assert response.commit.end == 5 and len(taught) == 1
    await client.close()


async def test_retry_reader_forgets_the_route_of_an_unreachable_broker(
    served: tuple[Cluster, Broker],
) -> None:
    cluster, broker = served
    assert (await cluster.append(broker, J, [b"some content"])).status == pb.OK
    client = JournalClient(broker.endpoint)
    client.routes.update(J, stale_route(broker.id, dead_endpoint()))

    async def sleep(delay: float) -> None:
        pass

    reader = RetryReader(client, pb.ReadRequest(journal=J, offset=0, end_offset=12), sleep=sleep)
    assert await reader.read() == b"some content"
    assert reader.restarts >= 1  # The first Read went to the dead endpoint.
    await reader.close()
    await client.close()
