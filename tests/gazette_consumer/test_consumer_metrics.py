"""Shard metrics (gazette_consumer.metrics): what a started commit records, how its outcome
(durable, failed, abandoned) is recorded, read-through offsets, and the /debug/metrics endpoint.
(A consumer process counting for real, and its metrics over HTTP: test_consumer_runner.py.)

The collectors are process-wide, so each test uses a shard ID of its own and reads values
before and after."""

from __future__ import annotations

import asyncio

import aiohttp

from broker.metrics import value_of
from gazette_consumer.metrics import ShardMetrics, serve_metrics
from gazette_consumer.stores.base import FencedError, OpFuture
from gazette_consumer.transaction import ClosedTxn


def closed(consumed: int, began_at: float, started_at: float) -> ClosedTxn:
    return ClosedTxn(
        sequence=1,
        consumed=consumed,
        began_at=began_at,
        stalled_at=started_at,
        closed_at=started_at,
        commit_started_at=started_at,
    )


async def settled(*futures: OpFuture) -> None:
    """Return once the done callbacks registered earlier on `futures` (the metrics') ran: a
    future's callbacks run in registration order, so ours runs after theirs."""
    for future in futures:
        ran = asyncio.Event()

        def on_done(_future: OpFuture, ran: asyncio.Event = ran) -> None:
            ran.set()

        future.add_done_callback(on_done)
        await ran.wait()


def sample(name: str, shard: str, **extra: str) -> float:
    return value_of(name, {"shard": shard, **extra})


async def test_a_durable_commit_counts_its_transaction_messages_and_latency() -> None:
    shard = "metrics-durable"
    metrics = ShardMetrics(shard)
    commit: OpFuture = asyncio.get_running_loop().create_future()
    metrics.commit_started(closed(7, 10.0, 10.5), commit)
    metrics.commit_started(closed(3, 11.0, 11.25), asyncio.get_running_loop().create_future())
    assert sample("gazette_consumer_shard_transactions_total", shard) == 2
    assert sample("gazette_consumer_shard_messages_total", shard) == 10
    assert sample("gazette_consumer_shard_txn_duration_seconds_count", shard) == 2
    assert sample("gazette_consumer_shard_txn_duration_seconds_sum", shard) == 0.75
    latency = "gazette_consumer_shard_commit_latency_seconds_count"
    assert sample(latency, shard) == 0  # Not durable yet.
    commit.set_result(None)
    await settled(commit)
    assert sample(latency, shard) == 1
    assert sample("gazette_consumer_shard_commit_failures_total", shard) == 0


async def test_failed_and_abandoned_commits() -> None:
    shard = "metrics-failed"
    metrics = ShardMetrics(shard)
    loop = asyncio.get_running_loop()
    fenced: OpFuture = loop.create_future()
    abandoned: OpFuture = loop.create_future()
    metrics.commit_started(closed(1, 0.0, 0.0), fenced)
    metrics.commit_started(closed(1, 0.0, 0.0), abandoned)
    fenced.set_exception(FencedError("fenced"))
    abandoned.cancel()
    await settled(fenced, abandoned)
    assert fenced.exception() is not None
    assert sample("gazette_consumer_shard_commit_failures_total", shard) == 1
    assert sample("gazette_consumer_shard_commit_latency_seconds_count", shard) == 0


async def test_read_through_is_exposed_per_journal_over_http() -> None:
    shard = "metrics-http"
    ShardMetrics(shard).progressed({"in/a": 1234, "in/b": 0})
    assert sample("gazette_consumer_shard_read_through_bytes", shard, journal="in/a") == 1234
    runner, port = await serve_metrics("127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/debug/metrics") as response:
                assert response.status == 200
                text = await response.text()
            async with http.get(f"http://127.0.0.1:{port}/nothing") as response:
                assert response.status == 404
    finally:
        await runner.cleanup()
    line = 'gazette_consumer_shard_read_through_bytes{journal="in/a",shard="metrics-http"} 1234.0'
    assert line in text.splitlines()
