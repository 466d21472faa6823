"""Shards with a recovery log (examples/word_count: a JSONFileStore recorded into the log),
against a real in-process broker: exactly-once counts across a primary restart, a hot standby
that tails the log and takes over (fencing the old primary), and a missing log journal."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from broker.client.append_service import AppendService
from broker.protocol import consumer_pb2 as cpb
from examples.word_count import WordCount, counts_of
from gazette_consumer.shard import PrimaryShard
from gazette_consumer.shard_handle import ShardRole
from gazette_consumer.shard_runner import LocalShard, ShardRetryPolicy, ShardRunner
from gazette_consumer.stores.jsonfile import JSONFileStore
from tests.gazette_consumer.recovery_testkit import Texts, create_log, logged_counts, words_spec
from tests.gazette_consumer.shard_testkit import Notifier, broker_env

ROOT = "/test/recovery-log"
Code = cpb.ReplicaStatus.Code


def store_of(handle: LocalShard) -> JSONFileStore:
    primary = handle.primary
    assert primary is not None
    store = primary.store
    assert isinstance(store, JSONFileStore)
    return store


def primary_of(handle: LocalShard) -> PrimaryShard:
    assert handle.primary is not None
    return handle.primary


async def read_through(changed: Notifier, handle: LocalShard, journal: str, end: int) -> None:
    await changed.read_through(handle, journal, end)


async def test_counts_are_exactly_once_across_primary_restarts(tmp_path: Path) -> None:
    async with broker_env() as env, AppendService(env.client) as appends:
        source = await env.journal("in/words-restart")
        spec = words_spec("shard-restart", source)
        log = await create_log(env, spec)
        texts, changed = Texts(appends), Notifier()

        async with ShardRunner(WordCount(), env.client, root=ROOT, data_dir=tmp_path) as runner:
            handle = runner.start(spec, on_change=changed.notify)
            end = await texts.send(source, ["the quick fox", "The lazy dog"])
            await read_through(changed, handle, source, end)
            assert counts_of(store_of(handle)) == texts.expected
            assert handle.recovery is not None and handle.recovery.directory is not None
            directory = handle.recovery.directory
            assert directory.parent == tmp_path
            # A crash-like stop, with texts that may or may not have committed.
            await texts.send(source, ["fox again", "and again"])
            await runner.stop(spec.id)
            assert handle.status().code != Code.FAILED
        assert not directory.exists()  # The replica's played directory is removed.

        more = await texts.send(source, ["dog"])
        # A new primary (another process: its own data directory) recovers from the log alone.
        async with ShardRunner(WordCount(), env.client, root=ROOT) as runner:
            handle = runner.start(spec, on_change=changed.notify)
            await read_through(changed, handle, source, more)
            assert counts_of(store_of(handle)) == texts.expected
            assert handle.recovery is not None and handle.recovery.player is not None
            assert handle.recovery.player.read_from == 0  # No hints store: the whole log.

        # What the log holds is the same exactly-once count.
        assert await logged_counts(env.client, log, tmp_path / "check") == texts.expected


async def test_hot_standby_tails_takes_over_and_fences_the_old_primary(tmp_path: Path) -> None:
    async with broker_env() as env, AppendService(env.client) as appends:
        source = await env.journal("in/words-standby")
        spec = words_spec("shard-standby", source)
        spec.hot_standbys = 1
        log = await create_log(env, spec)
        texts, changed = Texts(appends), Notifier()
        async with (
            ShardRunner(WordCount(), env.client, root=ROOT, data_dir=tmp_path / "a") as runner_a,
            ShardRunner(WordCount(), env.client, root=ROOT, data_dir=tmp_path / "b") as runner_b,
        ):
            a = runner_a.start(spec, on_change=changed.notify)
            end = await texts.send(source, ["one two", "two three three"])
            await read_through(changed, a, source, end)
            assert a.recovery is not None and a.recovery.recorder is not None
            head = a.recovery.recorder.write_head
            assert head > 0

            b = runner_b.start(spec, role=ShardRole.STANDBY, on_change=changed.notify)
            await changed.until(lambda: b.status().code == Code.STANDBY)
            # STANDBY only once caught up: it has played the primary's commits already.
            assert b.recovery is not None and b.recovery.player is not None
            assert b.recovery.player.played_through >= head
            assert b.primary is None

            # Promoted while the old primary still runs (a zombie, as after a partition).
            b.promote()
            await changed.until(lambda: b.status().code == Code.PRIMARY)
            # Fast takeover: the history was played before the promotion, not after.
            assert b.recovery.played_before_handoff >= head
            assert counts_of(store_of(b)) == texts.expected
            assert b.recovery.recorder is not None
            assert b.recovery.recorder.author != a.recovery.recorder.author

            # Both read the next texts; the old primary's commit is fenced.
            end = await texts.send(source, ["three four"])
            await changed.until(lambda: a.status().code == Code.FAILED)
            assert "FencedError" in a.status().errors[0], a.status().errors
            assert log in a.status().errors[0]
            await read_through(changed, b, source, end)
            assert counts_of(store_of(b)) == texts.expected

        assert await logged_counts(env.client, log, tmp_path / "check") == texts.expected


async def test_a_standby_without_a_primary_reports_standby_once_played(tmp_path: Path) -> None:
    async with broker_env() as env:
        source = await env.journal("in/words-empty")
        spec = words_spec("shard-empty", source)
        await create_log(env, spec)
        changed = Notifier()
        async with ShardRunner(WordCount(), env.client, root=ROOT, data_dir=tmp_path) as runner:
            b = runner.start(spec, role=ShardRole.STANDBY, on_change=changed.notify)
            await changed.until(lambda: b.status().code == Code.STANDBY)
            b.promote()
            await changed.until(lambda: b.status().code == Code.PRIMARY)
            assert counts_of(store_of(b)) == {}


async def test_a_missing_recovery_log_fails_the_shard_naming_the_journal(tmp_path: Path) -> None:
    async with broker_env() as env:
        source = await env.journal("in/words-missing")
        spec = words_spec("shard-missing", source)
        changed = Notifier()
        # Retried (an operator may be creating it), here twice, before the shard gives up.
        retry = ShardRetryPolicy(initial_s=0.01, max_s=0.01, attempts_max=2)
        async with ShardRunner(
            WordCount(), env.client, root=ROOT, data_dir=tmp_path, retry=retry
        ) as runner:
            handle = runner.start(spec, on_change=changed.notify)
            await changed.until(lambda: handle.status().code == Code.FAILED)
            error = handle.status().errors[0]
            assert "RecoveryLogMissingError" in error
            assert f"'{spec.recovery_log_prefix}/{spec.id}' does not exist; create it" in error
            assert "persisted through 2 attempts" in error
        # Nothing was played or left behind.
        assert await asyncio.to_thread(os.listdir, tmp_path) == []


async def test_a_source_journal_named_as_recovery_log_is_refused(tmp_path: Path) -> None:
    async with broker_env() as env:
        source = await env.journal("in/words-wrong")
        spec = words_spec("shard-wrong", source)
        spec.recovery_log_prefix = "in"
        await env.journal(f"in/{spec.id}")  # A JSON-lines journal, not a recovery log.
        changed = Notifier()
        async with ShardRunner(WordCount(), env.client, root=ROOT, data_dir=tmp_path) as runner:
            handle = runner.start(spec, on_change=changed.notify)
            await changed.until(lambda: handle.status().code == Code.FAILED)
            error = handle.status().errors[0]
            assert "RecoveryLogError" in error and f"in/{spec.id}" in error
