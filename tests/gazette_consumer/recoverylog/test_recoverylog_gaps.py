"""A recovery log with content missing is an error, never an older state recovered in silence.

Playback skips ops that are not part of the history (a zombie's, a duplicate, a dead branch).
Ops of the history missing from the log looked alike to a player that only checked seq_nos: a
gap in the log read over, then the history's later ops skipped as if a zombie's, and the state
recovered was an older one, or empty (as Gazette's player does). These logs lose content as a
user's would: fragments persisted to a file store, the broker gone, one fragment file deleted,
and a fresh broker serving what the store holds, which reads over the missing range (its
fragments hours old). Playback from the log's start (no hints) must then fail, naming what is
missing. And a recorder whose append lands below the head it had read through (the log's head
reset after every replica lost its content) fails rather than record ops no player could
reach."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker.cli.reset_head import reset_head
from broker.client.route_cache import JournalClient
from broker.fragment import naming
from broker.fragment.stores.registry import new_registry
from broker.protocol.recorded_op_pb2 import FSMHints
from gazette_consumer.recoverylog.fsm import new_random_author
from gazette_consumer.recoverylog.ops import CorruptLogError
from gazette_consumer.recoverylog.player import play_and_handoff
from gazette_consumer.recoverylog.recorder import Recorder, RecorderFailedError
from tests.broker.broker_testkit import Cluster, journal_spec, wait_until
from tests.gazette_consumer.recoverylog.test_recoverylog_playback import primary, tree

LOG = "recovery/gaps/log"
STORE = "file:///fragments/"
WAIT_S = 20.0
# Each commit appends more than a fragment's length: the next append rolls the fragment.
FRAGMENT_LENGTH = 1024
COMMITS = 4
# Older than the index's offset-jump age (6 h): a read over a hole jumps it at once.
HOURS_OLD_S = 7 * 3600


@dataclass
class Env:
    cluster: Cluster
    client: JournalClient
    root: Path

    def stored(self) -> list[tuple[int, Path]]:
        """The log's fragment files in the store, by begin offset."""
        files = [p for p in (self.root / "fragments" / LOG).rglob("*") if p.is_file()]
        return sorted((naming.parse_content_name(p.name)[0], p) for p in files)


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    (tmp_path / "fragments").mkdir()
    cluster = Cluster(stores=new_registry(file_root=tmp_path))
    broker = await cluster.start_broker("zone-a", "broker-a")
    await cluster.create(journal_spec(LOG, length=FRAGMENT_LENGTH, stores=[STORE]), [broker])
    e = Env(cluster, JournalClient(broker.endpoint), tmp_path)
    try:
        yield e
    finally:
        await e.client.close()
        await cluster.close()


async def record_commits(env: Env, directory: Path) -> int:
    """COMMITS files written and flushed by a primary, each its own append; then its broker
    stops (persisting what it holds). The log's write head."""
    _, files = await primary(env.client, LOG, directory)
    for i in range(COMMITS):
        await files.write(f"state-{i}", os.urandom(2 * FRAGMENT_LENGTH))
        await files.recorder.flush()
    (old,) = env.cluster.brokers
    await env.client.close()
    await env.cluster.stop_broker(old)
    return files.recorder.write_head


async def serve_from_the_store(env: Env, head: int, *, without: int | None = None) -> None:
    """A fresh broker serving the log from the store, hours old, less the `without`-th
    fragment file."""
    stored = env.stored()
    assert stored and stored[0][0] == 0, stored
    old = time.time() - HOURS_OLD_S
    for _, path in stored:
        os.utime(path, (old, old))
    expected = len(stored)
    if without is not None:
        stored[without][1].unlink()
        expected -= 1
    fresh = await env.cluster.start_broker("zone-a", "broker-b")
    await env.cluster.assign(LOG, [fresh])
    env.client = JournalClient(fresh.endpoint)

    def listed() -> bool:
        replica = fresh.resolver.replicas.get(LOG)
        return replica is not None and replica.index.query(head - 1).fragment is not None

    # The fresh broker's first listing of the store: no event to await but its index.
    await wait_until(listed, WAIT_S)
    # Every broker that took part is gone: the operator confirms where the log goes on.
    assert await reset_head(env.client, LOG) == (head, "reset")


async def test_an_intact_log_served_from_the_store_plays_back_whole(
    env: Env, tmp_path: Path
) -> None:
    head = await record_commits(env, tmp_path / "a")
    await serve_from_the_store(env, head)
    await primary(env.client, LOG, tmp_path / "b")
    assert tree(tmp_path / "b") == tree(tmp_path / "a")


async def test_a_log_missing_its_start_is_an_error_not_an_empty_state(
    env: Env, tmp_path: Path
) -> None:
    head = await record_commits(env, tmp_path / "a")
    await serve_from_the_store(env, head, without=0)
    with pytest.raises(CorruptLogError, match="missing from the log") as caught:
        await primary(env.client, LOG, tmp_path / "b")
    assert "the log's start" in str(caught.value), caught.value
    assert not (tmp_path / "b").exists()  # A failed playback leaves no partial directory.


async def test_a_log_missing_a_range_is_an_error_not_an_older_state(
    env: Env, tmp_path: Path
) -> None:
    head = await record_commits(env, tmp_path / "a")
    await serve_from_the_store(env, head, without=2)
    with pytest.raises(CorruptLogError, match="missing from the log") as caught:
        await primary(env.client, LOG, tmp_path / "b")
    assert caught.value.log == LOG
    assert not (tmp_path / "b").exists()


async def test_a_recorder_whose_append_lands_below_its_head_fails(env: Env, tmp_path: Path) -> None:
    # What a recorder sees when the log's head was reset below what it had read through (every
    # replica lost the log's last content, and an operator reset the journal's head): its
    # append lands below that head.
    author = new_random_author()
    recovered = await play_and_handoff(env.client, FSMHints(log=LOG), tmp_path / "a", author)
    recorder = Recorder(
        env.client,
        recovered.fsm,
        author,
        tmp_path / "a",
        write_head=recovered.write_head + 4096,
    )
    (tmp_path / "a" / "x").write_bytes(b"x")
    await recorder.create("x")
    with pytest.raises(RecorderFailedError, match="broker data loss"):
        await recorder.flush()
    with pytest.raises(RecorderFailedError):
        await recorder.create("y")  # Unusable from then on.
