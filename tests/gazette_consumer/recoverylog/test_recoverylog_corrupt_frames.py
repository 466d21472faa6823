"""A corrupt recovery-log frame fails playback with CorruptLogError naming the log and offset,
rather than leaving the player waiting for bytes no append wrote: a frame header that claims
OP_BYTES_MAX (1 MiB) followed by a little garbage, read in BACKFILL and while tailing, and a
Write op claiming more content than any recorder writes. Against a real in-process broker."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker.client.appender import append
from broker.protocol import protocol_pb2 as pb
from broker.protocol.recorded_op_pb2 import FSMHints, RecordedOp
from gazette_consumer.message.protobuf_framing import encode_header
from gazette_consumer.recoverylog.fsm import new_random_author
from gazette_consumer.recoverylog.ops import OP_BYTES_MAX, WRITE_BYTES_MAX, CorruptLogError
from gazette_consumer.recoverylog.player import Player
from tests.gazette_consumer.recoverylog.test_recoverylog_playback import primary

# Playback of these logs takes well under a second; the bound turns a player that would wait
# forever (the bug) into a failure.
WAIT_S = 10.0
# A frame header claiming the largest op the decoder accepts, then far fewer bytes than that.
LYING_FRAME = encode_header(OP_BYTES_MAX) + b"garbage, not 1 MiB of a recorded op"


async def log_with_a_lying_frame(env, tmp_path: Path) -> tuple[str, int]:  # type: ignore[no-untyped-def]
    """A log holding one recorded file, then LYING_FRAME; and the frame's offset."""
    log = await env.new_log()
    _, files = await primary(env.client, log, tmp_path / "a")
    await files.write("ok", b"recorded before the corruption")
    await files.recorder.flush()
    at = files.recorder.write_head
    await append(env.client, pb.AppendRequest(journal=log), LYING_FRAME)
    return log, at


async def test_a_frame_claiming_1_mib_fails_backfill_at_its_offset(env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    log, at = await log_with_a_lying_frame(env, tmp_path)
    with pytest.raises(CorruptLogError, match="runs past the write head") as caught:
        async with asyncio.timeout(WAIT_S):
            await primary(env.client, log, tmp_path / "b")
    assert (caught.value.log, caught.value.offset) == (log, at)
    assert f"recovery log {log!r} at offset {at}" in str(caught.value)
    assert not (tmp_path / "b").exists()  # A failed playback leaves no partial directory.


async def test_a_lying_frame_read_while_tailing_fails_the_hand_off(env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    log = await env.new_log()
    _, files = await primary(env.client, log, tmp_path / "a")
    await files.write("ok", b"recorded before the standby started")
    await files.recorder.flush()
    standby = Player(env.client, FSMHints(log=log), tmp_path / "b")
    playing = asyncio.create_task(standby.play())
    async with asyncio.timeout(WAIT_S):
        await standby.tailing.wait()
    at = files.recorder.write_head
    # Lands while the standby tails: beyond the barrier it read through, so it waits for the
    # frame's rest like for any op still arriving; the hand-off's barrier shows none will.
    response = await append(env.client, pb.AppendRequest(journal=log), LYING_FRAME)
    standby.inject_handoff(new_random_author())
    with pytest.raises(CorruptLogError, match="runs past the write head") as caught:
        async with asyncio.timeout(WAIT_S):
            await playing
    assert (caught.value.log, caught.value.offset) == (log, at)
    assert standby.played_through == response.commit.end


async def test_a_write_claiming_more_than_write_bytes_max_is_corrupt(env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    log = await env.new_log()
    _, files = await primary(env.client, log, tmp_path / "a")
    await files.recorder.flush()
    at = files.recorder.write_head
    op = RecordedOp(
        seq_no=files.recorder.fsm.next_seq_no,
        checksum=files.recorder.fsm.next_checksum,
        author=files.recorder.author,
        write=RecordedOp.Write(fnode=1, offset=0, length=WRITE_BYTES_MAX + 1),
    )
    payload = op.SerializeToString()
    await append(env.client, pb.AppendRequest(journal=log), encode_header(len(payload)) + payload)
    with pytest.raises(CorruptLogError, match="exceeds WRITE_BYTES_MAX") as caught:
        async with asyncio.timeout(WAIT_S):
            await primary(env.client, log, tmp_path / "b")
    assert (caught.value.log, caught.value.offset) == (log, at)
