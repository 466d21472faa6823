"""Playback reading persisted fragments straight from their store's files (log_source.py), on a
real in-process broker with a file:// store: it plays exactly what playback through the broker
plays, with and without hints that skip history; a fragment file that is not its fragment's
content fails playback with the typed data-loss error, and leaves nothing played behind; a file
read that fails part-way is read again from its start, handing out each byte once."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker.client.list_apply import list_all_fragments
from broker.client.reader import open_url
from broker.client.route_cache import JournalClient
from broker.fragment.naming import parse_content_name
from broker.fragment.stores.base import FragmentReader
from broker.fragment.stores.registry import new_registry
from broker.fragment.verify import DataLossError, FragmentIntegrityError, IntegrityFailure
from broker.protocol import protocol_pb2 as pb
from broker.protocol.recorded_op_pb2 import FSMHints
from gazette_consumer.recoverylog.log_source import LogSource
from gazette_consumer.recoverylog.player import Player
from tests.broker.broker_testkit import Cluster, journal_spec
from tests.gazette_consumer.recoverylog.test_recoverylog_playback import LocalFiles, primary, tree

LOG = "recovery/direct/log"
FRAGMENT_BYTES = 16 << 10  # Small: the log rolls into many fragments.
PERSIST_TIMEOUT_S = 20.0
PERSIST_POLL_S = 0.05


@dataclass
class StoreEnv:
    client: JournalClient
    root: Path  # The file:// store's root.


@pytest.fixture
async def store_env(tmp_path: Path) -> AsyncIterator[StoreEnv]:
    root = tmp_path / "store"
    (root / "frag").mkdir(parents=True)
    cluster = Cluster(stores=new_registry(file_root=root))
    broker = await cluster.start_broker("zone-a", "broker-a")
    client = JournalClient(broker.endpoint)
    spec = journal_spec(LOG, length=FRAGMENT_BYTES, stores=["file:///frag/"])
    await cluster.create(spec, [broker])
    try:
        yield StoreEnv(client, root)
    finally:
        await client.close()
        await cluster.close()


async def record_history(env: StoreEnv, directory: Path) -> LocalFiles:
    """A history of several files, rewritten and removed, over many fragments."""
    _, files = await primary(env.client, LOG, directory)
    for round_ in range(4):
        await files.write(f"wal-{round_}", os.urandom(20_000))
        await files.write("sst", os.urandom(30_000))  # Replaced each round.
        if round_:
            await files.remove(f"wal-{round_ - 1}")
    await files.write("MANIFEST", b"manifest", offset=None)
    await files.write("MANIFEST", b"-edit", offset=8)
    await files.recorder.flush()
    return files


async def persisted_through(env: StoreEnv, offset: int) -> list[pb.Fragment]:
    """Wait until the log's fragments are persisted up to `offset` (the persister closes and
    uploads them in the background: there is no event to wait on); return them."""
    async with asyncio.timeout(PERSIST_TIMEOUT_S):
        while True:
            listing = await list_all_fragments(env.client, pb.FragmentsRequest(journal=LOG))
            stored = [f.spec for f in listing.fragments if f.spec.backing_store]
            if stored and max(f.end for f in stored) >= offset:
                return stored
            await asyncio.sleep(PERSIST_POLL_S)


async def play(env: StoreEnv, hints: FSMHints, into: Path, *, direct: bool) -> Player:
    player = Player(env.client, hints, into, direct_reads=direct)
    player.finish_at_write_head()
    await player.play()
    return player


@pytest.mark.parametrize("hinted", [False, True], ids=["whole-log", "hinted"])
async def test_store_reads_play_what_broker_reads_play(
    store_env: StoreEnv, tmp_path: Path, hinted: bool
) -> None:
    files = await record_history(store_env, tmp_path / "recorded")
    hints = await files.recorder.build_hints() if hinted else FSMHints(log=LOG)
    # All but the last, open fragment.
    stored = await persisted_through(store_env, files.recorder.write_head - FRAGMENT_BYTES)

    direct = await play(store_env, hints, tmp_path / "direct", direct=True)
    via_broker = await play(store_env, hints, tmp_path / "broker", direct=False)

    assert tree(tmp_path / "direct") == tree(tmp_path / "broker") == tree(tmp_path / "recorded")
    # Every fragment persisted before playback, from where it began, was read from its file,
    # whole (more may have been persisted since).
    touched = [f for f in stored if f.end > direct.read_from]
    assert direct.direct_bytes >= sum(f.end - f.begin for f in touched) > 0
    assert via_broker.direct_bytes == 0
    assert via_broker.broker_bytes > direct.broker_bytes
    if hinted:
        assert direct.read_from > 0  # The hints skipped history.


async def test_a_corrupt_fragment_file_fails_playback_with_data_loss(
    store_env: StoreEnv, tmp_path: Path
) -> None:
    files = await record_history(store_env, tmp_path / "recorded")
    stored = await persisted_through(store_env, files.recorder.write_head - FRAGMENT_BYTES)
    victim = sorted(stored, key=lambda f: f.begin)[1]
    folder = store_env.root / "frag" / LOG
    (path,) = [
        p
        for p in folder.iterdir()
        if not p.name.startswith(".")  # An upload in progress.
        and parse_content_name(p.name)[:2] == (victim.begin, victim.end)
    ]
    content = bytearray(path.read_bytes())
    content[len(content) // 2] ^= 0xFF  # Same length, other content.
    path.write_bytes(bytes(content))

    with pytest.raises(FragmentIntegrityError) as caught:
        await play(store_env, FSMHints(log=LOG), tmp_path / "played", direct=True)
    assert isinstance(caught.value, DataLossError)
    assert caught.value.failure is IntegrityFailure.SHA1_MISMATCH
    assert caught.value.fragment.begin == victim.begin
    assert LOG in str(caught.value)
    assert not (tmp_path / "played").exists()  # Nothing played is left behind.


@dataclass
class Faults:
    failed: int = 0


class FailingOnce(FragmentReader):
    """A store's reader that fails its `fail_at`-th read with an I/O error (a store that
    breaks off part-way), once across all the readers sharing `faults`."""

    def __init__(self, inner: FragmentReader, fail_at: int, faults: Faults) -> None:
        self._inner, self._reads, self._fail_at, self._faults = inner, 0, fail_at, faults

    async def read(self, size: int = 1 << 16) -> bytes:
        self._reads += 1
        if self._reads == self._fail_at and not self._faults.failed:
            self._faults.failed += 1
            raise OSError("connection reset by the store")
        return await self._inner.read(size)

    async def aclose(self) -> None:
        await self._inner.aclose()


async def log_bytes(source: LogSource, end: int) -> bytes:
    out = bytearray()
    await source.start()
    try:
        while len(out) < end:
            chunk = await source.read_chunk()
            assert chunk.offset == len(out)
            out += chunk.data
    finally:
        await source.close()
    return bytes(out)


async def test_a_file_read_failing_part_way_is_read_again_whole(
    store_env: StoreEnv, tmp_path: Path
) -> None:
    files = await record_history(store_env, tmp_path / "recorded")
    head = files.recorder.write_head
    await persisted_through(store_env, head - FRAGMENT_BYTES)

    faults = Faults()

    async def flaky(url: str) -> FragmentReader:
        return FailingOnce(await open_url(url), fail_at=3, faults=faults)

    direct = LogSource(
        store_env.client, LOG, 0, direct_end=head, opener=flaky, stored_read_bytes=4096
    )
    via_broker = LogSource(store_env.client, LOG, 0, direct_end=head, direct=False)
    assert await log_bytes(direct, head) == await log_bytes(via_broker, head)
    assert faults.failed == 1
    assert direct.fragments_verified >= 3


async def test_hints_skipping_history_between_files_read_from_the_store(
    store_env: StoreEnv, tmp_path: Path
) -> None:
    """A live file early in the log, obsolete churn over several fragments, a live file late:
    the player skips from the first hinted segment to the second, over fragment files."""
    _, files = await primary(store_env.client, LOG, tmp_path / "recorded")
    await files.write("early", b"written first, never changed")
    await files.recorder.flush()
    churn_begin = files.recorder.write_head
    for _ in range(12):
        await files.write("churn", os.urandom(8000))
        await files.remove("churn")
    await files.recorder.flush()
    churn_end = files.recorder.write_head
    await files.write("late", os.urandom(3000))
    hints = await files.recorder.build_hints()
    segments = sorted(s.first_offset for n in hints.live_nodes for s in n.segments)
    assert segments[0] < churn_begin and segments[-1] >= churn_end  # Two, with churn between.
    assert churn_end - churn_begin > 2 * FRAGMENT_BYTES
    await persisted_through(store_env, files.recorder.write_head - FRAGMENT_BYTES)

    direct = await play(store_env, hints, tmp_path / "direct", direct=True)
    assert tree(tmp_path / "direct") == tree(tmp_path / "recorded")
    # Fragment files wholly inside the skipped history are not read at all (one the source had
    # begun when the player skipped is read whole, to verify it): most of the churn is not read.
    assert 0 < direct.direct_bytes
    assert direct.direct_bytes + direct.broker_bytes < churn_end - churn_begin
