"""PartitionsWatch over a real broker's List watch: the journals a label selector picks, with
their content types, kept current as journals are added; and a watch that keeps failing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from broker.client.list_apply import watch_journals
from broker.client.route_cache import JournalClient
from broker.protocol import protocol_pb2 as pb
from gazette_consumer.message import CONTENT_TYPE_CSV, CONTENT_TYPE_JSON_LINES
from gazette_consumer.message.mapping import (
    Partition,
    PartitionsWatch,
    PartitionsWatchError,
    rendezvous_mapping,
)
from tests.broker.broker_testkit import Cluster, journal_spec


def labelled(name: str, app: str, content_type: str) -> pb.JournalSpec:
    spec = journal_spec(name)
    spec.labels.labels.add(name="app", value=app)
    spec.labels.labels.add(name="content-type", value=content_type)
    return spec


@pytest.fixture
async def env() -> AsyncIterator[tuple[Cluster, JournalClient]]:
    cluster = Cluster()
    client: JournalClient | None = None
    try:
        broker = await cluster.start_broker("zone-a", "broker-a")
        client = JournalClient(broker.endpoint)
        yield cluster, client
    finally:
        if client is not None:
            await client.close()
        await cluster.close()


async def test_a_watch_follows_the_journals_of_a_selector(
    env: tuple[Cluster, JournalClient],
) -> None:
    cluster, client = env
    await cluster.put_spec(labelled("test/orders-1", "orders", CONTENT_TYPE_JSON_LINES))
    await cluster.put_spec(labelled("test/orders-0", "orders", CONTENT_TYPE_CSV))
    await cluster.put_spec(labelled("test/other-0", "other", CONTENT_TYPE_JSON_LINES))
    watch = PartitionsWatch(lambda: watch_journals(client, "app=orders"))
    mapping = rendezvous_mapping(lambda key: key, watch)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(watch.run())
        first = await asyncio.wait_for(watch.ready(), 10)
        assert list(first) == [
            Partition("test/orders-0", CONTENT_TYPE_CSV),
            Partition("test/orders-1", CONTENT_TYPE_JSON_LINES),
        ]
        before = {key: mapping(key) for key in (f"key-{i}" for i in range(200))}

        await cluster.put_spec(labelled("test/orders-2", "orders", CONTENT_TYPE_JSON_LINES))
        added = Partition("test/orders-2", CONTENT_TYPE_JSON_LINES)
        async with asyncio.timeout(10):
            while added not in watch():
                await watch.next_snapshot()
        assert list(watch())[-1] == added and watch.snapshots >= 2
        after = {key: mapping(key) for key in before}
        moved = [key for key in before if after[key] != before[key]]
        assert moved and all(after[key] == added for key in moved)
        task.cancel()


async def test_a_watch_that_never_delivers_gives_up() -> None:
    attempts = 0
    sleeps: list[float] = []

    async def failing() -> AsyncIterator[pb.ListResponse]:
        nonlocal attempts
        attempts += 1
        raise ConnectionError("broker unreachable")
        yield pb.ListResponse()  # pragma: no cover -- makes this an async generator.

    async def ending() -> AsyncIterator[pb.ListResponse]:
        return
        yield pb.ListResponse()  # pragma: no cover

    async def record(delay: float) -> None:
        sleeps.append(delay)

    watch = PartitionsWatch(failing, attempts_max=3, sleep=record)
    with pytest.raises(ConnectionError):
        await watch.run()
    assert attempts == 3 and len(sleeps) == 2 and sleeps[0] < sleeps[1]
    with pytest.raises(PartitionsWatchError, match="3 times"):
        await PartitionsWatch(ending, attempts_max=3, sleep=record).run()
    with pytest.raises(ValueError):
        PartitionsWatch(ending, attempts_max=0)
