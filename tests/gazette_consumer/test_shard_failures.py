"""Bad input and failing parts: the shard fails with the error visible and logged, nothing of its
open transaction commits, and the other shards of the runner keep running."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine
from structlog.testing import capture_logs

from broker.client.append_service import AsyncAppend
from broker.protocol import consumer_pb2 as cpb
from gazette_consumer.application import Shard
from gazette_consumer.checkpoint import equivalent
from gazette_consumer.message.message import Envelope
from gazette_consumer.message.publisher import Publisher
from gazette_consumer.shard_handle import ShardHandle
from gazette_consumer.shard_runner import ShardRetryPolicy, ShardRunner
from gazette_consumer.stores.base import Store
from gazette_consumer.stores.conformance import SimpleShard
from gazette_consumer.stores.sql import SQLStore
from tests.gazette_consumer.shard_testkit import (
    CountingApp,
    Event,
    Notifier,
    Producer,
    broker_env,
    read_checkpoint,
    read_committed,
    read_counts,
    shard_env,
    shard_spec,
    sqlite_engine,
    to,
)

FAILED = cpb.ReplicaStatus.FAILED
PRIMARY = cpb.ReplicaStatus.PRIMARY


async def test_poisoned_message_fails_only_its_shard_and_commits_nothing(tmp_path: Path) -> None:
    with capture_logs() as logs:
        await _poison_one_of_two_shards(tmp_path)
    # The failure is in the process's log, with the shard's ID.
    failures = [entry for entry in logs if entry["event"] == "shard failed"]
    assert len(failures) == 1
    assert failures[0]["log_level"] == "error"
    assert failures[0]["shard"] == "shard-a"
    assert "poison-1" in failures[0]["error"]


async def _poison_one_of_two_shards(tmp_path: Path) -> None:
    async with shard_env(tmp_path) as (env, engine, appends):
        in_a, in_b = await env.journal("in/poison-a"), await env.journal("in/poison-b")
        output = await env.journal("out/poison")
        app = CountingApp(engine, output=output)
        changed = Notifier()
        producer = Producer(appends, "p")
        # Shard A's transactions last at least a second, so that the good message appended with
        # the poison is surely consumed in the poison's transaction.
        spec_a = shard_spec("shard-a", [in_a], min_txn_s=1.0, max_txn_s=5.0)
        async with ShardRunner(app, env.client, root="/test/poison") as runner:
            a = runner.start(spec_a, on_change=changed.notify)
            b = runner.start(shard_spec("shard-b", [in_b]), on_change=changed.notify)

            async def committed(journal: str, *messages: Event) -> int:
                return (await (await producer.committed_together(journal, messages))).commit.end

            end_a = await committed(in_a, Event(key="x", text="first"))
            end_b = await committed(in_b, Event(key="y", text="first"))
            await changed.until(
                lambda: (
                    a.progress().read_through.get(in_a, 0) >= end_a
                    and b.progress().read_through.get(in_b, 0) >= end_b
                )
            )
            before = await read_checkpoint(engine, a.fqn)
            assert before is not None

            await committed(in_a, Event(key="x", text="good"), Event(key="x", text="poison-1"))
            await changed.until(lambda: a.status().code == FAILED)

            # The error is visible on the status (as Stat and List report it)...
            status = a.status()
            assert len(status.errors) == 1
            assert "shard shard-a: app.consume_message (in/poison-a offset" in status.errors[0]
            assert "PoisonError: refusing message 'poison-1'" in status.errors[0]
            assert runner.statuses()["shard-a"].code == FAILED
            # ...nothing of its transaction committed: neither the count of "good" nor the
            # checkpoint...
            assert await read_counts(engine, "shard-a") == {"x": 1}
            after = await read_checkpoint(engine, a.fqn)
            assert after is not None and equivalent(before, after)
            # ...and the other shard keeps committing.
            end_b = await committed(in_b, Event(key="y", text="second"))
            await changed.until(lambda: b.progress().read_through.get(in_b, 0) >= end_b)
            assert b.status().code == PRIMARY
            assert await read_counts(engine, "shard-b") == {"y": 2}

        # Downstream, the derived message of "good" was never committed.
        await producer.committed_together(output, [Event(key="end", text="marker")])
        derived = await read_committed(env.client, output, until_text="marker")
        assert sorted(e.message.key for e in derived) == ["end", "x", "y", "y"]


@dataclass
class FailingFinalizeApp(CountingApp):
    """Fails `finalize_txn` of its second transaction."""

    finalized: int = 0

    async def finalize_txn(
        self, shard: Shard, store: Store, publisher: Publisher[AsyncAppend]
    ) -> None:
        self.finalized += 1
        await super().finalize_txn(shard, store, publisher)  # Stages the counts...
        if self.finalized == 2:
            raise RuntimeError("flush failed")  # ...which must not commit.


@dataclass
class FailedOnSecond:
    """What `_fail_on_second` saw: the shard failed on its second message."""

    app: CountingApp
    handle: ShardHandle
    counts: dict[str, int]  # The shard's committed counts, after the failure.
    checkpoint_unchanged: bool  # Its checkpoint is still the one of its first message.


async def _fail_on_second(
    tmp_path: Path,
    name: str,
    new_app: Callable[[Engine, str], CountingApp],
    text: str,
    retry: ShardRetryPolicy | None = None,
) -> FailedOnSecond:
    """A shard of `new_app(engine, output journal)` commits a first message of key "k", then
    gets a second (of `text`) and must fail (after `retry`'s attempts if that is transient)."""
    async with shard_env(tmp_path) as (env, engine, appends):
        journal, output = await env.journal(f"in/{name}"), await env.journal(f"out/{name}")
        app = new_app(engine, output)
        changed = Notifier()
        producer = Producer(appends, "p")
        async with ShardRunner(app, env.client, root=f"/test/{name}", retry=retry) as runner:
            handle = runner.start(shard_spec(f"shard-{name}", [journal]), on_change=changed.notify)
            end = (await (await producer.committed(journal, "k"))).commit.end
            await changed.read_through(handle, journal, end)
            before = await read_checkpoint(engine, handle.fqn)
            await producer.committed_together(journal, [Event(key="k", text=text)])
            await changed.until(lambda: handle.status().code == FAILED)
        after = await read_checkpoint(engine, handle.fqn)
        unchanged = before is not None and after is not None and equivalent(before, after)
        return FailedOnSecond(app, handle, await read_counts(engine, f"shard-{name}"), unchanged)


async def test_failing_finalize_fails_the_shard_and_commits_nothing(tmp_path: Path) -> None:
    failed = await _fail_on_second(
        tmp_path, "finalize", lambda engine, _output: FailingFinalizeApp(engine), "second"
    )
    assert "app.finalize_txn: RuntimeError: flush failed" in failed.handle.status().errors[0]
    assert failed.counts == {"k": 1}
    assert failed.checkpoint_unchanged
    # Its begin_txn was paired with finished_txn, given the failure.
    app = failed.app
    assert app.begins == len(app.finishes) == 2
    assert isinstance(app.finishes[1].exception(), Exception)


async def test_zombie_commit_is_fenced_and_fails_the_shard(tmp_path: Path) -> None:
    async with shard_env(tmp_path) as (env, engine, appends):
        journal = await env.journal("in/zombie")
        app = CountingApp(engine)
        changed = Notifier()
        producer = Producer(appends, "p")
        async with ShardRunner(app, env.client, root="/test/zombie") as runner:
            handle = runner.start(shard_spec("shard-z", [journal]), on_change=changed.notify)
            end = (await (await producer.committed(journal, "k"))).commit.end
            await changed.read_through(handle, journal, end)
            # A newer primary restores the shard: this one is now a zombie.
            newer = SQLStore(engine)
            await newer.restore_checkpoint(SimpleShard(handle.fqn))
            await producer.committed(journal, "k")
            await changed.until(lambda: handle.status().code == FAILED)
            await newer.destroy()
        assert "store commit: FencedError" in handle.status().errors[0]
        assert await read_counts(engine, "shard-z") == {"k": 1}


async def test_unreadable_source_fails_the_shard(tmp_path: Path) -> None:
    async with broker_env() as env, sqlite_engine(tmp_path) as engine:
        app = CountingApp(engine)
        changed = Notifier()
        # A missing journal may be one a restarting broker does not know yet: retried, here
        # twice, before the shard gives up.
        retry = ShardRetryPolicy(initial_s=0.01, max_s=0.01, attempts_max=2)
        async with ShardRunner(app, env.client, root="/test/unreadable", retry=retry) as runner:
            handle = runner.start(shard_spec("shard-u", ["in/missing"]), on_change=changed.notify)
            await changed.until(lambda: handle.status().code == FAILED)
        error = handle.status().errors[0]
        assert "shard shard-u: opening the message source: JournalNotFoundError" in error
        assert "source journal 'in/missing' does not exist" in error
        assert "persisted through 2 attempts" in error
        assert app.consumed == []


@dataclass
class UnawaitedPublishApp(CountingApp):
    """Publishes its derived message of "lost" without awaiting the publish (a batch publish,
    which appends only once awaited, as any publish that must wait for back-pressure)."""

    committed: bool = False  # publish_committed_batch, else publish_uncommitted_batch.
    unawaited: list[Awaitable[Any]] = field(default_factory=list)

    async def consume_message(
        self, shard: Shard, store: Store, envelope: Envelope[Any], publisher: Publisher[AsyncAppend]
    ) -> None:
        message: Event = envelope.message
        if message.text != "lost":
            await super().consume_message(shard, store, envelope, publisher)
            return
        assert self.output is not None
        derived = Event(key=message.key, text="derived-of-lost")
        publish = (
            publisher.publish_committed_batch
            if self.committed
            else publisher.publish_uncommitted_batch
        )
        self.unawaited.append(publish(to(self.output), [derived]))


@pytest.mark.parametrize("committed", [False, True], ids=["uncommitted", "committed"])
async def test_a_publish_never_awaited_fails_the_commit_instead_of_losing_its_message(
    tmp_path: Path, committed: bool
) -> None:
    failed = await _fail_on_second(
        tmp_path,
        "unawaited",
        lambda engine, output: UnawaitedPublishApp(engine, output=output, committed=committed),
        "lost",
    )
    error = failed.handle.status().errors[0]
    assert "building the checkpoint: UnfinishedPublishError: 1 publish(es)" in error
    # The input that published it was not checkpointed as read: a new primary reads it again
    # and publishes its derived message.
    assert failed.checkpoint_unchanged
    assert isinstance(failed.app, UnawaitedPublishApp) and len(failed.app.unawaited) == 1
    for unawaited in failed.app.unawaited:
        unawaited.close()  # type: ignore[attr-defined]  # A coroutine, never awaited.


async def _cancelled_elsewhere() -> None:
    """Await a future another task cancelled: CancelledError, though nothing cancels us."""
    other = asyncio.get_running_loop().create_future()
    other.cancel()
    await other


@dataclass
class StrayCancelApp(CountingApp):
    """Raises CancelledError from `consume_message` (or, with `in_begin`, from `begin_txn`) on
    a message whose text is "stray": it awaited something another task cancelled."""

    in_begin: bool = False
    stray_next: bool = False

    async def begin_txn(self, shard: Shard, store: Store) -> None:
        if self.in_begin and self.stray_next:
            await _cancelled_elsewhere()
        await super().begin_txn(shard, store)

    async def consume_message(
        self, shard: Shard, store: Store, envelope: Envelope[Any], publisher: Any
    ) -> None:
        if envelope.message.text == "stray" and not self.in_begin:
            await _cancelled_elsewhere()
        await super().consume_message(shard, store, envelope, publisher)
        self.stray_next = True  # The next transaction's begin_txn (with in_begin).


@pytest.mark.parametrize("in_begin", [False, True], ids=["consume_message", "begin_txn"])
async def test_a_stray_cancellation_fails_the_shard_instead_of_ending_it_silently(
    tmp_path: Path, in_begin: bool
) -> None:
    """Before, the CancelledError ended the shard's task as if it had been stopped: the
    replica went on reporting PRIMARY, served nothing, and logged nothing (found by the
    bad-input audit, 2026-11-30)."""
    # Transient (a closed channel cancels its calls the same way): tried again, then FAILED.
    retry = ShardRetryPolicy(initial_s=0.01, max_s=0.01, attempts_max=2)
    failed = await _fail_on_second(
        tmp_path,
        "stray",
        lambda engine, _output: StrayCancelApp(engine, in_begin=in_begin),
        "stray",
        retry,
    )
    error = failed.handle.status().errors[0]
    step = "app.begin_txn" if in_begin else "app.consume_message (in/stray offset"
    assert f"{step}" in error and "StrayCancelledError: raised CancelledError while" in error
    assert failed.counts == {"k": 1}
    assert failed.checkpoint_unchanged


@dataclass
class BadResultApp(CountingApp):
    """An Application returning what it must not: `new_store` returns `store` (instead of a
    store) unless it is the default; `new_message_source` returns `source` if set."""

    store: Any = "a store"
    source: Any = None

    async def new_store(self, shard: Shard, recorder: object | None) -> Store:
        if self.store != "a store":
            return self.store  # type: ignore[no-any-return]
        return await super().new_store(shard, recorder)

    def new_message_source(self, shard: Shard, store: Store, checkpoint: Any) -> Any:
        return self.source


@pytest.mark.parametrize(
    ("app_kwargs", "expected"),
    [
        (
            {"store": None},
            "app.new_store: TypeError: returned NoneType, not a Store (it has no"
            " restore_checkpoint, start_commit, destroy)",
        ),
        (
            {"source": 42},
            "opening the message source: TypeError: Application.new_message_source returned"
            " int, not a MessageSource (it has no next, try_next, checkpoint, has_pending,"
            " close, in_sequence)",
        ),
    ],
    ids=["new_store", "new_message_source"],
)
async def test_an_application_returning_the_wrong_type_is_named(
    tmp_path: Path, app_kwargs: dict[str, Any], expected: str
) -> None:
    """Before, each failed later in the shard's cleanup ("shard runner: AttributeError: 'int'
    object has no attribute 'close'"), naming neither the Application's method nor what it
    returned (found by the bad-input audit, 2026-11-30)."""
    async with broker_env() as env, sqlite_engine(tmp_path) as engine:
        journal = await env.journal("in/bad-result")
        changed = Notifier()
        app = BadResultApp(engine, **app_kwargs)
        async with ShardRunner(app, env.client, root="/test/bad-result") as runner:
            handle = runner.start(shard_spec("shard-bad", [journal]), on_change=changed.notify)
            await changed.until(lambda: handle.status().code == FAILED)
        [error] = handle.status().errors
        assert error == f"shard shard-bad: {expected}"


@dataclass
class FailingFinishedApp(CountingApp):
    """`finished_txn` raises; so does `consume_message` of a "poison" message (with
    `poison`)."""

    poison: bool = False

    async def consume_message(
        self, shard: Shard, store: Store, envelope: Envelope[Any], publisher: Any
    ) -> None:
        if self.poison and envelope.message.text == "poison":
            raise ValueError("the real cause")
        await super().consume_message(shard, store, envelope, publisher)

    def finished_txn(self, shard: Shard, store: Store, commit: Any) -> None:
        super().finished_txn(shard, store, commit)
        raise RuntimeError("finished_txn bug")


@pytest.mark.parametrize("poison", [False, True], ids=["at-commit", "abandoned"])
async def test_a_failing_finished_txn_is_named_and_never_hides_the_cause(
    tmp_path: Path, poison: bool
) -> None:
    """Before, finished_txn's error was reported as the "transaction loop"'s, and when the
    transaction was abandoned for another error it replaced that error (its journal and
    offset lost; found by the bad-input audit, 2026-11-30)."""
    async with shard_env(tmp_path) as (env, engine, appends):
        journal = await env.journal("in/finished")
        app = FailingFinishedApp(engine, poison=poison)
        changed = Notifier()
        async with ShardRunner(app, env.client, root="/test/finished") as runner:
            handle = runner.start(shard_spec("shard-fin", [journal]), on_change=changed.notify)
            text = "poison" if poison else "plain"
            await Producer(appends, "p").committed_together(journal, [Event(key="k", text=text)])
            await changed.until(lambda: handle.status().code == FAILED)
        [error] = handle.status().errors
        if poison:
            # The transaction was abandoned: its cause stays the shard's failure.
            assert "app.consume_message (in/finished offset 0): ValueError: the real cause" in error
            assert len(app.finishes) == 1 and "the real cause" in str(app.finishes[0].exception())
        else:
            assert "app.finished_txn: RuntimeError: finished_txn bug" in error
