"""Message sources: an Application's own source, and waiting for upstream ACKs."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from broker.protocol import consumer_pb2 as cpb
from gazette_consumer.application import MessageSource, Shard
from gazette_consumer.checkpoint import Checkpoint, flatten_read_through
from gazette_consumer.message.message import Envelope
from gazette_consumer.sequencer.types import SequencerCheckpoint
from gazette_consumer.shard_runner import ShardRetryPolicy, ShardRunner
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

Code = cpb.ReplicaStatus.Code
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


class BreakingSource(ListSource):
    """A misbehaving Application's source: once its messages are taken, `next()` fails at
    once, or (while `app.fail_on_cancel`) when it is cancelled, breaking the "cancellable"
    contract; and `close()` fails."""

    def __init__(self, app: BreakingApp) -> None:
        super().__init__(["a", "b"], 0)
        self.app = app

    async def next(self) -> Envelope[Any]:
        envelope = self.try_next()
        if envelope is not None:
            return envelope
        if self.app.stray_cancel:
            # It awaits a future another task cancelled: CancelledError, not a stop.
            other = asyncio.get_running_loop().create_future()
            other.cancel()
            await other
        if not self.app.wait_for_messages:
            raise RuntimeError("the source broke")
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if self.app.fail_on_cancel:
                raise ConnectionError("the source broke as it was cancelled") from None
            raise  # The shard's own cancellations of a read, which it does routinely.
        raise AssertionError("unreachable: the event is never set")

    async def close(self) -> None:
        raise ConnectionError("the source failed to close too")


@dataclass
class BreakingApp(CountingApp):
    wait_for_messages: bool = False
    fail_on_cancel: bool = False
    stray_cancel: bool = False

    def new_message_source(
        self, shard: Shard, store: Store, checkpoint: Checkpoint
    ) -> MessageSource | None:
        return BreakingSource(self)


async def test_a_source_failing_to_close_never_hides_why_its_shard_failed(
    tmp_path: Path,
) -> None:
    async with broker_env() as env, sqlite_engine(tmp_path) as engine:
        changed = Notifier()
        async with ShardRunner(BreakingApp(engine), env.client, root="/test/breaking") as runner:
            handle = runner.start(shard_spec("shard-breaking", []), on_change=changed.notify)
            await changed.until(lambda: handle.status().code == Code.FAILED)
        [error] = handle.status().errors
        # The reading error, a bug of the application (permanent): not the close's, which
        # would have been retried as a connection error.
        assert "reading messages: RuntimeError: the source broke" in error
        assert handle.retrying is None


async def test_a_source_raising_cancelled_error_fails_its_shard(tmp_path: Path) -> None:
    """Before, the read ended cancelled, the loop took it for one it had stopped and read
    again, at once, for ever: the shard reported PRIMARY, served nothing and logged nothing
    (found by the bad-input audit, 2026-11-30)."""
    async with broker_env() as env, sqlite_engine(tmp_path) as engine:
        changed = Notifier()
        app = BreakingApp(engine, stray_cancel=True)
        retry = ShardRetryPolicy(initial_s=0.01, max_s=0.01, attempts_max=2)  # Transient.
        async with ShardRunner(app, env.client, root="/test/breaking", retry=retry) as runner:
            handle = runner.start(shard_spec("shard-stray", []), on_change=changed.notify)
            await changed.until(lambda: handle.status().code == Code.FAILED)
        [error] = handle.status().errors
        assert "reading messages: StrayCancelledError: raised CancelledError while" in error
        assert await read_counts(engine, "shard-stray") == {"a": 1, "b": 1}


async def test_a_source_failing_as_its_shard_stops_lets_it_stop(tmp_path: Path) -> None:
    async with broker_env() as env, sqlite_engine(tmp_path) as engine:
        app = BreakingApp(engine, wait_for_messages=True)
        changed = Notifier()
        async with ShardRunner(app, env.client, root="/test/breaking") as runner:
            handle = runner.start(shard_spec("shard-stopping", []), on_change=changed.notify)
            await changed.until(lambda: handle.progress().read_through.get(LISTED, 0) == 2)
            # The stop's cancellation meets a read and a close that fail (transiently, by
            # their types): the shard stops all the same, neither retried nor FAILED, and the
            # cancellation itself reached the runner (no failure stood in for it).
            app.fail_on_cancel = True
            with structlog.testing.capture_logs() as logs:
                await asyncio.wait_for(runner.stop("shard-stopping"), 10)
            assert handle.retrying is None and handle.status().code != Code.FAILED
        assert await read_counts(engine, "shard-stopping") == {"a": 1, "b": 1}
        events = [log["event"] for log in logs]
        assert "source.close failed too, as the shard stopped" in events
        assert "shard failed as it stopped" not in events
