"""RetryReader's `verify` (a consumer shard's check that its source journal was not created
again, gazette_consumer/source_revisions.py): awaited before reading on after a Read RPC ended,
after a fragment read directly only every `verify_direct_every_s`, its transient errors
retried as the read's own and the others raised. On an injected clock and sleep, against the
real Read RPC server of read_testkit."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker.client.reader import Chunk
from broker.client.retry_reader import RetryReader, backoff_s, verify_direct_every_s
from broker.fragment.codecs import CompressionCodec
from broker.protocol import protocol_pb2 as pb
from tests.broker.client.test_retry_reader_backoff import (
    CONTENT,
    VirtualTime,
    blocked_at_head,
    served_elsewhere,
)
from tests.broker.read_testkit import JOURNAL, commit, env, persist


class Verifier:
    """Records each check (`calls`: the journal, `revisions`: the revision it must see at
    least); raises the queued errors first."""

    def __init__(self, *errors: Exception) -> None:
        self.calls: list[str] = []
        self.revisions: list[int] = []
        self.errors = list(errors)

    async def __call__(self, journal: str, at_least: int) -> None:
        self.calls.append(journal)
        self.revisions.append(at_least)
        if self.errors:
            raise self.errors.pop(0)


async def _ended_by_the_broker(tmp_path: Path, verify: Verifier) -> tuple[Chunk, VirtualTime]:
    """A blocking read at the head whose RPC the broker ends (its replica goes away), the
    journal then served elsewhere with more content: what the reader reads on with."""
    async with env(tmp_path) as e:
        time = VirtualTime()
        reader = blocked_at_head(e, time, verify=verify)
        blocked = asyncio.ensure_future(reader.read_chunk())
        await e.index.waiting.wait()
        assert verify.calls == []  # Not before the first RPC answered with content.
        served_elsewhere(e, revision=9)
        try:
            return await blocked, time
        finally:
            await reader.close()


async def test_an_rpc_the_broker_ended_is_verified_before_reading_on(tmp_path: Path) -> None:
    verify = Verifier()
    chunk, time = await _ended_by_the_broker(tmp_path, verify)
    assert chunk == Chunk(len(CONTENT), b"more")
    assert verify.calls == [JOURNAL, JOURNAL]  # Before the next RPC, and at its answer.
    # Each as of the answer it covers (a check from an older view of etcd could find the
    # incarnation before the one read): before the next RPC none had answered (the ended one
    # blocked at the head, before its metadata), then the new one's.
    assert verify.revisions == [0, 9]
    assert time.slept == [backoff_s(1)]  # The ended RPC made no progress: one back-off.


async def test_a_transient_verify_error_is_an_attempt_retried(tmp_path: Path) -> None:
    verify = Verifier(ConnectionResetError("the broker asked went away"))
    chunk, time = await _ended_by_the_broker(tmp_path, verify)
    assert chunk == Chunk(len(CONTENT), b"more")
    assert verify.calls == [JOURNAL] * 3
    assert time.slept == [backoff_s(1), backoff_s(2)]  # The failed check, one more.


async def test_content_whose_answer_fails_its_check_is_held_and_checked_again(
    tmp_path: Path,
) -> None:
    """The check after an RPC's answer holds its content back: a transient failure of it is
    retried (a back-off, the RPC left as it is), then the content is handed out, once."""
    async with env(tmp_path) as e:
        commit(e.index, 0, CONTENT)
        time, verify = VirtualTime(), Verifier(ConnectionResetError("the broker asked went away"))
        reader = RetryReader(
            e.client,
            pb.ReadRequest(journal=JOURNAL, offset=0),
            sleep=time.sleep,
            clock=time.clock,
            jitter=lambda: 0.0,
            verify=verify,
        )
        try:
            assert await reader.read_chunk() == Chunk(0, CONTENT[:4])
            assert await reader.read_chunk() == Chunk(4, CONTENT[4:8])
        finally:
            await reader.close()
    assert verify.calls == [JOURNAL] * 2  # The failed check at the answer, then it again.
    assert time.slept == [backoff_s(1)]
    assert reader.restarts == 0


async def test_a_read_cancelled_during_the_check_hands_the_content_out_next(
    tmp_path: Path,
) -> None:
    """Cancelled while the answer's check runs, the reader hands that content out at the next
    call, checked, and reads on from after it: nothing skipped, no jump (found by review: the
    first version moved the offset back under an RPC that had read past it)."""
    async with env(tmp_path) as e:
        commit(e.index, 0, CONTENT)
        entered, release = asyncio.Event(), asyncio.Event()
        calls: list[str] = []

        async def verify(journal: str, at_least: int) -> None:
            calls.append(journal)
            entered.set()
            await release.wait()

        reader = RetryReader(e.client, pb.ReadRequest(journal=JOURNAL, offset=0), verify=verify)
        try:
            first = asyncio.ensure_future(reader.read_chunk())
            await entered.wait()
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            assert reader.offset == 0  # The held content is still the next to hand out.
            release.set()
            assert await reader.read_chunk() == Chunk(0, CONTENT[:4])
            assert await reader.read_chunk() == Chunk(4, CONTENT[4:8])
            assert reader.jumps == 0 and calls == [JOURNAL] * 2
        finally:
            await reader.close()


async def test_what_verify_finds_is_raised_and_nothing_more_is_read(tmp_path: Path) -> None:
    class Recreated(Exception):
        pass

    with pytest.raises(Recreated):
        await _ended_by_the_broker(tmp_path, Verifier(Recreated("created again")))


async def test_fragments_read_directly_are_verified_at_most_every_interval(
    tmp_path: Path,
) -> None:
    async with env(tmp_path) as e:
        for i in range(4):
            await persist(e, i * len(CONTENT), CONTENT, CompressionCodec.NONE)
        time, verify = VirtualTime(), Verifier()
        reader = RetryReader(
            e.client,
            pb.ReadRequest(journal=JOURNAL, offset=0, block=True, do_not_proxy=True),
            registry=e.registry,
            sleep=time.sleep,
            clock=time.clock,
            verify=verify,
        )
        try:
            # Each fragment is read directly, then the RPC for the next one starts. The first
            # RPC's answer is checked before its content is handed out; the next ones only
            # once the interval passed (then before the RPC, and at its answer).
            for i in range(2):
                assert await reader.read_chunk() == Chunk(i * len(CONTENT), CONTENT)
            assert verify.calls == [JOURNAL]
            time.now += verify_direct_every_s
            for i in range(2, 4):
                assert await reader.read_chunk() == Chunk(i * len(CONTENT), CONTENT)
            assert verify.calls == [JOURNAL] * 3
        finally:
            await reader.close()
