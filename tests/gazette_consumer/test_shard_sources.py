"""Message sources: an Application's own source, and waiting for upstream ACKs."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gazette_consumer.application import MessageSource, Shard
from gazette_consumer.checkpoint import Checkpoint, flatten_read_through
from gazette_consumer.message.message import Envelope
from gazette_consumer.sequencer.types import SequencerCheckpoint
from gazette_consumer.shard_runner import ShardRunner
from gazette_consumer.stores.base import Store
from tests.gazette_consumer.shard_testkit import (
    CountingApp,
    Event,
    Notifier,
    Producer,
    broker_env,
    read_checkpoint,
    read_counts,
    shard_env,
    shard_spec,
    sqlite_engine,
)

LISTED = "virtual/listed"


class ListSource:
    """A MessageSource over messages held in memory, as an Application might supply: message i
    occupies offsets [i, i + 1) of a virtual journal."""

    def __init__(self, keys: list[str], offset: int) -> None:
        self._keys = keys
        self._offset = offset
        self._never = asyncio.Event()

    async def next(self) -> Envelope[Any]:
        envelope = self.try_next()
        if envelope is None:
            await self._never.wait()
        assert envelope is not None
        return envelope

    def try_next(self) -> Envelope[Any] | None:
        if self._offset >= len(self._keys):
            return None
        begin = self._offset
        self._offset += 1
        message = Event(key=self._keys[begin], text=f"listed-{begin}")
        return Envelope.of(LISTED, begin, begin + 1, message)

    def checkpoint(self, horizon: int = 0) -> SequencerCheckpoint:
        return SequencerCheckpoint(read_through={LISTED: self._offset})

    def has_pending(self, since: Mapping[str, int]) -> bool:
        return False

    @property
    def in_sequence(self) -> bool:
        return False

    async def close(self) -> None:
        return None


@dataclass
class ListApp(CountingApp):
    keys: list[str] = field(default_factory=list)

    def new_message_source(
        self, shard: Shard, store: Store, checkpoint: Checkpoint
    ) -> MessageSource | None:
        offset = flatten_read_through(checkpoint).get(LISTED, 0)
        return ListSource(self.keys, offset)


async def test_an_application_may_supply_its_own_source(tmp_path: Path) -> None:
    async with broker_env() as env, sqlite_engine(tmp_path) as engine:
        app = ListApp(engine, keys=["a", "b", "a"])
        changed = Notifier()
        spec = shard_spec("shard-list", [])
        async with ShardRunner(app, env.client, root="/test/list") as runner:
            handle = runner.start(spec, on_change=changed.notify)
            await changed.until(lambda: handle.progress().read_through.get(LISTED, 0) == 3)
            await runner.stop("shard-list")
            # A restart resumes the source from the checkpoint: nothing is consumed twice.
            app.keys.append("c")
            handle = runner.start(spec, on_change=changed.notify)
            await changed.until(lambda: handle.progress().read_through.get(LISTED, 0) == 4)
        assert await read_counts(engine, "shard-list") == {"a": 2, "b": 1, "c": 1}
        assert [text for _, text, _ in app.consumed] == [f"listed-{i}" for i in range(4)]
        checkpoint = await read_checkpoint(engine, runner.fqn("shard-list"))
        assert checkpoint is not None and flatten_read_through(checkpoint) == {LISTED: 4}


async def _upstream_ack_run(tmp_path: Path, *, wait_for_ack: bool) -> CountingApp:
    """An upstream transaction is pending when a committed message arrives; its ACK follows
    once the shard consumed that message (or, if it does not wait, committed it)."""
    async with shard_env(tmp_path) as (env, engine, appends):
        journal = await env.journal("in/upstream")
        app = CountingApp(engine)
        changed = Notifier()
        upstream, plain = Producer(appends, "txn"), Producer(appends, "plain")
        spec = shard_spec(
            "shard-up", [journal], max_txn_s=30.0, disable_wait_for_ack=not wait_for_ack
        )
        async with ShardRunner(app, env.client, root="/test/upstream") as runner:
            handle = runner.start(spec, on_change=changed.notify)
            await upstream.uncommitted(journal, "b")
            await plain.committed(journal, "a")
            if wait_for_ack:
                await app.events.until(lambda: app.consumed_total == 1)
            else:
                await app.events.until(lambda: len(app.finishes) == 1)
            acks = await upstream.acknowledge()
            end = (await acks[0]).commit.end
            await changed.read_through(handle, journal, end)
        assert await read_counts(engine, "shard-up") == {"a": 1, "b": 1}
        return app


async def test_a_transaction_waits_for_a_pending_upstream_ack(tmp_path: Path) -> None:
    app = await _upstream_ack_run(tmp_path, wait_for_ack=True)
    # "a" and the upstream transaction's "b" were consumed in one transaction.
    assert [text for _, text, _ in app.consumed] == ["plain-1", "txn-1"]
    assert app.begins == len(app.finishes) == 1


async def test_disable_wait_for_ack_commits_without_waiting(tmp_path: Path) -> None:
    app = await _upstream_ack_run(tmp_path, wait_for_ack=False)
    assert [text for _, text, _ in app.consumed] == ["plain-1", "txn-1"]
    assert app.begins == len(app.finishes) == 2


class SteppingClock:
    """A monotonic clock that moves a second forward every time it is read: every transaction
    timer is past due whenever the loop looks at it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


async def test_one_upstream_ack_is_consumed_in_one_transaction(tmp_path: Path) -> None:
    async with shard_env(tmp_path) as (env, engine, appends):
        journal = await env.journal("in/grouped")
        app = CountingApp(engine)
        changed = Notifier()
        upstream, plain = Producer(appends, "txn"), Producer(appends, "plain")
        spec = shard_spec("shard-group", [journal], max_txn_s=0.5)
        # Three committed messages appended together: each is a sequence of its own.
        await plain.committed_together(journal, [Event(key="p", text=f"p{i}") for i in range(3)])
        # Twenty messages of one upstream transaction, committed by one ACK.
        for _ in range(20):
            await upstream.uncommitted(journal, "t")
        end = (await (await upstream.acknowledge())[0]).commit.end
        async with ShardRunner(
            app, env.client, root="/test/grouped", clock=SteppingClock()
        ) as runner:
            handle = runner.start(spec, on_change=changed.notify)
            await changed.read_through(handle, journal, end)
        assert await read_counts(engine, "shard-group") == {"p": 3, "t": 20}
        # The timers expire at every look: each plain message closed its own transaction, but
        # the twenty messages of the ACK stayed together in one.
        assert app.begins == len(app.finishes) == 4
