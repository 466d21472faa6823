"""Playback reading persisted fragments straight from their store's files (log_source.py), on a
real in-process broker with a file:// store: it plays exactly what playback through the broker
plays, with and without hints that skip history; a fragment file that is not its fragment's
content here is read through the broker instead, and one the broker finds corrupt too fails
playback with a typed data-loss error naming it, and leaves nothing played behind; a file read
that fails part-way is read again from its start, handing out each byte once."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import structlog.testing

from broker.cli.shards_prune import live_segments, plan_log
from broker.client.list_apply import list_all_fragments
from broker.client.reader import open_url
from broker.client.route_cache import JournalClient
from broker.fragment.naming import content_path, parse_content_name
from broker.fragment.stores.base import FragmentReader
from broker.fragment.stores.registry import new_registry
from broker.fragment.verify import DataLossError, FragmentIntegrityError, IntegrityFailure
from broker.protocol import protocol_pb2 as pb
from broker.protocol.recorded_op_pb2 import FSMHints, Segment
from gazette_consumer.recoverylog.fsm import new_random_author
from gazette_consumer.recoverylog.log_source import LogSource, StoredFragmentLostError
from gazette_consumer.recoverylog.player import Player, play_and_handoff
from gazette_consumer.recoverylog.recorder import Recorder
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


async def persisted_through(env: StoreEnv, offset: int, log: str = LOG) -> list[pb.Fragment]:
    """Wait until the log's fragments are persisted up to `offset` (the persister closes and
    uploads them in the background: there is no event to wait on); return them."""
    async with asyncio.timeout(PERSIST_TIMEOUT_S):
        while True:
            listing = await list_all_fragments(env.client, pb.FragmentsRequest(journal=log))
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


def corrupt_file(root: Path, fragment: pb.Fragment) -> Path:
    """Flip a byte in the middle of `fragment`'s file under the store root `root` (same
    length, other content); return its path."""
    folder = root / "frag" / LOG
    (path,) = [
        p
        for p in folder.iterdir()
        if not p.name.startswith(".")  # An upload in progress.
        and parse_content_name(p.name)[:2] == (fragment.begin, fragment.end)
    ]
    content = bytearray(path.read_bytes())
    content[len(content) // 2] ^= 0xFF
    path.write_bytes(bytes(content))
    return path


async def test_a_corrupt_file_here_is_read_through_the_broker(
    store_env: StoreEnv, tmp_path: Path
) -> None:
    """This host's copy of the store (a mount of its own) holds a corrupt file; the broker's
    store is intact: the fragment's range is read through the broker, the corrupt file is
    logged by name, and playback plays exactly the recorded files."""
    files = await record_history(store_env, tmp_path / "recorded")
    head = files.recorder.write_head
    stored = await persisted_through(store_env, head - FRAGMENT_BYTES)
    victim = sorted(stored, key=lambda f: f.begin)[1]
    mount = tmp_path / "mount"
    shutil.copytree(store_env.root, mount)
    bad = corrupt_file(mount, victim)
    original = str(store_env.root)

    async def through_mount(url: str) -> FragmentReader:
        return await open_url(url.replace(original, str(mount), 1))

    direct = LogSource(store_env.client, LOG, 0, direct_end=head, opener=through_mount)
    via_broker = LogSource(store_env.client, LOG, 0, direct_end=head, direct=False)
    with structlog.testing.capture_logs() as logs:
        played = await log_bytes(direct, head)
    assert played == await log_bytes(via_broker, head)
    assert direct.fragments_fallen_back == 1
    assert direct.broker_bytes >= victim.end - victim.begin
    (warned,) = [e for e in logs if "through a broker" in e["event"]]
    assert warned["file"].endswith(bad.name)  # The corrupt file, by name.


async def test_a_file_corrupt_for_every_broker_fails_playback_naming_it(
    store_env: StoreEnv, tmp_path: Path
) -> None:
    files = await record_history(store_env, tmp_path / "recorded")
    stored = await persisted_through(store_env, files.recorder.write_head - FRAGMENT_BYTES)
    victim = sorted(stored, key=lambda f: f.begin)[1]
    bad = corrupt_file(store_env.root, victim)  # The broker reads this same file.

    with pytest.raises(StoredFragmentLostError) as caught:
        await play(store_env, FSMHints(log=LOG), tmp_path / "played", direct=True)
    err = caught.value
    assert isinstance(err, DataLossError)
    assert err.journal == LOG and LOG in str(err)
    assert err.fragment.begin == victim.begin and err.fragment.end == victim.end
    assert bad.name in str(err)
    assert isinstance(err.store_error, FragmentIntegrityError)
    assert err.store_error.failure is IntegrityFailure.SHA1_MISMATCH
    assert isinstance(err.broker_error, DataLossError)  # The broker's DATA_LOSS.
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


async def test_a_long_lived_file_does_not_make_playback_read_dead_fragments(
    tmp_path: Path,
) -> None:
    # A MANIFEST edited after each of three 6 MiB files that are then removed (compaction
    # outputs compacted away): the MANIFEST's segments are split at the dead files, so the
    # player reads the fragments holding its edits and the live file, not the dead 18 MiB.
    # A prune by hints a player made keeps what hints made from them would need.
    root = tmp_path / "store"
    (root / "frag").mkdir(parents=True)
    cluster = Cluster(stores=new_registry(file_root=root))
    broker = await cluster.start_broker("zone-a", "broker-a")
    client = JournalClient(broker.endpoint)
    try:
        log = "recovery/direct/long-lived"
        await cluster.create(journal_spec(log, length=1 << 20, stores=["file:///frag/"]), [broker])
        author = new_random_author()
        recovered = await play_and_handoff(client, FSMHints(log=log), tmp_path / "a", author)
        recorder = Recorder(
            client, recovered.fsm, author, tmp_path / "a", write_head=recovered.write_head
        )
        files = LocalFiles(recorder)
        await files.write("MANIFEST", b"manifest")
        for i in range(3):
            await files.write(f"{i}.sst", os.urandom(6 << 20))
            await recorder.flush()
            await files.write("MANIFEST", b"+edit", offset=8 + 5 * i)
            await files.remove(f"{i}.sst")
        await files.write("kept.sst", os.urandom(100_000))
        hints = await recorder.build_hints()
        head = recorder.write_head
        stored = await persisted_through(StoreEnv(client, root), head - (1 << 20), log)

        player = Player(client, hints, tmp_path / "b", direct_reads=True)
        player.finish_at_write_head()
        played = await player.play()
        assert tree(tmp_path / "b") == tree(tmp_path / "a")
        read = player.direct_bytes + player.broker_bytes
        assert player.direct_bytes > 0
        assert read < head // 3, f"read {read} of a {head} byte log"

        # The player's hints (every segment's end exact) split the MANIFEST's segments at the
        # dead files too. A prune by them still keeps what lies between a file's segments of
        # one author: an FSM playing these hints may join them again (Gazette's does: it
        # extends a file's segment over every later op of its author), and a player of the
        # hints it makes then needs those ops. Here the MANIFEST's run spans the log from its
        # creation on: only what came before (the first hand-off) may go.
        hints_played = played.fsm.build_hints()
        plan = plan_log(log, live_segments(hints_played), stored)
        manifest_begins = hints_played.live_nodes[0].segments[0].first_offset
        assert all(f.end <= manifest_begins for f in plan.prune), [
            (f.begin, f.end) for f in plan.prune
        ]
        for fragment in plan.prune:
            (root / "frag" / content_path(fragment)).unlink()
        joined = joined_runs(hints_played)
        assert len(joined.live_nodes[0].segments) < len(hints_played.live_nodes[0].segments)
        for replay_hints, into in ((hints_played, "c"), (joined, "d")):
            replayer = Player(client, replay_hints, tmp_path / into, direct_reads=True)
            replayer.finish_at_write_head()
            await replayer.play()
            assert tree(tmp_path / into) == tree(tmp_path / "a")
    finally:
        await client.close()
        await cluster.close()


def joined_runs(hints: FSMHints) -> FSMHints:
    """`hints` with each live file's consecutive segments of one author joined into one, as
    Gazette's FSM rebuilds them when it plays split hints."""
    out = FSMHints()
    out.CopyFrom(hints)
    for node in out.live_nodes:
        runs: list[Segment] = []
        for segment in node.segments:
            if runs and runs[-1].author == segment.author and runs[-1].log == segment.log:
                runs[-1].last_seq_no, runs[-1].last_offset = (
                    segment.last_seq_no,
                    segment.last_offset,
                )
            else:
                copied = Segment()
                copied.CopyFrom(segment)
                runs.append(copied)
        del node.segments[:]
        node.segments.extend(runs)
    return out
