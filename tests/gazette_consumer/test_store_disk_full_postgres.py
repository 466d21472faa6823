"""A shard whose PostgreSQL store's disk fills up: the database server's data directory on a
real tmpfs, filled to the last byte by another file, a durable cluster of its own (fsync=on,
synchronous_commit=on: broker/testing/pg_server.py). The commit that needs new space fails with
PostgreSQL's own reason, the shard retries with back-off in BACKFILL (not FAILED, and not
silently), and once space returns it serves again without an operator, every input message
counted exactly once. (A commit that needs room to extend a table fails with an ERROR, as
here; one that needs a new WAL segment makes PostgreSQL PANIC and restart: a crashed server,
which the soak's PostgreSQL crashes cover.)"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from broker.client.append_service import AppendService
from broker.protocol import consumer_pb2 as cpb
from broker.testing.pg_server import BIN_DIR, PgServer
from gazette_consumer.shard_retry import ShardRetryPolicy
from gazette_consumer.shard_runner import ShardRunner
from tests.gazette_consumer.shard_testkit import (
    CountingApp,
    Notifier,
    Producer,
    broker_env,
    prepare_engine,
    read_counts,
    shard_spec,
)
from tests.small_disk import fill, small_disk

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(
        not (BIN_DIR / "initdb").exists(),
        reason="PostgreSQL 15 not installed: run `make system-deps`",
    ),
]

Code = cpb.ReplicaStatus.Code
ROOT = "/test/pg-disk-full"
# The cluster (about 40 MB after initdb, with its first WAL segment) and room to run.
DISK_BYTES = 96 << 20
QUICK = ShardRetryPolicy(initial_s=0.05, max_s=0.5, attempts_max=400)
NEW_KEYS = 3000
KEY_PAD = "k" * 200


@pytest.fixture
def pg_disk_dir() -> Iterator[Path]:
    """Where the cluster's disk is mounted: a directory the postgres system user (which owns
    the cluster when the tests run as root) can reach, unlike pytest's tmp_path (0700)."""
    base = Path(tempfile.mkdtemp(prefix="gazette-pg-disk-"))
    base.chmod(0o755)
    try:
        yield base / "pg"
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def test_a_postgresql_store_on_a_full_disk_retries_then_serves_exactly_once(
    pg_disk_dir: Path,
) -> None:
    with small_disk(pg_disk_dir, DISK_BYTES) as disk:
        async with PgServer(disk) as pg, broker_env() as env:
            engine = await prepare_engine(sa.create_engine(pg.url))
            try:
                source = await env.journal("in/pg-disk-full")
                app, changed = CountingApp(engine), Notifier()
                async with (
                    AppendService(env.client) as appends,
                    ShardRunner(app, env.client, root=ROOT, retry=QUICK) as runner,
                ):
                    spec = shard_spec("shard-pg-full", [source])
                    handle = runner.start(spec, on_change=changed.notify)
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
                    await changed.until(lambda: handle.retrying is not None)
                    assert handle.retrying is not None
                    assert "No space left on device" in handle.retrying.error
                    assert handle.status().code == Code.BACKFILL

                    filler.unlink()
                    await changed.read_through(handle, source, end)
                    assert handle.status().code == Code.PRIMARY
                    assert handle.retrying is None
                assert await read_counts(engine, "shard-pg-full") == dict(producer.expected)
            finally:
                engine.dispose()
