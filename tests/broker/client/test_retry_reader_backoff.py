"""RetryReader back-off, on an injected clock and sleep (never by sleeping): a broker that answers
the metadata and then fails every read is retried with exponentially growing, capped, jittered
delays, not ~18 times a second for ever; lost or corrupt content is never retried; an attempt
that stood healthy long enough resets the count. Against the real Read RPC server of
test_client_reader (ReadAPI over a FragmentIndex, file:// store)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from broker.client.reader import Chunk, DataLossError, FragmentIntegrityError
from broker.client.retry_reader import (
    RetryReader,
    attempt_healthy_s,
    backoff_jitter,
    backoff_max_s,
    backoff_s,
)
from broker.fragment import naming
from broker.fragment.codecs import CompressionCodec
from broker.protocol import protocol_pb2 as pb
from tests.broker.read_testkit import (
    JOURNAL,
    Env,
    Replica,
    WatchedIndex,
    commit,
    env,
    persist,
    route_header,
)

CONTENT = b"0123456789"
WINDOW_S = 60.0
# Far more attempts than the back-off allows in the window: the old schedule made ~1200.
ATTEMPTS_SEEN_MAX = 100


class WindowOver(Exception):
    """The virtual window ended."""


class VirtualTime:
    """A clock that only sleeps move, and a sleep that records each delay."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.now = 0.0
        self.slept: list[float] = []
        self.window_s = window_s

    def clock(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.slept.append(delay)
        self.now += delay
        if self.now > self.window_s or len(self.slept) > ATTEMPTS_SEEN_MAX:
            raise WindowOver()


def blocked_at_head(e: Env, time: VirtualTime, **kwargs: Any) -> RetryReader:
    """A RetryReader of JOURNAL (which holds CONTENT) from its head, blocking, on `time`."""
    commit(e.index, 0, CONTENT)
    return RetryReader(
        e.client,
        pb.ReadRequest(journal=JOURNAL, offset=len(CONTENT), block=True),
        sleep=time.sleep,
        clock=time.clock,
        jitter=lambda: 0.0,
        **kwargs,
    )


def served_elsewhere(e: Env, revision: int = 3) -> None:
    """The journal's replica goes away (its blocked Read RPC answers OK without content), and
    another serves it with CONTENT and b"more" after it, its answers' headers at etcd
    `revision` (the first replica's are at 3)."""
    old = e.index
    successor = WatchedIndex()
    commit(successor, 0, CONTENT)
    commit(successor, len(CONTENT), b"more")
    e.resolver.replica = Replica(successor)
    e.resolver.header = route_header(e.endpoint, revision=revision)
    old.close()


def make_unreadable(tmp_path: Path, fragment: pb.Fragment) -> None:
    """The fragment's file becomes a directory: opening it fails (StoreError, UNAVAILABLE)
    after the broker has answered the read's metadata."""
    path = tmp_path / "store" / naming.content_path(fragment)
    path.unlink()
    path.mkdir()


async def test_failing_after_ok_metadata_backs_off_exponentially(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        fragment = await persist(e, 0, CONTENT, CompressionCodec.NONE)
        make_unreadable(tmp_path, fragment)
        time = VirtualTime()
        reader = RetryReader(
            e.client,
            pb.ReadRequest(journal=JOURNAL, offset=0),
            sleep=time.sleep,
            clock=time.clock,
            jitter=lambda: 0.0,
        )
        with pytest.raises(WindowOver):
            await reader.read_chunk()
        await reader.close()
    attempts = len(time.slept)
    assert time.slept == [backoff_s(n) for n in range(1, attempts + 1)]
    assert time.slept[:4] == [0.05, 0.1, 0.2, 0.4] and max(time.slept) == backoff_max_s
    # Doubling to the cap, then every backoff_max_s: 7 growing delays, then the rest of the
    # minute at the cap.
    assert attempts == 7 + int((WINDOW_S - sum(time.slept[:7])) // backoff_max_s) + 1


async def test_the_jitter_draws_from_the_lower_part_of_each_delay(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        fragment = await persist(e, 0, CONTENT, CompressionCodec.NONE)
        make_unreadable(tmp_path, fragment)
        time = VirtualTime(window_s=10.0)
        draws = iter([0.0, 0.5, 0.999] * 10)
        reader = RetryReader(
            e.client,
            pb.ReadRequest(journal=JOURNAL, offset=0),
            sleep=time.sleep,
            clock=time.clock,
            jitter=lambda: next(draws),
        )
        with pytest.raises(WindowOver):
            await reader.read_chunk()
        await reader.close()
    assert time.slept[:3] == [0.05, 0.1 * 0.75, 0.2 * (1 - backoff_jitter * 0.999)]


async def test_gives_up_after_attempts_max_with_the_brokers_error(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        fragment = await persist(e, 0, CONTENT, CompressionCodec.NONE)
        make_unreadable(tmp_path, fragment)
        time = VirtualTime()
        reader = RetryReader(
            e.client,
            pb.ReadRequest(journal=JOURNAL, offset=0),
            attempts_max=5,
            sleep=time.sleep,
            clock=time.clock,
            jitter=lambda: 0.0,
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await reader.read_chunk()
        await reader.close()
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert time.slept == [backoff_s(1), backoff_s(2), backoff_s(3), backoff_s(4)]


@pytest.mark.parametrize("direct", [False, True], ids=["served", "direct"])
async def test_data_loss_is_never_retried(tmp_path: Path, direct: bool) -> None:
    async with env(tmp_path) as e:
        fragment = await persist(e, 0, CONTENT, CompressionCodec.NONE)
        path = tmp_path / "store" / naming.content_path(fragment)
        path.write_bytes(b"9876543210")  # Same length, other content.
        time = VirtualTime()
        reader = RetryReader(
            e.client,
            pb.ReadRequest(journal=JOURNAL, offset=0, do_not_proxy=direct),
            registry=e.registry if direct else None,
            sleep=time.sleep,
            clock=time.clock,
        )
        with pytest.raises(DataLossError) as caught:
            await reader.read_chunk()
        await reader.close()
    assert time.slept == []
    assert naming.content_name(fragment) in str(caught.value)
    # Read directly, the client verified the file itself: the detailed error.
    assert isinstance(caught.value, FragmentIntegrityError) is direct


@pytest.mark.parametrize("healthy", [True, False])
async def test_only_a_healthy_attempt_resets_the_count(tmp_path: Path, healthy: bool) -> None:
    async with env(tmp_path) as e:
        time = VirtualTime()
        reader = blocked_at_head(e, time)
        blocked = asyncio.ensure_future(reader.read_chunk())
        await e.index.waiting.wait()
        if healthy:
            time.now += attempt_healthy_s  # Blocked at the head that long: a healthy attempt.
        served_elsewhere(e)
        assert await blocked == Chunk(len(CONTENT), b"more")
        await reader.close()
    assert time.slept == ([] if healthy else [backoff_s(1)])
