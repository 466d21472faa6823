"""``gazctl shards prune`` and ``gazctl shards recover`` against a live word-count shard: its
recovery log rolls small fragments persisted to a file:// store, its hints are in the keyspace.
Prune deletes exactly the fragments no hint reaches (after a dry run that deletes nothing, and
not while a backup hint lacks live files); recover then plays the pruned log into a directory
and finds every count the shard committed."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from broker import client
from broker.cli import gazctl
from broker.client.append_service import AppendService
from broker.fragment.naming import content_path
from broker.fragment.stores.registry import new_registry
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import labels
from broker.protocol import protocol_pb2 as pb
from broker.protocol.recorded_op_pb2 import FSMHints
from examples.word_count import WordCount
from gazette_consumer.hints import HintStore
from gazette_consumer.recoverylog.fsm import FSM
from gazette_consumer.shard_runner import ShardRunner
from gazette_consumer.shard_spec import recovery_log
from gazette_consumer.stores.jsonfile import STATE_FILE
from tests.broker.broker_testkit import Cluster, journal_spec
from tests.gazette_consumer.consumer_testkit import Group
from tests.gazette_consumer.recovery_testkit import Texts, words_spec
from tests.gazette_consumer.shard_testkit import CONTENT_TYPE_JSON_LINES, WAIT_S

Code = cpb.ReplicaStatus.Code
STORE = "file:///frags/"
SHARD = "shard-prune"
# Small fragments: every few transactions roll one, so the log's early history is in files
# of its own, which the hints stop needing as the word-count document is rewritten.
LOG_FRAGMENT_BYTES = 1024  # The smallest a spec allows.


async def run(*argv: str) -> int:
    return await gazctl.run(gazctl.parse_args(list(argv)))


async def fragments(c: client.JournalClient, log: str) -> list[pb.Fragment]:
    response = await client.list_all_fragments(c, pb.FragmentsRequest(journal=log))
    return [f.spec for f in response.fragments]


async def persisted_below(c: client.JournalClient, log: str, offset: int) -> list[pb.Fragment]:
    """Wait until the fragments of `log` below `offset` are all persisted, and return them
    (the persister uploads rolled fragments in the background, announcing it to no one)."""
    async with asyncio.timeout(WAIT_S):
        while True:
            below = [f for f in await fragments(c, log) if f.end <= offset]
            if below and all(f.backing_store for f in below):
                return below
            await asyncio.sleep(0.05)  # No event tells of an upload.


async def test_prune_then_recover_a_live_shard(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "frags").mkdir()
    cluster = Cluster(stores=new_registry(file_root=tmp_path))
    group = await Group.open()
    hint_backend = await group.connect()
    try:
        broker = await cluster.start_broker("zone-a", "broker-a")
        journals = client.JournalClient(broker.endpoint)
        source = journal_spec("in/words-prune")
        source.labels.CopyFrom(labels.label_set([(labels.CONTENT_TYPE, CONTENT_TYPE_JSON_LINES)]))
        await cluster.create(source, [broker])
        spec = words_spec(SHARD, source.name, hint_backups=1)
        log = recovery_log(spec)
        log_spec = journal_spec(log, length=LOG_FRAGMENT_BYTES, stores=[STORE])
        log_spec.labels.CopyFrom(
            labels.label_set([(labels.CONTENT_TYPE, labels.CONTENT_TYPE_RECOVERY_LOG)])
        )
        await cluster.create(log_spec, [broker])

        async with (
            AppendService(journals) as appends,
            ShardRunner(
                WordCount(),
                journals,
                data_dir=tmp_path / "data",
                hints=HintStore(hint_backend),
                hints_interval_s=0,
            ) as runner,
        ):
            node = await group.join("zone-a", "consumer-a", start_shard=runner.start_shard)
            await group.put_shard(spec)

            def serving() -> str | None:
                status = runner.statuses().get(SHARD)
                return None if status and status.code == Code.PRIMARY else f"{status}"

            await group.until(serving)
            primary = runner.shard(SHARD).primary
            assert primary is not None
            texts = Texts(appends)
            for round_ in range(12):
                end = await texts.send(source.name, [f"round {round_} of words", "words"])
                async with asyncio.timeout(WAIT_S):
                    await primary.wait_until(
                        lambda s, end=end: (
                            s.recorded_hints_at is not None
                            and s.recorded_hints_at.read_through.get(source.name, 0) >= end
                        )
                    )
            hints = primary.recorded_hints
            assert hints is not None
            first = FSM.from_hints(hints).next_hinted_segment
            assert first is not None and first.first_offset > 0
            obsolete = await persisted_below(journals, log, first.first_offset)
            files = {content_path(f) for f in obsolete}

            consumer = ["shards", "--consumer", node.member.endpoint]
            broker_flag = ["--broker", broker.endpoint]
            prune = [*broker_flag, *consumer, "prune", "-l", f"id={SHARD}"]
            prune += ["--file-root", str(tmp_path), "--format", "json"]

            # Its backup hints (what it recovered: an empty log) name no live file, so a
            # prune could delete what a recovery from them needs: the log is skipped.
            assert await run(*prune) == 0
            out, err = capsys.readouterr()
            assert json.loads(out) == []
            assert f"skipping recovery log {log}: shard {SHARD} has no live files" in err
            assert all((tmp_path / "frags" / path).exists() for path in files)

            # With only primary hints to honour: a dry run tells, and deletes nothing...
            spec.hint_backups = 0
            await group.put_shard(spec)
            assert await run(*prune, "--dry-run") == 0
            planned = json.loads(capsys.readouterr().out)
            assert {r["path"] for r in planned} == files
            assert {r["action"] for r in planned} == {"would prune"}
            assert all(r["end"] <= first.first_offset for r in planned)
            assert all((tmp_path / "frags" / path).exists() for path in files)

            # ...then the prune deletes those files, and only those.
            persisted = {content_path(f) for f in await fragments(journals, log) if f.backing_store}
            assert await run(*prune) == 0
            out, err = capsys.readouterr()
            assert {r["path"] for r in json.loads(out)} == files
            assert f"{log}: {len(files)} of" in err
            assert not any((tmp_path / "frags" / path).exists() for path in files)
            assert all((tmp_path / "frags" / path).exists() for path in persisted - files)

            # The shard's state is still recoverable from the pruned log and its hints.
            recovered_dir = tmp_path / "recovered"
            recover = [*broker_flag, *consumer, "recover", "--id", SHARD, "-d"]
            assert await run(*recover, str(recovered_dir), "--format", "json") == 0
            records = json.loads(capsys.readouterr().out)
            assert STATE_FILE in [r["path"] for r in records]
            document = json.loads((recovered_dir / STATE_FILE).read_bytes())
            assert document["state"]["counts"] == dict(texts.expected)

            # Into a directory holding files: refused, and the files are untouched.
            assert await run(*recover, str(recovered_dir)) == 2
            assert "--dir: must be an empty directory" in capsys.readouterr().err
            assert (recovered_dir / STATE_FILE).exists()
            assert await run(*recover[:-3], "--id", "no-such-shard", "-d", str(tmp_path / "x")) == 1
            assert "no shard has id 'no-such-shard'" in capsys.readouterr().err
            await node.member.stop(graceful=False)
        await journals.channels.close()
    finally:
        await hint_backend.close()
        await group.close()
        await cluster.close()


def test_unhinted_fragments_are_planned_from_segments_alone() -> None:
    # The planning rule on its own: fragments wholly before the first hinted segment go;
    # any touching a segment, or after the last (open-ended) one, stay; unpersisted ones stay.
    from broker.cli.shards_prune import live_segments, plan_log
    from broker.protocol.recorded_op_pb2 import FnodeSegments, Segment

    hints = FSMHints(
        log="log",
        live_nodes=[
            FnodeSegments(
                fnode=10,
                segments=[
                    Segment(
                        author=1, first_seq_no=10, first_offset=100, last_seq_no=12, last_offset=150
                    )
                ],
            ),
            FnodeSegments(
                fnode=20,
                segments=[
                    Segment(
                        author=1, first_seq_no=20, first_offset=300, last_seq_no=21, last_offset=320
                    )
                ],
            ),
        ],
    )
    segments = live_segments(hints)
    assert [(s.first_offset, s.last_offset) for s in segments] == [(100, 150), (300, 0)]

    def frag(begin: int, end: int, store: str = STORE) -> pb.Fragment:
        return pb.Fragment(journal="log", begin=begin, end=end, backing_store=store, mod_time=1)

    plan = plan_log(
        "log",
        segments,
        [frag(0, 100), frag(90, 110), frag(150, 300), frag(200, 250, ""), frag(400, 500)],
    )
    assert [(f.begin, f.end) for f in plan.prune] == [(0, 100), (150, 300)]
    assert [(f.begin, f.end) for f in plan.kept] == [(90, 110), (400, 500)]
    assert [(f.begin, f.end) for f in plan.unpersisted] == [(200, 250)]


async def test_failed_deletions_are_reported_and_the_others_done() -> None:
    from broker.cli.shards_prune import delete_fragments
    from broker.fragment.naming import content_sum
    from broker.fragment.stores.base import StoreError
    from broker.fragment.stores.memory_store import MemoryBuckets, MemoryStore
    from broker.fragment.stores.registry import StoreRegistry

    class RefusingStore(MemoryStore):
        """Refuses to delete the fragment at offset 1, as a store without permission would."""

        async def _delete(self, key: str) -> None:
            if key.rsplit("/", 1)[1].startswith("0000000000000001-"):
                raise StoreError(f"permission denied for {key}")
            await super()._delete(key)

    buckets = MemoryBuckets()
    registry = StoreRegistry({"memory": lambda url: RefusingStore(url, buckets=buckets)})
    store = registry.get("memory://logs/")
    made = []
    for begin in range(3):
        content = b"%d" % begin
        f = pb.Fragment(
            journal="a/log",
            begin=begin,
            end=begin + 1,
            sum=content_sum(content),
            compression_codec=pb.NONE,
            backing_store="memory://logs/",
        )
        await store.put(f, content)
        made.append(f)
    failed = await delete_fragments(registry, made, dry_run=False)
    assert list(failed) == [id(made[1])] and "permission denied" in failed[id(made[1])]
    assert [await store.exists(f) for f in made] == [False, True, False]
