"""Recovery-log hints: a primary stores recovered and recorded hints in the keyspace, the Shard
service's GetHints returns them, and a new primary recovering from them skips the obsolete
history of its log. HintStore's rotation and refusals, over the embedded keyspace."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from broker.client.append_service import AppendService
from broker.keyspace.embedded import EmbeddedStore
from broker.protocol import consumer_pb2 as cpb
from broker.protocol.recorded_op_pb2 import FnodeSegments, FSMHints, Segment
from examples.word_count import WordCount, counts_of
from gazette_consumer.hints import HintsError, HintStore
from gazette_consumer.recoverylog.fsm import FSM
from gazette_consumer.shard import PrimaryShard
from gazette_consumer.shard_client import ShardClient
from gazette_consumer.shard_runner import LocalShard, ShardRunner
from gazette_consumer.shard_spec import recovery_log
from gazette_consumer.shard_specs_api import decode_hints
from gazette_consumer.stores.jsonfile import JSONFileStore
from tests.gazette_consumer.consumer_testkit import Group
from tests.gazette_consumer.recovery_testkit import Texts, create_log, logged_counts, words_spec
from tests.gazette_consumer.shard_testkit import WAIT_S, Notifier, broker_env

Code = cpb.ReplicaStatus.Code


def _primary(handle: LocalShard) -> PrimaryShard:
    assert handle.primary is not None
    return handle.primary


async def _hints_cover(primary: PrimaryShard, journal: str, end: int) -> None:
    """Wait until the primary stored hints taken after it read `journal` through `end`."""

    def covered(shard: PrimaryShard) -> bool:
        at = shard.recorded_hints_at
        return at is not None and at.read_through.get(journal, 0) >= end

    async with asyncio.timeout(WAIT_S):
        await primary.wait_until(covered)


async def test_get_hints_returns_stored_hints_and_a_new_primary_skips_old_history(
    tmp_path: Path,
) -> None:
    group = await Group.open()
    hint_backend = await group.connect()
    try:
        async with broker_env() as env, AppendService(env.client) as appends:
            source = await env.journal("in/words-hints")
            spec = words_spec("shard-hints", source)
            log = await create_log(env, spec)
            texts = Texts(appends)
            hints = HintStore(hint_backend)
            async with ShardRunner(
                WordCount(), env.client, data_dir=tmp_path / "a", hints=hints, hints_interval_s=0
            ) as runner:
                node = await group.join("zone-a", "consumer-a", start_shard=runner.start_shard)
                await group.put_shard(spec)

                def serving() -> str | None:
                    status = runner.statuses().get(spec.id)
                    return None if status and status.code == Code.PRIMARY else f"{status}"

                await group.until(serving)
                handle = runner.shard(spec.id)
                primary = _primary(handle)
                end = 0
                for round_ in range(4):  # Several commits, each replacing the document.
                    end = await texts.send(source, [f"round {round_}", "words words"])
                    await _hints_cover(primary, source, end)
                recorded = primary.recorded_hints
                assert recorded is not None and recorded.log == log
                assert handle.recovery is not None
                recovered = handle.recovery.recovered_hints
                assert recovered == FSMHints(log=log)  # It recovered an empty log.

                async with ShardClient(node.member.endpoint) as client:
                    got = await client.get_hints(spec.id)
                assert got.primary_hints.hints == recorded
                assert [h.hints for h in got.backup_hints] == [recovered, FSMHints()]
                await node.member.stop(graceful=False)

            # The hints name only the segment of the live document: the first primary's earlier
            # documents (and the hand-off) are obsolete history, which a new primary skips.
            first = FSM.from_hints(recorded).next_hinted_segment
            assert first is not None and first.first_offset > 0
            more = await texts.send(source, ["after the hints"])
            changed = Notifier()
            async with ShardRunner(
                WordCount(), env.client, data_dir=tmp_path / "b", hints=hints
            ) as runner:
                handle = runner.start(spec, on_change=changed.notify)
                await changed.until(lambda: handle.progress().read_through.get(source, 0) >= more)
                assert handle.recovery is not None and handle.recovery.player is not None
                assert handle.recovery.player.read_from == first.first_offset
                store = _primary(handle).store
                assert isinstance(store, JSONFileStore)
                assert counts_of(store) == texts.expected
                recovered_b = handle.recovery.recovered_hints
            # Its recovery was stored as the newest backup; the older one rotated.
            backups = [
                (await hint_backend.range(f"/test/hints/{spec.id}.backup.{i}".encode())).kvs
                for i in range(2)
            ]
            assert [decode_hints(kvs[0].value) for kvs in backups] == [
                recovered_b,
                recovered,
            ]
            assert await logged_counts(env.client, log, tmp_path / "check") == texts.expected
    finally:
        await hint_backend.close()
        await group.close()


async def test_hint_store_rotates_backups_and_refuses_other_logs() -> None:
    store = EmbeddedStore()
    backend = store.connect()
    try:
        hints = HintStore(backend)
        spec = words_spec("shard-rotate", "in/x", hint_backups=2)
        log = recovery_log(spec)
        empty = FSMHints(log=log)
        assert await hints.fetch(spec) == empty  # Nothing stored: play the whole log.

        def nth(n: int) -> FSMHints:
            segment = Segment(author=7, first_seq_no=n, first_offset=10 * n, last_seq_no=n)
            return FSMHints(log=log, live_nodes=[FnodeSegments(fnode=n, segments=[segment])])

        for n in (1, 2, 3):
            await hints.store_recovered(spec, nth(n))
        keys = [f"/test/hints/{spec.id}.backup.{i}".encode() for i in range(2)]
        values = [(await backend.range(key)).kvs[0].value for key in keys]
        # Stored as Gazette's consumers read them (Go's encoding/json), so that a Go consumer
        # taking the shard over can recover from them.
        assert [json.loads(v)["live_nodes"][0]["fnode"] for v in values] == [3, 2]
        assert [decode_hints(v) for v in values] == [nth(3), nth(2)]  # nth(1) dropped.
        assert await hints.fetch(spec) == nth(3)  # No primary hints: the newest backup.
        await hints.store_recorded(spec, nth(4))
        assert await hints.fetch(spec) == nth(4)
        # Binary values of earlier versions are still read.
        await backend.put(f"/test/hints/{spec.id}.primary".encode(), nth(5).SerializeToString())
        assert await hints.fetch(spec) == nth(5)

        with pytest.raises(HintsError, match="not of its log"):
            await hints.store_recorded(spec, FSMHints(log="another/log"))
        await backend.put(f"/test/hints/{spec.id}.primary".encode(), b'{"log": "another/log"}')
        with pytest.raises(HintsError, match=r"\.primary: log 'another/log'"):
            await hints.fetch(spec)
    finally:
        await backend.close()
