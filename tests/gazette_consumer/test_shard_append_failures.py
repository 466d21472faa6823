"""A shard whose appends fail fails its transaction: it never commits a checkpoint past output
messages (or ACK intents) that were dropped, even when the append failed before the transaction
closed. Real in-process broker and SQLite."""

from __future__ import annotations

from pathlib import Path

from structlog.testing import capture_logs

from broker.protocol import consumer_pb2 as cpb
from broker.protocol import labels
from broker.protocol import protocol_pb2 as pb
from gazette_consumer.checkpoint import flatten_read_through
from gazette_consumer.message import CONTENT_TYPE_JSON_LINES
from gazette_consumer.shard_runner import ShardRunner
from tests.broker.broker_testkit import journal_spec
from tests.gazette_consumer.shard_testkit import (
    CountingApp,
    Notifier,
    Producer,
    read_checkpoint,
    read_counts,
    shard_env,
    shard_spec,
)

FAILED = cpb.ReplicaStatus.FAILED


async def test_an_output_append_that_fails_before_the_commit_fails_the_transaction(
    tmp_path: Path,
) -> None:
    async with shard_env(tmp_path) as (env, engine, appends):
        source = await env.journal("in/append-fails")
        # The output journal refuses appends (NOT_ALLOWED, not retried): the derived message's
        # batch fails at once, long before its transaction (of at least a second) closes.
        output = journal_spec("out/read-only", flags=pb.JournalSpec.O_RDONLY)
        output.labels.CopyFrom(labels.label_set([(labels.CONTENT_TYPE, CONTENT_TYPE_JSON_LINES)]))
        await env.cluster.create(output, [env.broker])
        app = CountingApp(engine, output=output.name)
        changed = Notifier()
        producer = Producer(appends, "p")
        spec = shard_spec("shard-o", [source], min_txn_s=1.0, max_txn_s=5.0)
        async with ShardRunner(app, env.client, root="/test/append-fails") as runner:
            handle = runner.start(spec, on_change=changed.notify)
            await producer.committed(source, "k")
            await changed.until(lambda: handle.status().code == FAILED)
        # Nothing of the transaction committed: no checkpoint past the consumed message (whose
        # derived output was dropped), no count.
        checkpoint = await read_checkpoint(engine, handle.fqn)
        assert checkpoint is None or flatten_read_through(checkpoint) == {}
        assert await read_counts(engine, "shard-o") == {}
        assert app.consumed_total == 1
        # The shard failed in its commit, naming the append's refusal.
        error = handle.status().errors[0]
        assert "store commit" in error and "NOT_ALLOWED" in error


async def test_stopping_a_shard_cancels_its_pending_appends_without_failure_logs(
    tmp_path: Path,
) -> None:
    async with shard_env(tmp_path) as (env, engine, appends):
        source = await env.journal("in/stop-pending")
        output = await env.journal("out/stop-pending")
        # Its first commit is held: the ACK intent queued behind it stays pending, and the
        # derived message too (the commit waits on it, but it is not held).
        app = CountingApp(engine, output=output, hold_commits=1)
        changed = Notifier()
        producer = Producer(appends, "p")
        with capture_logs() as logs:
            async with ShardRunner(app, env.client, root="/test/stop-pending") as runner:
                handle = runner.start(shard_spec("shard-s", [source]), on_change=changed.notify)
                await producer.committed(source, "k")
                await app.events.until(lambda: len(app.finishes) == 1)
                await runner.stop("shard-s")
        # The stop was the owner's choice: no append is reported as failed.
        assert [e["event"] for e in logs if e["log_level"] in ("warning", "error")] == []
        assert handle.status().code != FAILED
        checkpoint = await read_checkpoint(engine, handle.fqn)
        assert checkpoint is None or flatten_read_through(checkpoint) == {}
