"""Shard metrics (gazette_consumer.metrics): what a started commit records, how its outcome
(durable, failed, abandoned) is recorded, read-through offsets, and the /debug/metrics endpoint;
how long a shard's series live (until its last use in the process closes: a runner's shard that
stopped, failed or retried, two users of one shard ID). (A consumer process counting for real,
and its metrics over HTTP: test_consumer_runner.py; a member's shard leaving the process:
test_consumer_member.py.)

The collectors are process-wide, so each test uses a shard ID of its own and reads values
before and after."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from broker.metrics import value_of
from broker.protocol import consumer_pb2 as cpb
from broker.topology import item_key
from gazette_consumer.metrics import (
    COMMIT_FAILURES,
    COMMIT_LATENCY,
    MESSAGES,
    READ_THROUGH,
    TRANSACTIONS,
    TXN_DURATION,
    ShardMetrics,
    serve_metrics,
)
from gazette_consumer.shard_runner import ShardRetryPolicy, ShardRunner
from gazette_consumer.stores.base import FencedError, OpFuture
from gazette_consumer.transaction import ClosedTxn
from tests.broker.broker_testkit import ROOT, wait_until
from tests.gazette_consumer.shard_testkit import (
    WAIT_S,
    CountingApp,
    Event,
    Notifier,
    Producer,
    broker_env,
    shard_env,
    shard_spec,
    sqlite_engine,
)

Code = cpb.ReplicaStatus.Code


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


def series_of(shard: str) -> list[str]:
    """The samples of `shard` that the registry exports (their names), from every per-shard
    metric: empty once its series were dropped."""
    metrics = (TRANSACTIONS, MESSAGES, TXN_DURATION, COMMIT_LATENCY, COMMIT_FAILURES, READ_THROUGH)
    return sorted(
        sample.name
        for metric in metrics
        for family in metric.collect()
        for sample in family.samples
        if sample.labels.get("shard") == shard
    )


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


# --- How long a shard's series live ----------------------------------------------------------


async def test_two_users_of_a_shard_keep_its_series_until_the_last_closes() -> None:
    shard = "metrics-two-users"
    loop = asyncio.get_running_loop()
    first, second = ShardMetrics(shard), ShardMetrics(shard)
    first.commit_started(closed(2, 0.0, 0.0), loop.create_future())
    second.progressed({"in/a": 10})
    first.close()
    # The other still records, into series still exported.
    second.commit_started(closed(3, 0.0, 0.0), loop.create_future())
    second.progressed({"in/a": 20})
    assert sample("gazette_consumer_shard_transactions_total", shard) == 2
    assert sample("gazette_consumer_shard_messages_total", shard) == 5
    assert sample("gazette_consumer_shard_read_through_bytes", shard, journal="in/a") == 20
    first.close()  # Closing twice is closing once: the second still holds them.
    assert "gazette_consumer_shard_transactions_total" in series_of(shard)
    with ShardMetrics(shard) as third:  # A third comes and goes meanwhile.
        third.progressed({"in/b": 1})
    assert sample("gazette_consumer_shard_read_through_bytes", shard, journal="in/b") == 1
    second.close()
    assert series_of(shard) == []
    # Back again: its series start afresh.
    with ShardMetrics(shard) as again:
        assert sample("gazette_consumer_shard_transactions_total", shard) == 0
        again.commit_started(closed(1, 0.0, 0.0), loop.create_future())
        assert sample("gazette_consumer_shard_transactions_total", shard) == 1
    assert series_of(shard) == []


async def test_a_runner_that_exits_leaves_no_series_of_its_shard(tmp_path: Path) -> None:
    shard = "metrics-runner-exits"
    async with shard_env(tmp_path) as (env, engine, appends):
        journal = await env.journal("in/metrics-runner-exits")
        changed = Notifier()
        producer = Producer(appends, "p")
        async with ShardRunner(CountingApp(engine), env.client, root="/test/m-exits") as runner:
            handle = runner.start(shard_spec(shard, [journal]), on_change=changed.notify)
            end = (await (await producer.committed(journal, "k"))).commit.end
            await changed.read_through(handle, journal, end)
            assert sample("gazette_consumer_shard_transactions_total", shard) >= 1
            assert (
                sample("gazette_consumer_shard_read_through_bytes", shard, journal=journal) == end
            )
        # Leaving the runner cancelled the shard's transaction loop, its last user.
        assert series_of(shard) == []


async def test_two_runners_of_one_shard_id_keep_its_series_until_both_stopped(
    tmp_path: Path,
) -> None:
    shard = "metrics-two-runners"
    transactions = "gazette_consumer_shard_transactions_total"
    async with shard_env(tmp_path) as (env, engine, appends):
        journal = await env.journal("in/metrics-two-runners")
        changed = Notifier()
        producer = Producer(appends, "p")
        spec = shard_spec(shard, [journal])
        async with ShardRunner(CountingApp(engine), env.client, root="/test/m-two-b") as b:
            second = b.start(spec, on_change=changed.notify)
            async with ShardRunner(CountingApp(engine), env.client, root="/test/m-two-a") as a:
                first = a.start(spec, on_change=changed.notify)
                end = (await (await producer.committed(journal, "k"))).commit.end
                await changed.read_through(first, journal, end)
                await changed.read_through(second, journal, end)
            # The first runner is gone; the second still exports and records.
            assert sample(transactions, shard) >= 2
            before = sample(transactions, shard)
            end = (await (await producer.committed(journal, "k"))).commit.end
            await changed.read_through(second, journal, end)
            assert sample(transactions, shard) > before
            assert (
                sample("gazette_consumer_shard_read_through_bytes", shard, journal=journal) == end
            )
        assert series_of(shard) == []


async def test_a_failed_shard_keeps_its_series_until_stopped(tmp_path: Path) -> None:
    shard = "metrics-failed-shard"
    async with shard_env(tmp_path) as (env, engine, appends):
        journal = await env.journal("in/metrics-failed-shard")
        changed = Notifier()
        producer = Producer(appends, "p")
        spec = shard_spec(shard, [journal])
        async with ShardRunner(CountingApp(engine), env.client, root="/test/m-failed") as runner:
            handle = runner.start(spec, on_change=changed.notify)
            end = (await (await producer.committed(journal, "k"))).commit.end
            await changed.read_through(handle, journal, end)
            # The application raises: the shard fails for good, its transaction loop ended.
            await producer.committed_together(journal, [Event(key="k", text="poison")])
            await changed.until(lambda: handle.status().code == Code.FAILED)
            # Its read-through is still exported (its lag keeps showing) until it is stopped.
            assert (
                sample("gazette_consumer_shard_read_through_bytes", shard, journal=journal) == end
            )
            await runner.stop(shard)
            assert series_of(shard) == []

            # Started again (it fails on the poison again), then replaced by a third start
            # without a stop: each replica lets go of the series, the last at the runner's exit.
            for _ in range(2):
                again = runner.start(spec)
                async with asyncio.timeout(WAIT_S):
                    await again.wait_stopped()  # Failed for good: it may be started again.
                assert again.status().code == Code.FAILED
                assert "gazette_consumer_shard_transactions_total" in series_of(shard)
        assert series_of(shard) == []


async def test_a_retrying_shard_keeps_its_series_between_attempts(tmp_path: Path) -> None:
    shard = "metrics-retrying"
    async with broker_env() as env, sqlite_engine(tmp_path) as engine:
        changed = Notifier()
        # The first attempt fails once its transaction loop runs (its source journal is
        # deleted: JOURNAL_NOT_FOUND), a transient failure, retried after a back-off long
        # enough to look at the series meanwhile.
        policy = ShardRetryPolicy(initial_s=600.0, max_s=600.0, attempts_max=3)
        journal = "in/metrics-deleted"
        await env.journal(journal)
        async with ShardRunner(
            CountingApp(engine), env.client, root="/test/m-retry", retry=policy
        ) as runner:
            spec = shard_spec(shard, [journal])
            handle = runner.start(spec, on_change=changed.notify)
            await wait_until(
                lambda: handle.primary is not None and handle.primary.txn_phase is not None
            )
            await env.cluster.assign(journal, [])
            await env.cluster.admin.delete(item_key(ROOT, journal).encode())
            await changed.until(lambda: handle.retrying is not None)
            assert "JOURNAL_NOT_FOUND" in str(handle.retrying)
            assert handle.status().code == Code.BACKFILL
            # The attempt's transaction loop ended; the replica still holds its series.
            assert "gazette_consumer_shard_transactions_total" in series_of(shard)
        assert series_of(shard) == []
