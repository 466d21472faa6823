"""RocksDBStore against a real in-process broker and real RocksDB databases: the store
conformance kit; exactly the committed keys and checkpoint restored from the log after many
commits that flush memtables and compact (SSTs created and deleted), with the played files
byte-identical to RocksDB's; every op-boundary prefix of the log restoring a committed state
(what a commit failing half-way leaves); a zombie fenced; a crash before start_commit leaving
nothing; and a shard recording a RocksDB store through its recovery_log_prefix."""

from __future__ import annotations

import asyncio
import os
import random
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import rocksdict

from broker.client.append_service import AppendService, AsyncAppend
from broker.client.route_cache import JournalClient
from broker.protocol.recorded_op_pb2 import FSMHints
from examples.word_count import WordCount
from gazette_consumer.application import Shard
from gazette_consumer.checkpoint import Checkpoint, decode_checkpoint
from gazette_consumer.message.message import Envelope
from gazette_consumer.message.publisher import Publisher
from gazette_consumer.recoverylog.ops import DecodedOp, OpDecoder
from gazette_consumer.recoverylog.player import Player
from gazette_consumer.recoverylog.recorder import Recorder
from gazette_consumer.shard_runner import LocalShard, ShardRunner
from gazette_consumer.stores.base import FencedError, ShardContext, Store
from gazette_consumer.stores.conformance import SimpleShard, check_store, sample_checkpoint
from gazette_consumer.stores.rocksdb import CHECKPOINT_KEY, RocksDBStore
from tests.broker.broker_testkit import content_from_start, journal_spec, wait_until
from tests.gazette_consumer.recovery_testkit import Texts, create_log, words_spec
from tests.gazette_consumer.shard_testkit import Notifier, broker_env
from tests.gazette_consumer.stores.recorded_testkit import RecordedFactory, factory_on_a_broker

State = dict[bytes, bytes]


def small_buffers(options: rocksdict.Options) -> None:
    """Tiny memtables and level-0 triggers: a few hundred KiB of writes flush and compact."""
    options.set_write_buffer_size(32 << 10)
    options.set_max_write_buffer_number(2)
    options.set_level_zero_file_num_compaction_trigger(2)
    options.set_target_file_size_base(64 << 10)
    options.set_max_bytes_for_level_base(128 << 10)


class RocksDBFactory(RecordedFactory):
    async def open(self, shard: ShardContext) -> Store:
        return await self.open_rocksdb(shard)

    async def open_rocksdb(self, shard: ShardContext) -> RocksDBStore:
        log = await self.log_of(shard.fqn)
        return RocksDBStore(self.client, log, self.directory(), configure=small_buffers)

    async def stage(self, store: Store, key: str, value: bytes) -> None:
        assert isinstance(store, RocksDBStore)
        store.put(key.encode(), value)

    async def read(self, store: Store, key: str) -> bytes | None:
        assert isinstance(store, RocksDBStore)
        return store.get(key.encode())


@pytest.fixture
async def factory(tmp_path: Path) -> AsyncIterator[RocksDBFactory]:
    async with factory_on_a_broker(RocksDBFactory, tmp_path) as made:
        yield made


def open_items(directory: Path) -> tuple[State, Checkpoint]:
    """Open a (played) database directory as a new primary would; its user keys and
    checkpoint."""
    options = rocksdict.Options(raw_mode=True)
    db = rocksdict.Rdict(str(directory), options)
    try:
        items: State = {}
        for key, value in db.items():
            assert isinstance(key, bytes) and isinstance(value, bytes)
            items[key] = value
    finally:
        db.close()
    data = items.pop(CHECKPOINT_KEY, None)
    return items, Checkpoint() if data is None else decode_checkpoint(data)


def committed_items(store: RocksDBStore) -> State:
    """The user keys of a restored store's database."""
    items: State = {}
    for key, value in store.db.items():
        assert isinstance(key, bytes) and isinstance(value, bytes)
        if key != CHECKPOINT_KEY:
            items[key] = value
    return items


async def play(client: JournalClient, log: str, directory: Path) -> None:
    """Play `log` into `directory` read-only (no hand-off)."""
    player = Player(client, FSMHints(log=log), directory)
    player.finish_at_write_head()
    await player.play()


def commit_writes(rng: random.Random, n: int, model: State, store: RocksDBStore) -> None:
    """Stage one transaction: overwrites, new keys and deletions of earlier keys."""
    for _ in range(n):
        if model and rng.random() < 0.15:
            key = rng.choice(sorted(model))
            store.delete(key)
            del model[key]
            continue
        key = b"key-%05d" % rng.randrange(4000)
        value = rng.randbytes(rng.randrange(50, 400))
        store.put(key, value)
        model[key] = value


async def settle(store: RocksDBStore) -> None:
    """Flush the memtable (a new SST) and compact everything (the inputs deleted), then wait
    until the directory holds no obsolete SST: RocksDB may purge them after compact_range
    returns, and offers no event for it."""
    store.db.flush()
    store.db.compact_range(None, None)
    live = {f["name"].lstrip("/") for f in store.db.live_files()}
    await wait_until(lambda: {f for f in os.listdir(store.directory) if f.endswith(".sst")} == live)


async def test_rocksdb_store_conformance(factory: RocksDBFactory) -> None:
    await check_store(factory)


async def test_many_commits_restore_exactly_the_committed_state(factory: RocksDBFactory) -> None:
    shard = SimpleShard(fqn="test/items/many")
    store = await factory.open_rocksdb(shard)
    rng, model = random.Random(7), State()
    seen_ssts: set[str] = set()
    try:
        assert await store.restore_checkpoint(shard) == Checkpoint()
        for n in range(1, 61):
            commit_writes(rng, 40, model, store)
            await (await store.start_commit(shard, sample_checkpoint(n), []))
            seen_ssts |= {f for f in os.listdir(store.directory) if f.endswith(".sst")}
        # Settle the database, then record that state with one more commit: the log must now
        # name exactly RocksDB's live files.
        await settle(store)
        store.put(b"last", b"commit")
        model[b"last"] = b"commit"
        await (await store.start_commit(shard, sample_checkpoint(61), []))
        live_ssts = {f["name"].lstrip("/") for f in store.db.live_files()}

        played = factory.root / "played"
        await play(factory.client, store.log, played)
        played_ssts = {f for f in os.listdir(played) if f.endswith(".sst")}
        # Memtables flushed and compactions ran: SSTs were created, and deleted ones were
        # unlinked in the log too.
        assert len(seen_ssts) > len(live_ssts) + 5, (seen_ssts, live_ssts)
        assert played_ssts == live_ssts
        # The database is quiet now (nothing to flush or compact): the played directory is the
        # store's, file for file and byte for byte (but for the lock and info log).
        local = {f for f in os.listdir(store.directory) if f != "LOCK" and not f.startswith("LOG")}
        assert set(os.listdir(played)) == local
        for name in local:
            assert (played / name).read_bytes() == (store.directory / name).read_bytes(), name
        assert open_items(played) == (model, sample_checkpoint(61))
        hints = await store.build_hints()
    finally:
        await store.destroy()

    # A new primary restores exactly the committed state from the log (into a fresh directory),
    # skipping the history of deleted files by the hints.
    restored = RocksDBStore(factory.client, store.log, factory.directory(), hints=hints)
    try:
        assert await restored.restore_checkpoint(shard) == sample_checkpoint(61)
        assert committed_items(restored) == model
    finally:
        await restored.destroy()


def decode_ops(log: str, content: bytes) -> list[DecodedOp]:
    return [event for event in OpDecoder(log, 0).feed(content) if isinstance(event, DecodedOp)]


async def test_every_prefix_of_the_log_restores_a_committed_state(
    factory: RocksDBFactory,
) -> None:
    """A commit that fails half-way leaves a prefix of its ops in the log: whatever the prefix,
    playing it restores the previous commit or this one, never a broken database."""
    shard = SimpleShard(fqn="test/items/prefixes")
    store = await factory.open_rocksdb(shard)
    rng, model = random.Random(11), State()
    states: list[tuple[State, Checkpoint]] = [({}, Checkpoint())]
    heads = [0]
    try:
        await store.restore_checkpoint(shard)
        assert store.recorder is not None
        heads[0] = store.recorder.write_head
        for n in range(1, 14):
            if n == 13:
                await settle(store)  # Commit 13 records a flush and a full compaction.
            commit_writes(rng, 60, model, store)
            await (await store.start_commit(shard, sample_checkpoint(n), []))
            states.append((dict(model), sample_checkpoint(n)))
            heads.append(store.recorder.write_head)
    finally:
        await store.destroy()

    content = content_from_start(factory.cluster, store.log)
    assert len(content) == heads[-1]
    ops = [op.op for op in decode_ops(store.log, content) if op.op.first_offset >= heads[0]]
    # The commits flushed memtables and compacted: SSTs were created and deleted.
    assert any(op.create.path.endswith(".sst") for op in ops if op.HasField("create"))
    assert any(op.unlink.path.endswith(".sst") for op in ops if op.HasField("unlink"))
    checked = 0
    for boundary in sorted({op.last_offset for op in ops}):
        if boundary <= heads[0]:
            continue
        commit = next(i for i in range(1, len(heads)) if boundary <= heads[i])
        prefix_log = f"recovery/prefix-{checked}"
        await factory.cluster.create(journal_spec(prefix_log), factory.cluster.brokers)
        prefix = content[:boundary]
        chunks = [prefix[at : at + (1 << 20)] for at in range(0, len(prefix), 1 << 20)]
        await factory.cluster.append(factory.cluster.brokers[0], prefix_log, chunks)
        # A new primary of the shard restores from the prefix.
        restored = RocksDBStore(factory.client, prefix_log, factory.directory())
        try:
            checkpoint = await restored.restore_checkpoint(shard)
            got = committed_items(restored), checkpoint
        finally:
            await restored.destroy()
        assert got in (states[commit - 1], states[commit]), (
            f"prefix through {boundary} (in commit {commit}) restored neither commit "
            f"{commit - 1} nor {commit}"
        )
        checked += 1
    assert checked > 13 * 3  # Several ops per commit: the prefixes cut inside commits.


async def test_the_checkpoint_key_is_reserved(factory: RocksDBFactory) -> None:
    shard = SimpleShard(fqn="test/items/reserved")
    store = await factory.open_rocksdb(shard)
    try:
        await store.restore_checkpoint(shard)
        for use in (
            lambda: store.put(CHECKPOINT_KEY, b"x"),
            lambda: store.delete(CHECKPOINT_KEY),
            lambda: store.get(CHECKPOINT_KEY),
        ):
            with pytest.raises(ValueError, match="reserved"):
                use()
    finally:
        await store.destroy()


async def test_zombie_commit_fails_fenced(factory: RocksDBFactory) -> None:
    shard = SimpleShard(fqn="test/items/zombie")
    old = await factory.open_rocksdb(shard)
    new: RocksDBStore | None = None
    try:
        await old.restore_checkpoint(shard)
        old.put(b"k", b"committed")
        await (await old.start_commit(shard, sample_checkpoint(1), []))

        new = await factory.open_rocksdb(shard)
        assert await new.restore_checkpoint(shard) == sample_checkpoint(1)
        assert new.get(b"k") == b"committed"

        old.put(b"k", b"zombie")
        old.put(b"zombie-only", b"x")
        with pytest.raises(FencedError):
            await (await old.start_commit(shard, sample_checkpoint(2), []))
        new.put(b"new", b"primary")
        await (await new.start_commit(shard, sample_checkpoint(3), []))
    finally:
        await old.destroy()
        if new is not None:
            await new.destroy()

    played = factory.root / "played"
    await play(factory.client, factory.logs[shard.fqn], played)
    assert open_items(played) == ({b"k": b"committed", b"new": b"primary"}, sample_checkpoint(3))


async def test_a_crash_before_start_commit_leaves_nothing_of_the_transaction(
    factory: RocksDBFactory,
) -> None:
    shard = SimpleShard(fqn="test/items/crash")
    crashed = await factory.open_rocksdb(shard)
    await crashed.restore_checkpoint(shard)
    crashed.put(b"a", b"one")
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    first = await crashed.start_commit(shard, sample_checkpoint(1), [gate])
    # The next transaction runs while commit 1 waits: it sees commit 1's writes, and writes
    # enough to flush memtables were they in the database; commit 1 then applies and records,
    # and the process "dies" before the transaction's start_commit (nothing is destroyed
    # until the check).
    assert crashed.get(b"a") == b"one"
    crashed.delete(b"a")
    assert crashed.get(b"a") is None
    commit_writes(random.Random(3), 400, State(), crashed)
    gate.set_result(None)
    await first
    try:
        restored = await factory.open_rocksdb(shard)
        try:
            assert await restored.restore_checkpoint(shard) == sample_checkpoint(1)
            assert committed_items(restored) == {b"a": b"one"}
        finally:
            await restored.destroy()
    finally:
        await crashed.destroy()


# --- A shard recording a RocksDB store ------------------------------------------------------------


class RocksWordCount(WordCount):
    """The word count with its counts in a recorded RocksDB store (`count/<word>` keys)."""

    async def new_store(self, shard: Shard, recorder: Recorder | None) -> Store:
        assert recorder is not None
        return RocksDBStore.recorded(recorder, configure=small_buffers)

    async def consume_message(
        self, shard: Shard, store: Store, envelope: Envelope[Any], publisher: Publisher[AsyncAppend]
    ) -> None:
        assert isinstance(store, RocksDBStore)
        for word in envelope.message.text.lower().split():
            key = b"count/" + word.encode()
            store.put(key, b"%d" % (int(store.get(key) or b"0") + 1))


async def read_through(changed: Notifier, handle: LocalShard, journal: str, end: int) -> None:
    await changed.until(lambda: handle.progress().read_through.get(journal, 0) >= end)


async def logged_counts(client: JournalClient, log: str, directory: Path) -> Counter[str]:
    await play(client, log, directory)
    items, _ = open_items(directory)
    return Counter({k.removeprefix(b"count/").decode(): int(v) for k, v in items.items()})


async def test_a_shard_records_its_rocksdb_store_exactly_once(tmp_path: Path) -> None:
    async with broker_env() as env, AppendService(env.client) as appends:
        source = await env.journal("in/words-rocksdb")
        spec = words_spec("shard-rocksdb", source)
        log = await create_log(env, spec)
        texts, changed = Texts(appends), Notifier()
        root = "/test/rocksdb-store"
        end = 0
        for run in range(2):  # A second primary recovers the store from the log alone.
            async with ShardRunner(RocksWordCount(), env.client, root=root) as runner:
                handle = runner.start(spec, on_change=changed.notify)
                for batch in range(3):
                    lines = [f"the quick fox {run} {batch}", "the lazy dog " * 20]
                    end = await texts.send(source, lines)
                await read_through(changed, handle, source, end)
        assert await logged_counts(env.client, log, tmp_path / "check") == texts.expected
