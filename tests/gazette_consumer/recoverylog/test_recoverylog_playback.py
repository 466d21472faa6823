"""Recorder and Player against a real in-process broker: record a directory's history and play
it back byte for byte; hints skip obsolete history; a hot standby tails, catches up and becomes
primary; a hand-off fences the old recorder; garbage in the log is a typed error at its offset."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from broker.client.appender import append
from broker.protocol import protocol_pb2 as pb
from broker.protocol.recorded_op_pb2 import FSMHints
from gazette_consumer.recoverylog.fsm import new_random_author
from gazette_consumer.recoverylog.ops import CorruptLogError
from gazette_consumer.recoverylog.player import FNODES_DIR, Player, Recovered, play_and_handoff
from gazette_consumer.recoverylog.recorder import (
    Recorder,
    RecorderFailedError,
    RecorderFencedError,
    RecorderUsageError,
)
from tests.broker.broker_testkit import journal_spec, wait_until

WAIT_S = 20.0


def tree(directory: Path) -> dict[str, bytes]:
    """Every file under `directory`, by relative path, with its bytes."""
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def _pwrite(path: Path, data: bytes, offset: int) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, offset)
    finally:
        os.close(fd)


class LocalFiles:
    """Makes file changes in a directory and records each, as a store does."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder, self.dir = recorder, recorder.directory

    async def write(self, name: str, data: bytes, offset: int | None = None) -> None:
        path = self.dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if offset is None:
            path.write_bytes(data)
            fnode = await self.recorder.create(name)
            await self.recorder.write_at(fnode, data, 0)
            return
        _pwrite(path, data, offset)
        await self.recorder.write_at(self.recorder.fsm.links["/" + name], data, offset)

    async def link(self, src: str, target: str) -> None:
        os.link(self.dir / src, self.dir / target)
        await self.recorder.link(src, target)

    async def rename(self, src: str, target: str) -> None:
        os.replace(self.dir / src, self.dir / target)
        await self.recorder.rename(src, target)

    async def remove(self, name: str) -> None:
        (self.dir / name).unlink()
        await self.recorder.unlink(name)


async def primary(
    client: object, log: str, directory: Path, hints: FSMHints | None = None
) -> tuple[Recovered, LocalFiles]:
    author = new_random_author()
    recovered = await play_and_handoff(client, hints or FSMHints(log=log), directory, author)  # type: ignore[arg-type]
    recorder = Recorder(
        client,  # type: ignore[arg-type]
        recovered.fsm,
        author,
        directory,
        write_head=recovered.write_head,
        batch_bytes_max=4096,
        write_chunk_bytes_max=1000,
    )
    return recovered, LocalFiles(recorder)


async def test_record_then_play_back_byte_for_byte(env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    log = await env.new_log()
    _, files = await primary(env.client, log, tmp_path / "a")
    await files.write("one", b"first version")
    await files.write("sub/two", os.urandom(10_000))  # Several write ops and batches.
    await files.write("one", b"FIRST", offset=0)
    await files.link("one", "one-link")
    await files.write("gone", b"temporary")
    await files.rename("sub/two", "sub/renamed")
    await files.remove("gone")
    await files.write("tmp", b"replaces one-link")
    await files.rename("tmp", "one-link")
    await files.recorder.set_property("PROP", "property content")
    (tmp_path / "a" / "PROP").write_text("property content")
    await files.recorder.flush()

    recovered, _ = await primary(env.client, log, tmp_path / "b")
    assert tree(tmp_path / "b") == tree(tmp_path / "a")
    assert not (tmp_path / "b" / FNODES_DIR).exists()
    assert recovered.fsm.next_seq_no == files.recorder.fsm.next_seq_no + 1  # + its hand-off.


async def test_recorder_rejects_impossible_ops(env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    log = await env.new_log()
    _, files = await primary(env.client, log, tmp_path / "a")
    seq_no = files.recorder.fsm.next_seq_no
    with pytest.raises(RecorderUsageError, match="no recorded file"):
        await files.recorder.unlink("missing")
    with pytest.raises(RecorderUsageError, match="outside"):
        await files.recorder.create(tmp_path / "elsewhere")
    await files.write("x", b"x")
    with pytest.raises(RecorderUsageError, match="already linked"):
        await files.recorder.link("x", "x")
    assert files.recorder.fsm.next_seq_no == seq_no + 2  # Only x's create and write.


async def test_hints_skip_obsolete_history(env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    log = await env.new_log()
    _, files = await primary(env.client, log, tmp_path / "a")
    for _ in range(20):
        await files.write("churn", os.urandom(2000))  # Obsolete: rewritten every time.
        await files.remove("churn")
    await files.recorder.flush()
    obsolete_end = files.recorder.write_head
    await files.write("kept", b"the only live file")
    hints = await files.recorder.build_hints()
    assert [n.fnode for n in hints.live_nodes] == [files.recorder.fsm.links["/kept"]]
    assert hints.live_nodes[0].segments[0].first_offset >= obsolete_end

    player = Player(env.client, hints, tmp_path / "b")
    player.finish_at_write_head()
    recovered = await player.play()
    assert tree(tmp_path / "b") == {"kept": b"the only live file"}
    assert recovered.fsm.links == files.recorder.fsm.links


async def test_hot_standby_tails_then_becomes_primary(env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    log = await env.new_log()
    _, files = await primary(env.client, log, tmp_path / "a")
    await files.write("before", b"written before the standby started")
    await files.recorder.flush()

    standby = Player(env.client, FSMHints(log=log), tmp_path / "b")
    playing = asyncio.create_task(standby.play())
    async with asyncio.timeout(WAIT_S):
        await standby.tailing.wait()
    await files.write("during", b"written while the standby tails")
    await files.recorder.flush()
    # The standby applies ops as they arrive: wait until it has this one.
    await wait_until(lambda: standby.fsm.next_seq_no == files.recorder.fsm.next_seq_no, WAIT_S)
    assert not playing.done()  # Still tailing: it completes only when asked to.

    author = new_random_author()
    standby.inject_handoff(author)
    async with asyncio.timeout(WAIT_S):
        recovered = await playing
    assert recovered.author == author
    assert tree(tmp_path / "b") == tree(tmp_path / "a")
    with pytest.raises(RecorderFencedError):
        await files.write("after", b"by the old primary")
        await files.recorder.flush()


async def test_zombie_is_fenced_and_never_applied(env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    log = await env.new_log()
    _, old = await primary(env.client, log, tmp_path / "old")
    await old.write("shared", b"committed by the old primary")
    await old.recorder.flush()

    _, new = await primary(env.client, log, tmp_path / "new")  # Hands off: fences `old`.
    await old.write("zombie", b"written by the zombie")
    with pytest.raises(RecorderFencedError):
        await old.recorder.flush()
    with pytest.raises(RecorderFencedError):
        await old.recorder.create("more")  # Fenced for good.
    await new.write("fresh", b"by the new primary")
    await new.recorder.flush()

    # A zombie that bypasses the register (here: its own frames appended directly, with no
    # check) still never gets applied: its ops carry the old history's seq_nos/checksums.
    zombie_ops = b"".join(old.recorder._pending) or None
    assert zombie_ops is None  # The fenced batch was dropped, not left pending.

    await primary(env.client, log, tmp_path / "third")
    assert tree(tmp_path / "third") == {
        "shared": b"committed by the old primary",
        "fresh": b"by the new primary",
    }


async def test_a_zombie_with_nothing_to_flush_cannot_build_hints(env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    log = await env.new_log()
    _, old = await primary(env.client, log, tmp_path / "old")
    await old.write("shared", b"committed by the old primary")
    hints = await old.recorder.build_hints()  # Still the author: hints are built.
    assert hints.live_nodes

    _, new = await primary(env.client, log, tmp_path / "new")  # Hands off: fences `old`.
    await new.write("fresh", b"by the new primary")
    await new.recorder.flush()
    # The zombie resumes with nothing pending: building hints checks the register all the
    # same, so that its stale hints never replace the new primary's.
    with pytest.raises(RecorderFencedError):
        await old.recorder.build_hints()
    assert (await new.recorder.build_hints()).live_nodes


async def test_unfenced_zombie_frames_are_skipped(env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    log = await env.new_log()
    _, old = await primary(env.client, log, tmp_path / "old")
    await old.write("shared", b"shared")
    await old.recorder.flush()
    _, new = await primary(env.client, log, tmp_path / "new")
    # The zombie's ops reach the log without a register check (a writer predating
    # registers, as Gazette allows): sequenced against the old history, they do not apply.
    await old.write("zombie", b"zombie content")
    frames = list(old.recorder._pending)
    await append(env.client, pb.AppendRequest(journal=log), frames)
    await new.write("fresh", b"fresh")
    await new.recorder.flush()

    await primary(env.client, log, tmp_path / "third")
    assert tree(tmp_path / "third") == {"shared": b"shared", "fresh": b"fresh"}


async def test_garbage_in_the_log_is_a_typed_error_at_its_offset(env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    log = await env.new_log()
    _, files = await primary(env.client, log, tmp_path / "a")
    await files.write("ok", b"ok")
    await files.recorder.flush()
    garbage_at = files.recorder.write_head
    await append(env.client, pb.AppendRequest(journal=log), b"this is not a recorded op")

    with pytest.raises(CorruptLogError, match="magic word") as caught:
        await primary(env.client, log, tmp_path / "b")
    assert (caught.value.log, caught.value.offset) == (log, garbage_at)
    assert not (tmp_path / "b").exists()  # A failed playback leaves no partial directory.


async def test_a_recorder_rides_out_its_log_short_of_brokers_and_resumes_within_a_second(
    env, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    # The log's journal refuses appends (INSUFFICIENT_JOURNAL_BROKERS) for 20 s of simulated
    # time, as a recovery log of replication 3 does while a broker restarts and beyond: the
    # recorder keeps retrying (it gave up after ~16 s), and once the log is back its next
    # attempt comes within a second (the append helper's 5 s cap made the shard wait up to 5 s
    # more, found by the soak).
    log = await env.new_log()
    recovered = await play_and_handoff(env.client, FSMHints(log=log), tmp_path, 1234)
    now = [0.0]
    back_at = 20.0
    back = asyncio.Event()

    async def sleep(delay: float) -> None:
        now[0] += delay
        if now[0] >= back_at and not back.is_set():
            second = await env.cluster.start_broker("zone-b", "broker-b")
            await env.cluster.assign(log, [env.broker, second])
            back.set()

    recorder = Recorder(
        env.client, recovered.fsm, 1234, tmp_path, write_head=recovered.write_head, sleep=sleep
    )
    await recorder.create("one")
    spec = journal_spec(log, replication=2)
    await env.cluster.put_spec(spec)  # One broker of the two it now needs.
    await env.cluster.sync(env.cluster.admin.store.core.revision)
    await asyncio.wait_for(recorder.flush(), WAIT_S)
    assert back.is_set() and now[0] - back_at <= 1.0


async def test_a_flush_cancelled_mid_append_leaves_the_recorder_failed(env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # Found by review: a flush (a shard's hints task, say) cancelled while its batch was being
    # appended dropped the batch, and the next flush, with nothing pending, reported durable
    # ops that were never appended (the player then skips everything after the seq_no gap).
    log = await env.new_log()
    recovered = await play_and_handoff(env.client, FSMHints(log=log), tmp_path, 1234)
    retrying = asyncio.Event()

    async def sleep(delay: float) -> None:
        retrying.set()
        await asyncio.Event().wait()  # The log stays short of brokers: retried for ever.

    recorder = Recorder(
        env.client, recovered.fsm, 1234, tmp_path, write_head=recovered.write_head, sleep=sleep
    )
    await recorder.create("one")
    await env.cluster.put_spec(journal_spec(log, replication=2))  # One broker of the two.
    await env.cluster.sync(env.cluster.admin.store.core.revision)
    flush = asyncio.ensure_future(recorder.flush())
    await asyncio.wait_for(retrying.wait(), WAIT_S)
    flush.cancel()
    with pytest.raises(asyncio.CancelledError):
        await flush
    with pytest.raises(RecorderFailedError, match="cancelled"):
        await recorder.flush()
