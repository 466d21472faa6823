"""ChunkReceiver's one timer per append (broker/append_receive.py), on the real clock: it cuts a
stalled client once its credit is gone, never a client that keeps up past the first deadline,
never the append while it works on a chunk, and never turns another cancellation into a cut.

The streams here stand for clients: one that stalls waits on an event nobody sets, one that
paces its chunks sleeps between them (that is the client's behaviour under test, not a wait
for an event the test could observe)."""

from __future__ import annotations

import asyncio
import gc
import time
import weakref
from collections.abc import AsyncIterator

import pytest

from broker.append_receive import ChunkReceiver, FlowControlUnderflowError
from broker.protocol import protocol_pb2 as pb

RATE = 1000  # Bytes per second: a chunk of RATE bytes buys one second of credit.
BOUND_S = 10.0  # No test waits longer than this for what it expects.


async def _stalling(first: int) -> AsyncIterator[pb.AppendRequest]:
    """A client that sends ``first`` chunks of one byte, then nothing, ever."""
    for _ in range(first):
        yield pb.AppendRequest(content=b"x")
    await asyncio.Event().wait()
    yield pb.AppendRequest()  # Not reached.


async def _paced(count: int, size: int, gap_s: float) -> AsyncIterator[pb.AppendRequest]:
    """A client that sends ``count`` chunks of ``size`` bytes, ``gap_s`` apart."""
    for _ in range(count):
        await asyncio.sleep(gap_s)
        yield pb.AppendRequest(content=b"x" * size)


async def test_a_stalled_client_is_cut_when_its_credit_is_gone() -> None:
    receiver = ChunkReceiver(_stalling(1), min_rate_bytes_per_s=RATE, burst_s=0.2)
    started = time.monotonic()
    async with asyncio.timeout(BOUND_S):
        req, err = await receiver.recv()
        assert err is None and req is not None
        req, err = await receiver.recv()
    waited = time.monotonic() - started
    assert req is None and isinstance(err, FlowControlUnderflowError)
    # Not before the credit (0.2 s, topped up by one byte) ran out.
    assert waited >= 0.19
    # The timer's cancellation was taken back: the task is not left cancelling.
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    receiver.close()


async def test_a_client_that_keeps_up_past_the_first_deadline_is_not_cut() -> None:
    # One second of credit; each chunk buys a second back, 0.1 s apart: the deadline set at the
    # first wait passes while the client is still well within its credit, so the timer must
    # arm itself again rather than cut.
    receiver = ChunkReceiver(_paced(15, RATE, 0.1), min_rate_bytes_per_s=RATE, burst_s=1.0)
    started = time.monotonic()
    got = 0
    async with asyncio.timeout(BOUND_S):
        while True:
            req, err = await receiver.recv()
            assert err is None, f"cut after {got} chunks, {time.monotonic() - started:.2f} s"
            if req is None:
                break
            got += 1
    assert got == 15 and receiver.total_chunks == 15
    assert time.monotonic() - started > 1.0  # It did outlast the first deadline.
    receiver.close()


async def test_the_append_is_not_cut_while_it_works_on_a_chunk() -> None:
    receiver = ChunkReceiver(_stalling(1), min_rate_bytes_per_s=RATE, burst_s=0.2)
    req, err = await receiver.recv()
    assert err is None and req is not None
    # The append's own work outlasts the client's credit (as a slow replica would make it):
    # the timer fires meanwhile, and must not cancel it.
    await asyncio.sleep(0.4)
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    # The time still counted against the client (as it did before the timer): its next wait
    # finds the credit gone.
    req, err = await receiver.recv()
    assert req is None and isinstance(err, FlowControlUnderflowError)
    receiver.close()


async def test_a_cancellation_from_elsewhere_is_not_taken_for_a_cut() -> None:
    receiver = ChunkReceiver(_stalling(0), min_rate_bytes_per_s=RATE, burst_s=5.0)
    waiting = asyncio.get_running_loop().create_future()

    async def append() -> tuple[object, object]:
        waiting.set_result(None)
        return await receiver.recv()

    task = asyncio.create_task(append())
    await waiting
    await asyncio.sleep(0)  # Into the stream's wait.
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    receiver.close()


async def test_a_cut_and_another_cancellation_at_once_cancel() -> None:
    # The timer cuts the wait and, before the task runs again, someone else cancels it too:
    # the cancellation wins (asyncio.timeout's rule), it is not answered as a cut.
    receiver = ChunkReceiver(_stalling(0), min_rate_bytes_per_s=RATE, burst_s=0.05)
    outcome: list[str] = []

    async def append() -> None:
        try:
            req, err = await receiver.recv()
            outcome.append(f"answered {req} {err!r}")
        except asyncio.CancelledError:
            outcome.append("cancelled")
            raise

    task = asyncio.create_task(append())
    loop = asyncio.get_running_loop()
    fired = loop.create_future()

    def cancel_after_the_cut() -> None:
        # Runs as soon as the task has been cancelled by the timer (task.cancelling() says
        # so), in the same turn of the loop, before the task resumes.
        if task.cancelling() and not fired.done():
            task.cancel()
            fired.set_result(None)
        elif not fired.done():
            loop.call_soon(cancel_after_the_cut)

    loop.call_soon(cancel_after_the_cut)
    async with asyncio.timeout(BOUND_S):
        await fired
        with pytest.raises(asyncio.CancelledError):
            await task
    assert outcome == ["cancelled"]
    receiver.close()


async def test_a_closed_receiver_is_not_kept_alive_by_its_timer() -> None:
    # An append's handler closes its receiver when done: the timer, armed for up to the whole
    # window (5 s by default), must not hold the receiver (and its stream, and its gRPC call)
    # for that long after each append.
    async def one_append(close: bool) -> weakref.ref[ChunkReceiver]:
        receiver = ChunkReceiver(_paced(1, 10, 0.0), min_rate_bytes_per_s=RATE, burst_s=5.0)
        req, err = await receiver.recv()
        assert err is None and req is not None
        if close:
            receiver.close()
        return weakref.ref(receiver)

    closed = await one_append(close=True)
    gc.collect()
    assert closed() is None
    unclosed = await one_append(close=False)
    gc.collect()
    assert unclosed() is not None  # The control: the timer does hold an unclosed one.
    receiver = unclosed()
    assert receiver is not None
    receiver.close()
