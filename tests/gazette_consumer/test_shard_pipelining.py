"""Pipelining is real: transaction N+1 consumes while N's commit is held back, does not start
its own commit before N's resolves, and N's ACK intents land only after N's commit."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gazette_consumer.message.uuid import Flag, get_flags, get_producer_id
from gazette_consumer.shard_runner import ShardRunner
from gazette_consumer.transaction import TxnPhase
from tests.gazette_consumer.shard_testkit import (
    WAIT_S,
    CountingApp,
    GatedStore,
    Notifier,
    Producer,
    journal_frames,
    read_committed,
    read_counts,
    shard_env,
    shard_spec,
)


async def test_next_transaction_consumes_while_the_prior_commit_is_held(tmp_path: Path) -> None:
    async with shard_env(tmp_path) as (env, engine, appends):
        source = await env.journal("in/pipelined")
        output = await env.journal("out/pipelined")
        app = CountingApp(engine, output=output, hold_commits=2)
        changed = Notifier()
        producer = Producer(appends, "p")
        # A short maximum, so that transaction 2 reaches it while commit 1 is held, and stalls.
        spec = shard_spec("shard-pipe", [source], max_txn_s=0.3)
        async with ShardRunner(app, env.client, root="/test/pipelining") as runner:
            handle = runner.start(spec, on_change=changed.notify)

            # Transaction 1: one message; its commit starts and is held.
            await producer.committed(source, "a")
            await app.events.until(lambda: "shard-pipe" in app.stores)
            store = app.stores["shard-pipe"]
            assert isinstance(store, GatedStore)
            await store.started.until(lambda: len(store.commits) == 1)
            primary = handle.primary
            assert primary is not None
            shard_producer = primary.publisher.producer_id

            # Its derived message is appended (the commit waits for it)...
            await asyncio.wait_for(asyncio.gather(*store.wait_fors[0]), WAIT_S)
            frames = journal_frames(env.broker, output)
            assert [get_flags(f.uuid) for f in frames] == [Flag.CONTINUE_TXN]
            # ...but not acknowledged: the ACK waits for the commit.

            # Transaction 2 consumes while commit 1 is held.
            await producer.committed(source, "b")
            await producer.committed(source, "b")
            await app.events.until(lambda: [t for _, t, _ in app.consumed] == ["p-1", "p-2", "p-3"])
            assert [done for _, _, done in app.consumed[1:]] == [(False,), (False,)]

            # It reaches its maximum duration and stalls: its commit must not start before
            # commit 1 resolved.
            await asyncio.wait_for(
                primary.wait_until(lambda p: p.txn_phase is TxnPhase.STALLED), WAIT_S
            )
            assert len(store.commits) == 1 and not store.commits[0].done()
            assert not any(
                get_flags(f.uuid) == Flag.ACK_TXN for f in journal_frames(env.broker, output)
            )

            # Releasing commit 1 lets its ACK land, then transaction 2 starts to commit.
            store.release(0)
            await store.started.until(lambda: len(store.commits) == 2)
            assert store.done_at_start == [(), (True,)]
            acks = [
                f for f in journal_frames(env.broker, output) if get_flags(f.uuid) == Flag.ACK_TXN
            ]
            assert [get_producer_id(f.uuid) for f in acks] == [shard_producer]
            assert handle.progress().publish_at[output] > 0

            store.release(1)
            end = (await (await producer.committed(source, "c"))).commit.end
            await changed.until(lambda: handle.progress().read_through.get(source, 0) >= end)

        assert await read_counts(engine, "shard-pipe") == {"a": 1, "b": 2, "c": 1}
        derived = await read_committed(env.client, output, until_count=4)
        assert sorted(e.message.key for e in derived) == ["a", "b", "b", "c"]
