"""A shard end to end on one broker and SQLite: counting, checkpoints, recovery, hooks, specs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker.protocol import consumer_pb2 as cpb
from broker.protocol.validate import ValidationError
from gazette_consumer.checkpoint import flatten_read_through
from gazette_consumer.shard_handle import ShardRole
from gazette_consumer.shard_runner import ShardRunner, run_shards
from tests.gazette_consumer.shard_testkit import (
    WAIT_S,
    CountingApp,
    Notifier,
    Producer,
    broker_env,
    read_checkpoint,
    read_counts,
    shard_env,
    shard_spec,
    sqlite_engine,
)


async def test_counts_committed_messages_and_checkpoints_offsets(tmp_path: Path) -> None:
    async with shard_env(tmp_path) as (env, engine, appends):
        journal = await env.journal("in/basic")
        app = CountingApp(engine)
        changed = Notifier()
        producer = Producer(appends, "p")
        async with ShardRunner(app, env.client, root="/test/basic") as runner:
            handle = runner.start(shard_spec("shard-1", [journal]), on_change=changed.notify)
            for i in range(30):
                await producer.committed(journal, f"k{i % 3}")
            last = await producer.committed(journal, "k0")
            end = (await last).commit.end
            await changed.read_through(handle, journal, end)
            assert handle.status().code == cpb.ReplicaStatus.PRIMARY
        assert await read_counts(engine, "shard-1") == {"k0": 11, "k1": 10, "k2": 10}
        checkpoint = await read_checkpoint(engine, runner.fqn("shard-1"))
        assert checkpoint is not None
        assert flatten_read_through(checkpoint) == {journal: end}
        # Every begun transaction was finished with its commit, which succeeded.
        assert app.begins == len(app.finishes) >= 1
        assert all(f.done() and f.exception() is None for f in app.finishes)


async def test_restart_resumes_from_the_checkpoint(tmp_path: Path) -> None:
    async with shard_env(tmp_path) as (env, engine, appends):
        journal = await env.journal("in/resume")
        app = CountingApp(engine)
        changed = Notifier()
        producer = Producer(appends, "p")
        spec = shard_spec("shard-1", [journal])
        async with ShardRunner(app, env.client, root="/test/resume") as runner:
            handle = runner.start(spec, on_change=changed.notify)
            end = (await (await producer.committed(journal, "a"))).commit.end
            await changed.read_through(handle, journal, end)
            await runner.stop("shard-1")
            consumed_before = app.consumed_total

            end = (await (await producer.committed(journal, "b"))).commit.end
            handle = runner.start(spec, on_change=changed.notify)
            await changed.read_through(handle, journal, end)
        # The restarted shard read on from its checkpoint: "a" was not consumed again.
        assert [text for _, text, _ in app.consumed[consumed_before:]] == ["p-2"]
        assert await read_counts(engine, "shard-1") == {"a": 1, "b": 1}


async def test_min_offset_skips_earlier_content(tmp_path: Path) -> None:
    async with shard_env(tmp_path) as (env, engine, appends):
        journal = await env.journal("in/min-offset")
        producer = Producer(appends, "p")
        skipped = (await (await producer.committed(journal, "old"))).commit.end
        spec = shard_spec("shard-1", [journal])
        spec.sources[0].min_offset = skipped
        app = CountingApp(engine)
        changed = Notifier()
        async with ShardRunner(app, env.client, root="/test/min-offset") as runner:
            handle = runner.start(spec, on_change=changed.notify)
            end = (await (await producer.committed(journal, "new"))).commit.end
            await changed.read_through(handle, journal, end)
        assert await read_counts(engine, "shard-1") == {"new": 1}


async def test_invalid_spec_is_refused_before_anything_starts(tmp_path: Path) -> None:
    async with broker_env() as env, sqlite_engine(tmp_path) as engine:
        app = CountingApp(engine)
        async with ShardRunner(app, env.client, root="/test/invalid") as runner:
            bad = shard_spec("shard-1", ["in/x"])
            bad.max_txn_duration.Clear()
            with pytest.raises(ValidationError, match="max_txn_duration: must be > 0s"):
                runner.start(bad)
            too_big = shard_spec("shard-2", ["in/x"])
            too_big.ring_buffer_size = 1 << 30
            with pytest.raises(ValidationError, match="ring_buffer_size: must be <= "):
                runner.start(too_big)
            assert runner.statuses() == {}
        assert app.stores == {}


async def test_standby_serves_once_promoted(tmp_path: Path) -> None:
    async with shard_env(tmp_path) as (env, engine, appends):
        journal = await env.journal("in/standby")
        app = CountingApp(engine)
        changed = Notifier()
        producer = Producer(appends, "p")
        async with ShardRunner(app, env.client, root="/test/standby") as runner:
            handle = runner.start(
                shard_spec("shard-1", [journal]), role=ShardRole.STANDBY, on_change=changed.notify
            )
            await changed.until(lambda: handle.status().code == cpb.ReplicaStatus.STANDBY)
            end = (await (await producer.committed(journal, "k"))).commit.end
            assert app.stores == {}  # A standby opens no store.
            handle.promote()
            await changed.read_through(handle, journal, end)
            assert handle.status().code == cpb.ReplicaStatus.PRIMARY
        assert await read_counts(engine, "shard-1") == {"k": 1}


async def test_stop_is_idempotent_and_waits(tmp_path: Path) -> None:
    async with broker_env() as env, sqlite_engine(tmp_path) as engine:
        journal = await env.journal("in/stop")
        app = CountingApp(engine)
        async with ShardRunner(app, env.client, root="/test/stop") as runner:
            handle = runner.start(shard_spec("shard-1", [journal]))
            await asyncio.wait_for(handle.stop(), WAIT_S)
            await asyncio.wait_for(handle.stop(), WAIT_S)
            assert handle.primary is None
            # A stopped shard may be started again under the same ID.
            runner.start(shard_spec("shard-1", [journal]))


async def test_run_shards_serves_until_cancelled(tmp_path: Path) -> None:
    async with shard_env(tmp_path) as (env, engine, appends):
        journal = await env.journal("in/run-shards")
        app = CountingApp(engine)
        bad = shard_spec("shard-bad", [journal])
        bad.labels.labels.add(name="id", value="reserved")
        with pytest.raises(ValidationError, match="labels"):
            await run_shards(app, env.client, [shard_spec("shard-ok", [journal]), bad])
        assert app.stores == {}  # Nothing started: the whole set is validated first.

        serving = asyncio.create_task(
            run_shards(app, env.client, [shard_spec("shard-ok", [journal])], root="/test/run")
        )
        await Producer(appends, "p").committed(journal, "k")
        await app.events.until(lambda: len(app.finishes) == 1)
        await asyncio.wait_for(app.finishes[0], WAIT_S)  # The commit is durable.
        serving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await serving
        assert await read_counts(engine, "shard-ok") == {"k": 1}


async def test_an_error_in_the_runner_block_propagates_as_itself(tmp_path: Path) -> None:
    async with broker_env() as env, sqlite_engine(tmp_path) as engine:
        journal = await env.journal("in/block-error")
        with pytest.raises(KeyError, match="never started"):
            async with ShardRunner(CountingApp(engine), env.client, root="/test/err") as runner:
                runner.start(shard_spec("shard-1", [journal]))
                runner.shard("shard-2")
