"""ReadChannel: bounded between the journal readers and the consumer, failing in order."""

from __future__ import annotations

import asyncio

import pytest

from gazette_consumer.sequencer.read_channel import Batch, ReadChannel


def batch(journal: str, through: int) -> Batch:
    return Batch(journal, [], through)


async def test_put_waits_while_the_channel_is_full() -> None:
    channel = ReadChannel(2)
    await channel.put(batch("a/one", 1))
    await channel.put(batch("a/two", 1))
    third = asyncio.ensure_future(channel.put(batch("a/one", 2)))
    done, _ = await asyncio.wait([third], timeout=0.05)
    assert not done  # Bounded: the reader waits for the consumer.

    assert channel.get_nowait() == batch("a/one", 1)
    await asyncio.wait_for(third, 10)
    assert [channel.get_nowait(), channel.get_nowait()] == [batch("a/two", 1), batch("a/one", 2)]
    assert channel.get_nowait() is None


async def test_a_cancelled_wait_loses_nothing() -> None:
    channel = ReadChannel(4)
    waiting = asyncio.ensure_future(channel.wait())
    done, _ = await asyncio.wait([waiting], timeout=0.05)
    assert not done
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await channel.put(batch("a/one", 5))
    await asyncio.wait_for(channel.wait(), 10)
    assert channel.get_nowait() == batch("a/one", 5)


async def test_a_failure_comes_after_earlier_batches_and_stays() -> None:
    channel = ReadChannel(1)
    await channel.put(batch("a/one", 1))
    error = ConnectionError("reader of a/two failed")
    channel.fail(error)  # Beyond the bound: a failing reader must not wait to report.
    assert channel.get_nowait() == batch("a/one", 1)
    for _ in range(2):
        with pytest.raises(ConnectionError) as caught:
            channel.get_nowait()
        assert caught.value is error


async def test_wake_releases_a_waiter_with_nothing_queued() -> None:
    channel = ReadChannel(1)
    waiting = asyncio.ensure_future(channel.wait())
    channel.wake()
    await asyncio.wait_for(waiting, 10)
    assert channel.get_nowait() is None
