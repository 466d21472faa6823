"""A checkpoint ahead of a source journal's write head (source_heads.py).

The source journal is deleted and created again between two runs of a shard (a broker without a
fragment store keeps nothing of it), and a producer appends new content, less of it than the
shard had read. Before, the shard resumed at its checkpoint: it waited for the head to pass it
and skipped every message appended below, without an error (as Gazette does). Now the primary
fails naming the journal (the default), reads the journal again from its start (``rewind``) or,
asked to, behaves as Gazette does (``wait``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio
import pytest
from sqlalchemy import Engine

from broker.cli.reset_head import reset_head
from broker.client.append_service import AppendService
from broker.client.list_apply import list_journals
from broker.client.retry_reader import RetryReader
from broker.client.route_cache import JournalClient
from broker.client.write_head import probe_write_head
from broker.fragment.stores.file_store import FileStore
from broker.fragment.stores.registry import StoreRegistry
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import labels
from broker.protocol import protocol_pb2 as pb
from broker.topology import item_key
from gazette_consumer.checkpoint import flatten_read_through
from gazette_consumer.message import CONTENT_TYPE_JSON_LINES
from gazette_consumer.sequencer.read_tails import TAIL_BYTES, tail_digest
from gazette_consumer.shard_retry import Transience, classify
from gazette_consumer.shard_runner import LocalShard, ShardRunner
from gazette_consumer.source_heads import (
    BEHIND_TOTAL,
    SourceBehind,
    find_recreated,
    find_sources_behind,
)
from gazette_consumer.source_revisions import (
    RESTORED_TOTAL,
    SourceRecreatedError,
    StaleListingError,
    StaleReadError,
    create_revisions_of,
    fingerprints_of,
    restored_sources,
    verify_source,
)
from tests.broker.broker_testkit import (
    ROOT,
    Cluster,
    GatedListing,
    journal_spec,
    put_fragment,
    replica_of,
    wait_until,
)
from tests.gazette_consumer.shard_testkit import (
    BrokerEnv,
    CountingApp,
    Notifier,
    Producer,
    read_checkpoint,
    read_counts,
    shard_env,
    shard_spec,
    sqlite_engine,
)

Code = cpb.ReplicaStatus.Code
JOURNAL = "in/recreated"


@dataclass
class Recreated:
    env: BrokerEnv
    engine: Engine
    appends: AppendService
    app: CountingApp
    runner: ShardRunner
    read_through: int  # Where the first run's checkpoint left the journal.


async def _recreate(env: BrokerEnv) -> None:
    """Delete the journal and create it again: its broker drops the replica, and the new one
    starts empty (no fragment store lists the old content)."""
    await env.cluster.assign(JOURNAL, [])
    header, _ = await env.cluster.admin.delete(item_key(ROOT, JOURNAL).encode())
    await env.cluster.sync(header.revision)
    assert env.broker.resolver.replicas.get(JOURNAL) is None
    await env.journal(JOURNAL)


@contextlib.asynccontextmanager
async def _read_four(
    tmp_path: Path, spec: cpb.ShardSpec, root: str
) -> AsyncIterator[tuple[Recreated, Notifier]]:
    """A shard that read four messages of JOURNAL ("old") and reads on, blocked at its head."""
    async with shard_env(tmp_path) as (env, engine, appends):
        await env.journal(JOURNAL)
        app = CountingApp(engine)
        changed = Notifier()
        old = Producer(appends, "old")
        async with ShardRunner(app, env.client, root=root) as runner:
            handle = runner.start(spec, on_change=changed.notify)
            for _ in range(4):
                end = await _end(old)
            await changed.read_through(handle, JOURNAL, end)
            yield Recreated(env, engine, appends, app, runner, end), changed


@contextlib.asynccontextmanager
async def recreated_source(tmp_path: Path, spec: cpb.ShardSpec) -> AsyncIterator[Recreated]:
    """A shard that read four messages of JOURNAL (and stopped), after which JOURNAL was
    created again and holds one new message ("new"), fewer bytes than the shard had read."""
    async with _read_four(tmp_path, spec, "/test/behind") as (r, _):
        await r.runner.stop(spec.id)
        await _recreate(r.env)
        assert await _end(Producer(r.appends, "new")) < r.read_through
        yield r


async def _end(producer: Producer) -> int:
    """Publish one committed message keyed by the producer's name; the journal's new head."""
    return (await (await producer.committed(JOURNAL, producer.name))).commit.end


def _labelled(policy: str | None) -> cpb.ShardSpec:
    spec = shard_spec("shard-behind", [JOURNAL])
    if policy is not None:
        spec.labels.CopyFrom(labels.label_set([(labels.CHECKPOINT_AHEAD, policy)]))
    return spec


def _counted(policy: str) -> float:
    return BEHIND_TOTAL.labels(JOURNAL, policy)._value.get()


async def test_a_checkpoint_ahead_of_its_source_fails_the_shard_naming_it(tmp_path: Path) -> None:
    spec = _labelled(None)
    before = _counted("fail")
    async with recreated_source(tmp_path, spec) as r:
        changed = Notifier()
        handle = r.runner.start(spec, on_change=changed.notify)
        await changed.until(lambda: handle.status().code == Code.FAILED)
        error = handle.status().errors[0]
        assert "CheckpointAheadError" in error and repr(JOURNAL) in error
        # Its head is below the checkpoint, and it is another journal (source_revisions.py):
        # the second says more, and is what the error says.
        assert f"through offset {r.read_through}, but the journal was deleted and created" in error
        assert f"{labels.CHECKPOINT_AHEAD}=rewind" in error
        # Nothing of the new content was consumed, and the checkpoint is the first run's.
        assert await read_counts(r.engine, "shard-behind") == {"old": 4}
        checkpoint = await read_checkpoint(r.engine, r.runner.fqn("shard-behind"))
        assert checkpoint is not None
        assert flatten_read_through(checkpoint)[JOURNAL] == r.read_through
    assert _counted("fail") == before + 1


async def _grow_past(appends: AppendService, name: str, offset: int) -> int:
    """Publish messages keyed `name` until the journal's head passes `offset`; how many."""
    producer, count = Producer(appends, name), 1
    while await _end(producer) <= offset:
        count += 1
    return count


async def test_a_journal_created_again_and_grown_past_the_checkpoint_fails_the_shard(
    tmp_path: Path,
) -> None:
    """Its head no longer tells (it passed the checkpoint again): the create revision the
    checkpoint recorded does. Before, the shard resumed at the checkpoint, inside the new
    content, without an error."""
    spec = _labelled(None)
    async with recreated_source(tmp_path, spec) as r:
        await _grow_past(r.appends, "more", r.read_through)
        changed = Notifier()
        handle = r.runner.start(spec, on_change=changed.notify)
        await _fails_naming_the_recreation(r, handle, changed)


async def _fails_naming_the_recreation(r: Recreated, handle: LocalShard, changed: Notifier) -> None:
    """The shard FAILS naming the journal created again, having consumed only the old content."""
    await changed.until(lambda: handle.status().code == Code.FAILED)
    error = handle.status().errors[0]
    assert "CheckpointAheadError" in error and repr(JOURNAL) in error
    assert "deleted and created again since (etcd create revision" in error
    assert await read_counts(r.engine, "shard-behind") == {"old": 4}


async def test_rewind_reads_a_journal_created_again_and_grown_past_from_its_start(
    tmp_path: Path,
) -> None:
    spec = _labelled(labels.CHECKPOINT_AHEAD_REWIND)
    async with recreated_source(tmp_path, spec) as r:
        more = await _grow_past(r.appends, "more", r.read_through)
        end = await _end(Producer(r.appends, "last"))
        changed = Notifier()
        handle = r.runner.start(spec, on_change=changed.notify)
        await changed.until(lambda: handle.progress().read_through.get(JOURNAL) == end)
        assert handle.status().code != Code.FAILED
        counts = await read_counts(r.engine, "shard-behind")
        assert counts == {"old": 4, "new": 1, "more": more, "last": 1}


@contextlib.asynccontextmanager
async def reading_shard(
    tmp_path: Path, spec: cpb.ShardSpec
) -> AsyncIterator[tuple[Recreated, Notifier]]:
    """A shard that read four messages of JOURNAL and reads on (blocked at its head) while
    JOURNAL is deleted and created again."""
    async with _read_four(tmp_path, spec, "/test/inflight") as (r, changed):
        await _recreate(r.env)
        yield r, changed


async def test_a_journal_created_again_while_the_shard_reads_it_fails_the_shard(
    tmp_path: Path,
) -> None:
    """The reader's Read RPC ends as the journal's replica goes; before the next reads on, the
    reader checks the journal's create revision. Before, it read the new journal from the old
    offset (Gazette's RetryReader does the same when the journal is back within its retries)."""
    spec = _labelled(None)
    async with reading_shard(tmp_path, spec) as (r, changed):
        handle = r.runner.shard(spec.id)
        await _grow_past(r.appends, "more", r.read_through)
        await _fails_naming_the_recreation(r, handle, changed)


async def test_rewind_reads_a_journal_created_again_while_the_shard_read_it(
    tmp_path: Path,
) -> None:
    spec = _labelled(labels.CHECKPOINT_AHEAD_REWIND)
    async with reading_shard(tmp_path, spec) as (r, changed):
        handle = r.runner.shard(spec.id)
        more = await _grow_past(r.appends, "more", r.read_through)
        end = await _end(Producer(r.appends, "last"))
        await changed.until(lambda: handle.progress().read_through.get(JOURNAL) == end)
        assert handle.status().code != Code.FAILED
        counts = await read_counts(r.engine, "shard-behind")
        assert counts == {"old": 4, "more": more, "last": 1}


async def test_rewind_reads_the_journal_again_from_its_start(tmp_path: Path) -> None:
    spec = _labelled(labels.CHECKPOINT_AHEAD_REWIND)
    async with recreated_source(tmp_path, spec) as r:
        changed = Notifier()
        handle = r.runner.start(spec, on_change=changed.notify)
        end = await _end(Producer(r.appends, "more"))
        # Progress starts at the stored checkpoint (past `end`), then moves back.
        await changed.until(lambda: handle.progress().read_through.get(JOURNAL) == end)
        assert handle.status().code != Code.FAILED
        assert await read_counts(r.engine, "shard-behind") == {"old": 4, "new": 1, "more": 1}
        checkpoint = await read_checkpoint(r.engine, r.runner.fqn("shard-behind"))
        assert checkpoint is not None and flatten_read_through(checkpoint)[JOURNAL] == end


async def test_wait_resumes_at_the_checkpoint_as_gazette_does(tmp_path: Path) -> None:
    spec = _labelled(labels.CHECKPOINT_AHEAD_WAIT)
    before = _counted("wait")
    async with recreated_source(tmp_path, spec) as r:
        changed = Notifier()
        handle = r.runner.start(spec, on_change=changed.notify)
        # Its transaction loop runs once the source is open, past the check of its head.
        await wait_until(
            lambda: handle.primary is not None and handle.primary.txn_phase is not None
        )
        assert _counted("wait") == before + 1
        # Append until the head passes the checkpoint: the shard resumes there, skipping what
        # was appended below it; the checkpoint (the end of the fourth old message) falls
        # inside a message of the new content, so the shard fails decoding it, as Gazette's
        # would.
        more = Producer(r.appends, "more")
        while await _end(more) <= r.read_through:
            pass
        await changed.until(lambda: handle.status().code == Code.FAILED)
        error = handle.status().errors[0]
        assert f"MessageDecodeError: journal {JOURNAL} offsets [{r.read_through}," in error
        assert await read_counts(r.engine, "shard-behind") == {"old": 4}
    assert _counted("wait") == before + 1


async def test_a_healthy_restart_checks_one_head_per_source_and_reads_on(tmp_path: Path) -> None:
    spec = _labelled(None)
    async with shard_env(tmp_path) as (env, engine, appends):
        await env.journal(JOURNAL)
        app = CountingApp(engine)
        changed = Notifier()
        producer = Producer(appends, "p")
        async with ShardRunner(app, env.client, root="/test/healthy") as runner:
            for round_ in range(2):
                handle = runner.start(spec, on_change=changed.notify)
                end = await _end(producer)
                await changed.read_through(handle, JOURNAL, end)
                await runner.stop(spec.id)
                assert handle.status().code != Code.FAILED, round_
        assert await read_counts(engine, "shard-behind") == {"p": 2}


async def test_a_broker_that_has_not_listed_its_store_is_not_taken_for_lost_content(
    tmp_path: Path,
) -> None:
    """Right after a broker starts, its non-blocking reads answer a write head that does not
    count its store's fragments yet. That low head alone must not fail a shard: the listing
    (which waits for the store) decides, and while it cannot, the check fails transiently
    (the shard retries) instead of calling the content lost."""
    store_url = "file:///frags/"
    (tmp_path / "frags").mkdir()
    opened = asyncio.Event()
    registry = StoreRegistry({"file": lambda url: GatedListing(url, tmp_path, opened)})
    content = b'{"key": "k"}\n' * 100
    await put_fragment(registry, store_url, JOURNAL, 0, content)

    cluster = Cluster(stores=registry)
    broker = await cluster.start_broker("zone-a", "broker-a", fragments_listing_wait_s=0.2)
    client = JournalClient(broker.endpoint)
    try:
        await cluster.create(journal_spec(JOURNAL, stores=[store_url]), [broker])
        assert await probe_write_head(client, JOURNAL) == 0  # Not listed: too low a head.
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await find_sources_behind(client, {JOURNAL: len(content)})
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        assert classify(failed.value) is Transience.TRANSIENT
        opened.set()
        assert await find_sources_behind(client, {JOURNAL: len(content)}) == []
        # Content truly gone is found once the store is listed.
        behind = await find_sources_behind(client, {JOURNAL: len(content) + 1})
        assert behind == [SourceBehind(JOURNAL, len(content) + 1, len(content))]
    finally:
        await client.close()
        await cluster.close()


async def _stored_fragments(tmp_path: Path, sizes: list[int]) -> tuple[StoreRegistry, int]:
    """A file:// store (under tmp_path/frags) holding fragments of JOURNAL of `sizes` bytes,
    back to back from offset 0; and where they end."""
    (tmp_path / "frags").mkdir()
    registry = StoreRegistry({"file": lambda url: FileStore(url, root=tmp_path)})
    begin = 0
    for size in sizes:
        content = b"x" * (size - 1) + b"\n"
        begin = (await put_fragment(registry, "file:///frags/", JOURNAL, begin, content)).end
    return registry, begin


async def test_content_lost_at_the_journals_start_does_not_fail_a_shard_past_it(
    tmp_path: Path,
) -> None:
    """The head is probed at offset -1: a probe from offset 0 met the lost range at the
    journal's start (a fragment file removed out of band) and failed DATA_LOSS, failing for
    good a shard whose checkpoint was far past it (found by review)."""
    registry, end = await _stored_fragments(tmp_path, [400, 400, 400])
    cluster = Cluster(stores=registry)
    broker = await cluster.start_broker("zone-a", "broker-a")
    client = JournalClient(broker.endpoint)
    try:
        await cluster.create(journal_spec(JOURNAL, stores=["file:///frags/"]), [broker])
        index = replica_of(broker, JOURNAL).index
        await index.wait_first_refresh(5.0)
        [first] = (tmp_path / "frags" / JOURNAL).glob(f"{0:016x}-*")
        first.unlink()
        await wait_until(lambda: bool(index.lost_fragments()))  # The next listing's.
        assert await probe_write_head(client, JOURNAL) == end
        assert await find_sources_behind(client, {JOURNAL: end}) == []
    finally:
        await client.close()
        await cluster.close()


async def test_a_suspended_journal_whose_fragments_are_gone_is_not_behind(
    tmp_path: Path,
) -> None:
    """A suspended journal's next append lands at its suspension offset, whatever its index
    holds: its fragments pruned (and its broker restarted), the probed head is 0, but a
    checkpoint at that offset lost nothing (found by review)."""
    registry, _ = await _stored_fragments(tmp_path, [])
    cluster = Cluster(stores=registry)
    broker = await cluster.start_broker("zone-a", "broker-a")
    client = JournalClient(broker.endpoint)
    try:
        spec = journal_spec(JOURNAL, stores=["file:///frags/"])
        spec.suspend.level = pb.JournalSpec.Suspend.PARTIAL
        spec.suspend.offset = 5000
        await cluster.create(spec, [broker])
        await replica_of(broker, JOURNAL).index.wait_first_refresh(5.0)
        assert await probe_write_head(client, JOURNAL) == 0
        assert await find_sources_behind(client, {JOURNAL: 5000}) == []
        behind = await find_sources_behind(client, {JOURNAL: 5001})
        assert behind == [SourceBehind(JOURNAL, 5001, 5000)]
        # Where the next append lands indeed.
        appended = await cluster.append(broker, JOURNAL, [b'{"key": "a"}\n'])
        assert appended.commit.begin == 5000
    finally:
        await client.close()
        await cluster.close()


@contextlib.asynccontextmanager
async def stored_journal(tmp_path: Path) -> AsyncIterator[tuple[Cluster, JournalClient]]:
    """A broker whose JOURNAL keeps its fragments in a file:// store under tmp_path/frags."""
    (tmp_path / "frags").mkdir()
    registry = StoreRegistry({"file": lambda url: FileStore(url, root=tmp_path)})
    cluster = Cluster(stores=registry)
    broker = await cluster.start_broker("zone-a", "broker-a")
    client = JournalClient(broker.endpoint)
    try:
        await cluster.create(_stored_spec(), [broker])
        yield cluster, client
    finally:
        await client.close()
        await cluster.close()


def _stored_spec() -> pb.JournalSpec:
    """JOURNAL in a file:// store, in fragments of ~1 KiB (the least length)."""
    spec = journal_spec(JOURNAL, length=1024, stores=["file:///frags/"])
    spec.labels.CopyFrom(labels.label_set([(labels.CONTENT_TYPE, CONTENT_TYPE_JSON_LINES)]))
    return spec


async def _recreate_over_store(cluster: Cluster, tmp_path: Path, end: int) -> None:
    """Persist JOURNAL's content through `end` (its replica stops), delete the journal and create
    it again over the same store."""
    await cluster.assign(JOURNAL, [])
    await wait_until(lambda: _stored_end(tmp_path) >= end)
    header, _ = await cluster.admin.delete(item_key(ROOT, JOURNAL).encode())
    await cluster.sync(header.revision)
    await cluster.create(_stored_spec(), [cluster.brokers[0]])


async def test_a_journal_restored_over_its_fragment_store_is_resumed_exactly_once(
    tmp_path: Path,
) -> None:
    """Deleted and created again over the same fragment store (specs applied again to a
    rebuilt etcd, a spec deleted by mistake), a journal has its persisted content back at the
    same offsets, and Gazette resumes it. The checkpoint's fingerprint of the bytes below its
    offset (read_tails.py) matches the journal's bytes there now, so the shard resumes (its
    reader's check restarts it, its start decides) and reads on exactly once. Before, it
    FAILED until an operator labelled it ``wait``."""
    async with stored_journal(tmp_path) as (cluster, client):
        async with sqlite_engine(tmp_path) as engine, AppendService(client) as appends:
            old = Producer(appends, "old")
            for _ in range(4):
                end = await _end(old)
            shard = _labelled(None)
            changed = Notifier()
            before = RESTORED_TOTAL.labels(JOURNAL)._value.get()
            async with ShardRunner(CountingApp(engine), client, root="/test/same") as runner:
                handle = runner.start(shard, on_change=changed.notify)
                await changed.read_through(handle, JOURNAL, end)
                await _restored_then_read_on(
                    cluster, tmp_path, engine, client, runner, handle, changed, end
                )
                assert RESTORED_TOTAL.labels(JOURNAL)._value.get() == before + 1
            assert await read_counts(engine, "shard-behind") == {"old": 4, "more": 1}


async def _restored_then_read_on(
    cluster: Cluster,
    tmp_path: Path,
    engine: Engine,
    client: JournalClient,
    runner: ShardRunner,
    handle: LocalShard,
    changed: Notifier,
    end: int,
) -> None:
    """The shard read JOURNAL through `end` (committed, with a fingerprint); the journal is
    created again over its store, a message "more" is appended past `end`, and the shard reads
    it without failing."""
    checkpoint = await read_checkpoint(engine, runner.fqn(handle.id))
    assert checkpoint is not None and JOURNAL in fingerprints_of(checkpoint)
    await _recreate_over_store(cluster, tmp_path, end)
    await wait_until(lambda: _listed(cluster))
    # As in Gazette, its spool starts empty below an index that holds [0, end): appends are
    # refused until an operator confirms the journal's end.
    assert await reset_head(client, JOURNAL) == (end, "reset")
    async with AppendService(client) as appends:
        last = await _end(Producer(appends, "more"))
    assert last > end  # Appended past the restored content.
    await changed.read_through(handle, JOURNAL, last)
    assert handle.status().code != Code.FAILED, handle.status().errors


def _listed(cluster: Cluster) -> bool:
    """Whether the broker's replica of JOURNAL (created again) listed its store once."""
    replica = cluster.brokers[0].resolver.replicas.get(JOURNAL)
    return replica is not None and replica.index.first_refresh.is_set()


async def test_a_shard_restarted_then_restored_over_its_store_resumes_after_a_small_commit(
    tmp_path: Path,
) -> None:
    """Found by review: a shard started again holds nothing below where it resumes, so a
    commit fewer than TAIL_BYTES past it recorded no fingerprint, and a journal then restored
    over its store failed the shard (a false alarm). Its reader is now seeded with the bytes
    below the checkpoint (read again at its start, checked against its fingerprint)."""
    async with stored_journal(tmp_path) as (cluster, client):
        async with sqlite_engine(tmp_path) as engine, AppendService(client) as appends:
            old = Producer(appends, "old")
            for _ in range(4):
                end = await _end(old)
            shard = _labelled(None)
            changed = Notifier()
            async with ShardRunner(CountingApp(engine), client, root="/test/window") as runner:
                handle = runner.start(shard, on_change=changed.notify)
                await changed.read_through(handle, JOURNAL, end)
                await runner.stop(shard.id)  # A rebalance, say.
                handle = runner.start(shard, on_change=changed.notify)
                small = await _end(old)
                assert small - end < TAIL_BYTES
                await changed.read_through(handle, JOURNAL, small)
                await _restored_then_read_on(
                    cluster, tmp_path, engine, client, runner, handle, changed, small
                )
            assert await read_counts(engine, "shard-behind") == {"old": 5, "more": 1}


async def test_a_live_journal_of_small_appends_keeps_a_fingerprint(tmp_path: Path) -> None:
    """Found by review: a shard reading a journal as it is written takes a chunk per append;
    tails bounded by a count of chunks held fewer than TAIL_BYTES of small ones, and the
    checkpoint recorded no fingerprint."""
    async with stored_journal(tmp_path) as (_cluster, client):
        async with sqlite_engine(tmp_path) as engine, AppendService(client) as appends:
            shard = _labelled(None)
            changed = Notifier()
            async with ShardRunner(CountingApp(engine), client, root="/test/live") as runner:
                handle = runner.start(shard, on_change=changed.notify)
                producer, end = Producer(appends, "o"), 0
                for _ in range(8):
                    begin, end = end, await _end(producer)
                    assert end - begin < TAIL_BYTES // 3
                    await changed.read_through(handle, JOURNAL, end)
                checkpoint = await read_checkpoint(engine, runner.fqn(shard.id))
                assert checkpoint is not None
                assert checkpoint.sources[JOURNAL].read_through == end
                assert JOURNAL in fingerprints_of(checkpoint)


async def test_a_store_that_kept_part_of_what_was_read_is_not_taken_for_restored(
    tmp_path: Path,
) -> None:
    """The case that broke a fingerprint taken once per incarnation (review of 0081006): the
    store kept only the first messages the shard read, so the journal created again over it
    has its head there, and new content appended since lies below the checkpoint's offset.
    The bytes below that offset are new, not those read: the shard fails, nothing skipped."""
    async with stored_journal(tmp_path) as (cluster, client):
        async with sqlite_engine(tmp_path) as engine, AppendService(client) as appends:
            old = Producer(appends, "old")
            ends = [await _end(old) for _ in range(30)]
            shard = _labelled(None)
            changed = Notifier()
            async with ShardRunner(CountingApp(engine), client, root="/test/part") as runner:
                handle = runner.start(shard, on_change=changed.notify)
                await changed.read_through(handle, JOURNAL, ends[-1])
                await runner.stop(shard.id)
                await _recreate_over_store(cluster, tmp_path, ends[-1])
                await cluster.assign(JOURNAL, [])  # The store is changed with no broker on it:
                kept = _keep_stored_below(tmp_path, ends[15])  # it kept only part,
                assert 0 < kept < ends[-1] - TAIL_BYTES
                await cluster.assign(JOURNAL, [cluster.brokers[0]])
                assert await reset_head(client, JOURNAL) == (kept, "reset")
                await _grow_past(appends, "new", ends[-1])  # and new content went on from there.
                handle = runner.start(shard, on_change=changed.notify)
                await changed.until(lambda: handle.status().code == Code.FAILED)
                error = handle.status().errors[0]
                assert "CheckpointAheadError" in error and "deleted and created again" in error
            assert await read_counts(engine, "shard-behind") == {"old": 30}


def _keep_stored_below(tmp_path: Path, offset: int) -> int:
    """Remove JOURNAL's stored fragments that end past `offset`; where those kept end."""
    for path in (tmp_path / "frags" / JOURNAL).glob("*"):
        if int(path.name.split("-")[1], 16) > offset:
            path.unlink()
    return _stored_end(tmp_path)


def _stored_end(tmp_path: Path) -> int:
    """Where the fragments stored under tmp_path/frags for JOURNAL end."""
    names = (tmp_path / "frags" / JOURNAL).glob("*")
    return max((int(p.name.split("-")[1], 16) for p in names), default=0)


async def test_unknown_create_revisions_are_never_a_change(tmp_path: Path) -> None:
    """Brokers from before Gazette filled ListResponse.Journal.create_revision answer 0 (found
    by review): not a journal created again, whatever the checkpoint recorded."""
    async with shard_env(tmp_path) as (env, _engine, _appends):
        behind = [SourceBehind("in/b", 50, 10)]
        found = find_recreated(
            {"in/a": 100, "in/b": 50, "in/c": 0},
            {"in/a": 7, "in/b": 0, "in/c": 3},
            {"in/a": 0, "in/b": 9, "in/c": 8},
            behind,
        )
        assert found == behind  # Untouched.
        await env.journal(JOURNAL)
        with pytest.raises(SourceRecreatedError):  # The reader's check: a real change.
            await verify_source(env.client, JOURNAL, 1)
        await verify_source(env.client, JOURNAL, 0)  # Unknown: never a change.


async def test_a_check_from_a_view_older_than_the_read_is_asked_again(tmp_path: Path) -> None:
    """The reader's check must see the journal as of the revision its read was served from: a
    broker whose view of etcd lags could still show the incarnation before the one read. A
    listing from an older revision is a transient error (the reader asks again, backed off)."""
    async with shard_env(tmp_path) as (env, _engine, _appends):
        await env.journal(JOURNAL)
        listed = await list_journals(env.client, f"name={JOURNAL}")
        created, now = listed.journals[0].create_revision, listed.header.etcd.revision
        with pytest.raises(StaleListingError, match=f"etcd revision {now}, older than"):
            await verify_source(env.client, JOURNAL, created, now + 1)
        assert classify(StaleListingError("x")) == Transience.TRANSIENT
        await verify_source(env.client, JOURNAL, created, now)  # As fresh as the read: passes.


async def test_a_read_answered_before_the_journal_was_created_is_not_taken(
    tmp_path: Path,
) -> None:
    """Found by review: a broker whose view of etcd predates the journal the shard reads may
    serve the journal deleted before it, and a List (fresher) then shows the revision the
    shard expects. A read answered from a revision below the journal's create revision is
    refused (StaleReadError: the shard starts over), as is a tail read for a restored check;
    quorum journals are never taken for restored."""
    async with shard_env(tmp_path) as (env, _engine, appends):
        await env.journal(JOURNAL)
        end = await _end(Producer(appends, "one"))
        listed = await list_journals(env.client, f"name={JOURNAL}")
        created, now = listed.journals[0].create_revision, listed.header.etcd.revision
        with pytest.raises(StaleReadError, match=f"answered from etcd revision {created - 1}"):
            await verify_source(env.client, JOURNAL, created, created - 1)
        assert classify(StaleReadError("x")) == Transience.TRANSIENT
        await verify_source(env.client, JOURNAL, created, created)
        await verify_source(env.client, JOURNAL, created, 0)  # Before any answer: nothing.
        reader = RetryReader(env.client, pb.ReadRequest(journal=JOURNAL, end_offset=end))
        content = b"".join([chunk.content async for chunk in reader])
        await reader.close()
        assert len(content) == end < TAIL_BYTES
        ask = (
            {JOURNAL: end}, {JOURNAL: created - 1}, {JOURNAL: created},
            {JOURNAL: tail_digest(content)},
        )  # fmt: skip
        assert await restored_sources(env.client, *ask) == {JOURNAL}
        assert await restored_sources(env.client, *ask, quorum={JOURNAL}) == set()
        # A tail answered from a revision before the incarnation it is checked for: asked again.
        ahead = ({JOURNAL: end}, {JOURNAL: created - 1}, {JOURNAL: now + 100}, ask[3])
        with pytest.raises(StaleListingError, match="before the journal was created"):
            await restored_sources(env.client, *ahead)


async def test_a_journal_made_a_source_again_after_it_was_created_again_is_checked(
    tmp_path: Path,
) -> None:
    """Found by review: a journal the checkpoint read that is no longer a source lost its
    recorded revision at the next commit; made a source again after it was deleted and created
    again, it was resumed at the old offset unchecked. Its revision is now carried."""
    other = "in/other"
    async with shard_env(tmp_path) as (env, engine, appends):
        await env.journal(JOURNAL)
        await env.journal(other)
        both, alone = (
            shard_spec("shard-behind", [JOURNAL, other]),
            shard_spec("shard-behind", [other]),
        )
        changed = Notifier()
        async with ShardRunner(CountingApp(engine), env.client, root="/test/again") as runner:
            handle = runner.start(both, on_change=changed.notify)
            for _ in range(4):
                end = await _end(Producer(appends, "old"))
            await changed.read_through(handle, JOURNAL, end)
            await runner.stop(both.id)
            handle = runner.start(alone, on_change=changed.notify)  # JOURNAL no longer a source,
            other_end = (await (await Producer(appends, "o").committed(other, "o"))).commit.end
            await changed.read_through(handle, other, other_end)  # and a commit since.
            await runner.stop(alone.id)
            checkpoint = await read_checkpoint(engine, runner.fqn(alone.id))
            assert checkpoint is not None and JOURNAL in create_revisions_of(checkpoint)
            await _recreate(env)
            await _grow_past(appends, "new", end)
            handle = runner.start(both, on_change=changed.notify)
            await changed.until(lambda: handle.status().code == Code.FAILED)
            assert "deleted and created again" in handle.status().errors[0]
