"""Stat(read_through=...) of a real primary returns once the shard has read through the
requested offsets, whether or not what lies before them delivers a message: a duplicate, a
re-appended ACK, an abandoned transaction and a rolled-back one all end the journal here, and
none of them begins a consumer transaction. Real broker, member, shard runner and SQLite."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.protocol import consumer_pb2 as cpb
from gazette_consumer.shard_client import ShardClient
from gazette_consumer.shard_runner import ShardRunner
from tests.gazette_consumer.consumer_testkit import Group
from tests.gazette_consumer.shard_testkit import (
    JSON,
    CountingApp,
    Event,
    Producer,
    read_counts,
    shard_env,
    shard_spec,
    to,
)

Code = cpb.ReplicaStatus.Code
# Far more than reading a few hundred bytes takes; on the old code a Stat waited forever.
STAT_WAIT_S = 15.0


@pytest.fixture
async def group() -> AsyncIterator[Group]:
    g = await Group.open()
    try:
        yield g
    finally:
        await g.close()


async def test_stat_returns_once_non_delivering_content_was_read(
    group: Group, tmp_path: Path
) -> None:
    async with shard_env(tmp_path) as (env, engine, appends):
        source = await env.journal("in/stat")
        spec = shard_spec("shard-stat", [source])
        app = CountingApp(engine)
        producer = Producer(appends, "p")
        async with ShardRunner(app, env.client, root="/test/stat") as runner:
            node = await group.join("zone-a", "consumer-a", start_shard=runner.start_shard)
            await group.put_shard(spec)

            def serving() -> str | None:
                status = runner.statuses().get(spec.id)
                return None if status and status.code == Code.PRIMARY else f"{status}"

            await group.until(serving)
            async with ShardClient(node.member.endpoint, timeout_s=STAT_WAIT_S) as shards:

                async def stat_through(end: int) -> None:
                    response = await shards.stat(spec.id, {source: end})
                    assert response.read_through[source] >= end

                # A delivered message, then a duplicate of it (the same UUID appended again,
                # as a retried append does): the duplicate delivers nothing.
                message = Event(key="k", text="once")
                delivered = await producer.publisher.publish_committed(to(source), message)
                await stat_through((await delivered).commit.end)
                duplicate = await appends.start_append(source)
                duplicate.write(JSON.marshal(message))
                duplicate.release()
                await stat_through((await duplicate).commit.end)

                # An acknowledged transaction, then its ACK appended again (what a recovering
                # consumer does with the ACK intents of its checkpoint).
                await producer.uncommitted(source, "t")
                [ack] = await producer.acknowledge()
                await stat_through((await ack).commit.end)
                [again] = await producer.publisher.write_ack_intents(producer._last_acks)
                await stat_through((await again).commit.end)

                # A transaction rolled back (its producer's earlier ACK appended again).
                await producer.uncommitted(source, "rolled-back")
                [rollback] = await producer.roll_back()
                await stat_through((await rollback).commit.end)

                # A transaction abandoned: its producer never acknowledges it.
                abandoned = await producer.publisher.publish_uncommitted(
                    to(source), Event(key="a", text="abandoned")
                )
                await stat_through((await abandoned).commit.end)

            assert await read_counts(engine, spec.id) == {"k": 1, "t": 1}
            assert app.consumed_total == 2
            await node.member.stop(graceful=False)
