"""read_to_end: reads a client's remaining request stream within its bounds, never beyond."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import pytest

from broker.request_stream import read_to_end


async def counted(n: int | None, taken: list[int], *, fail: bool = False) -> AsyncIterator[int]:
    for i in itertools.count() if n is None else range(n):
        taken.append(i)
        yield i
        await asyncio.sleep(0)  # A client writing as fast as it can, one message at a time.
    if fail:
        raise ValueError("malformed message")


async def test_a_stream_that_ends_is_read_to_its_end() -> None:
    taken: list[int] = []
    assert await read_to_end(counted(10, taken)) is True
    assert taken == list(range(10))


async def test_at_most_messages_max_are_read() -> None:
    taken: list[int] = []
    assert await read_to_end(counted(None, taken), seconds=30, messages_max=7) is False
    assert len(taken) == 7


async def test_a_stream_without_end_is_given_up_at_the_time_bound() -> None:
    taken: list[int] = []
    loop = asyncio.get_running_loop()
    began = loop.time()
    assert await read_to_end(counted(None, taken), seconds=0.2, messages_max=10**9) is False
    assert 0.2 <= loop.time() - began < 5
    assert taken  # It did read meanwhile.


async def test_a_failing_stream_ends_the_reading() -> None:
    assert await read_to_end(counted(3, [], fail=True)) is False


async def test_cancellation_is_not_swallowed() -> None:
    reading_begun = asyncio.Event()

    async def endless() -> AsyncIterator[int]:
        reading_begun.set()
        await asyncio.Event().wait()  # A client that never sends another message.
        yield 0

    reading = asyncio.ensure_future(read_to_end(endless(), seconds=30, messages_max=10**9))
    await reading_begun.wait()
    reading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reading
