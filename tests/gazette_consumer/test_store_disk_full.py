"""A shard whose store's disk fills up (a real tmpfs, filled to the last byte by another file)
rides it out: its commit fails with the store's own reason (SQLite's "database or disk is
full"; "No space left on device" for a RocksDB store and a JSON file store), the shard retries
with back-off in BACKFILL (not FAILED, and not silently), and once space returns it serves
again without an operator, every input message counted exactly once. Every kind of store a
disk holds: a SQLite database, a PostgreSQL server's data directory (a durable cluster of its
own; its error is psycopg's DiskFull), and RocksDB and JSON file stores recorded to their
recovery logs (played into the runner's data directory on that disk)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from broker.client.append_service import AppendService
from broker.protocol import consumer_pb2 as cpb
from broker.testing.pg_server import BIN_DIR as PG_BIN_DIR
from broker.testing.pg_server import PgServer
from examples.word_count import WordCount, counts_of
from gazette_consumer.shard_retry import ShardRetryPolicy
from gazette_consumer.shard_runner import ShardRunner
from gazette_consumer.stores.jsonfile import JSONFileStore
from tests.gazette_consumer.recovery_testkit import Texts, create_log, words_spec
from tests.gazette_consumer.shard_testkit import (
    CountingApp,
    Notifier,
    Producer,
    broker_env,
    prepare_engine,
    read_counts,
    shard_spec,
    sqlite_engine,
)
from tests.gazette_consumer.stores.test_rocksdb_store import RocksWordCount, logged_counts
from tests.small_disk import fill, small_disk

Code = cpb.ReplicaStatus.Code
ROOT = "/test/disk-full"
DISK_BYTES = 4 << 20
# Quick retries, with room for the test to give the space back: a cause that outlives them
# gives up as FAILED (test_shard_transient_failures.py).
QUICK = ShardRetryPolicy(initial_s=0.05, max_s=0.2, attempts_max=200)
# Keys of the transaction that meets the full disk: new rows, so the database and its WAL must
# grow (a commit that only rewrites pages the WAL already holds needs no new space).
NEW_KEYS = 3000
KEY_PAD = "k" * 200
# A PostgreSQL cluster's disk: about 40 MB after initdb (with its first WAL segment), and room
# to run.
PG_DISK_BYTES = 96 << 20


@pytest.fixture
def sql_disk_dir() -> Iterator[Path]:
    """Where a SQL store's disk is mounted: a directory that the postgres system user (which
    owns a PostgreSQL cluster when the tests run as root) can reach, unlike tmp_path (0700)."""
    base = Path(tempfile.mkdtemp(prefix="gazette-sql-disk-"))
    base.chmod(0o755)
    try:
        yield base / "disk"
    finally:
        shutil.rmtree(base, ignore_errors=True)


@contextlib.asynccontextmanager
async def sql_store_on(kind: str, disk: Path) -> AsyncIterator[tuple[Engine, str]]:
    """A SQL engine whose database lives on `disk`, and the text of its full-disk error: a
    SQLite file, or a durable PostgreSQL cluster of its own (broker/testing/pg_server.py:
    fsync=on, synchronous_commit=on), its data directory on the disk."""
    if kind == "sqlite":
        async with sqlite_engine(disk) as engine:
            yield engine, "database or disk is full"
        return
    if not (PG_BIN_DIR / "initdb").exists():
        pytest.skip("PostgreSQL 15 not installed: run `make system-deps`")
    async with PgServer(disk) as pg:
        engine = await prepare_engine(sa.create_engine(pg.url))
        try:
            # psycopg's DiskFull: "could not extend file ...: No space left on device". (A
            # commit that needs a new WAL segment makes PostgreSQL PANIC and restart instead: a
            # crashed server, which the soak's PostgreSQL crashes cover.)
            yield engine, "No space left on device"
        finally:
            engine.dispose()


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_sql_store_on_a_full_disk_retries_then_serves_exactly_once(
    sql_disk_dir: Path, kind: str
) -> None:
    disk_bytes = DISK_BYTES if kind == "sqlite" else PG_DISK_BYTES
    with small_disk(sql_disk_dir, disk_bytes) as disk:
        async with broker_env() as env, sql_store_on(kind, disk) as (engine, disk_full):
            source = await env.journal("in/disk-full")
            app, changed = CountingApp(engine), Notifier()
            async with (
                AppendService(env.client) as appends,
                ShardRunner(app, env.client, root=ROOT, retry=QUICK) as runner,
            ):
                handle = runner.start(shard_spec("shard-full", [source]), on_change=changed.notify)
                producer = Producer(appends, "p")
                for i in range(10):
                    await producer.committed(source, f"before-{i % 3}")
                end = (await (await producer.committed(source, "before-0"))).commit.end
                await changed.read_through(handle, source, end)
                assert handle.status().code == Code.PRIMARY

                filler = fill(disk)
                for i in range(NEW_KEYS):
                    await producer.committed(source, f"{KEY_PAD}-{i}")
                end = (await (await producer.committed(source, "last"))).commit.end
                # Its commit cannot be written: retried, with the database's reason, not FAILED.
                await changed.until(lambda: handle.retrying is not None)
                assert handle.retrying is not None
                assert disk_full in handle.retrying.error, handle.retrying.error
                assert handle.status().code == Code.BACKFILL

                filler.unlink()
                await changed.read_through(handle, source, end)
                assert handle.status().code == Code.PRIMARY
                assert handle.retrying is None
            assert await read_counts(engine, "shard-full") == dict(producer.expected)


@pytest.mark.parametrize("kind", ["rocksdb", "json"])
async def test_a_recorded_store_on_a_full_disk_retries_then_serves_exactly_once(
    tmp_path: Path, kind: str
) -> None:
    app = RocksWordCount() if kind == "rocksdb" else WordCount()
    with small_disk(tmp_path / "disk", DISK_BYTES) as disk:
        async with broker_env() as env, AppendService(env.client) as appends:
            source = await env.journal(f"in/words-disk-full-{kind}")
            spec = words_spec(f"shard-full-{kind}", source)
            log = await create_log(env, spec)
            texts, changed = Texts(appends), Notifier()
            async with ShardRunner(
                app, env.client, root=ROOT, data_dir=disk, retry=QUICK
            ) as runner:
                handle = runner.start(spec, on_change=changed.notify)
                end = await texts.send(source, ["the quick fox", "the lazy dog"])
                await changed.read_through(handle, source, end)

                filler = fill(disk)
                # New words: new keys (RocksDB flushes memtables into new SST files), a larger
                # JSON file.
                lines = [" ".join(f"w{i}x{j}" for j in range(50)) for i in range(200)]
                end = await texts.send(source, lines)
                await changed.until(lambda: handle.retrying is not None)
                assert handle.retrying is not None
                assert "No space left on device" in handle.retrying.error, handle.retrying.error
                assert handle.status().code == Code.BACKFILL

                filler.unlink()
                await changed.read_through(handle, source, end)
                assert handle.status().code == Code.PRIMARY
                assert handle.primary is not None
                store = handle.primary.store
            if isinstance(store, JSONFileStore):
                assert counts_of(store) == texts.expected
            else:
                assert await logged_counts(env.client, log, tmp_path / "check") == texts.expected
