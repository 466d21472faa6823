"""Reading an Append stream's content under the minimum rate (append_rate.MinRateCredit).

A client streaming an append holds its journal's pipeline, which every other append of the
journal waits for, so the broker waits for each of its messages only as long as the client's
credit lasts, and cuts the append (FlowControlUnderflowError, RESOURCE_EXHAUSTED) when it runs
out.

One timer per append, not one per message. A deadline is "now + the credit left", and the
credit drains at exactly the rate time passes while the broker waits (and grows only when a
chunk arrives, or when the broker held the stream): so an append's deadline never moves earlier,
and a timer armed for it need never be re-armed sooner. `ChunkReceiver` arms one when it
first waits; when it fires, it cuts the wait if the credit is gone, and otherwise arms itself
again for what is left. That replaces an `asyncio.timeout` per received message (a Timeout
object, a timer armed and cancelled: three per small append), a measurable part of a 1 KiB
append's broker time (see docs/benchmarks.md). The timer cancels the receiving task only while
it waits in `recv` (never while the append works on a chunk), and `recv` turns that
cancellation, and only that one, into FlowControlUnderflowError, counting cancellations as
asyncio.timeout does so that a cancellation from elsewhere at the same moment still propagates.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from broker.append_rate import MinRateCredit, min_rate_burst_s_default
from broker.append_run import AppendMessage

# Gazette's MinAppendRate (64 KiB/s), and the window over which a client must sustain it
# (Gazette's one second admits no gap longer than a second; see append_rate.MinRateCredit).
min_append_rate_bytes_per_s_default = 1 << 16
flow_control_burst_s_default = min_rate_burst_s_default


class FlowControlUnderflowError(Exception):
    """The client did not sustain the minimum append rate."""

    def __init__(self, min_rate: int) -> None:
        super().__init__(f"client stream did not sustain the minimum append rate ({min_rate} B/s)")


class ChunkReceiver:
    """Reads an Append stream's content messages under the minimum-rate policy: the client's
    credit (append_rate.MinRateCredit) bounds how long each message is waited for, and the
    append fails when it runs out. Time the broker holds the stream back to honour the journal's
    maximum rate (``throttle``) is not charged to the client. Call `close` when done with it
    (it drops the append's timer).
    """

    def __init__(
        self,
        stream: AsyncIterator[AppendMessage],
        *,
        min_rate_bytes_per_s: int = min_append_rate_bytes_per_s_default,
        burst_s: float = flow_control_burst_s_default,
        clock: Callable[[], float] = time.monotonic,
        throttle: Callable[[int, float], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if min_rate_bytes_per_s <= 0 or burst_s <= 0:
            raise ValueError("flow control: min_rate_bytes_per_s and burst_s must be > 0")
        self._stream = stream
        self._min_rate = min_rate_bytes_per_s
        # Its clock starts with the first receive (STREAM_CONTENT), not with the RPC: waiting
        # for the journal's pipeline is not the client's doing.
        self._credit = MinRateCredit(min_rate_bytes_per_s, burst_s=burst_s)
        self._clock = clock
        self._throttle = throttle
        self._sleep = sleep
        self.total_chunks = 0
        self.delayed_chunks = 0
        # The append's timer (see the module docstring), and the wait it may cut: the task
        # waiting in recv (None when none is), with its cancellation count when it began.
        self._timer: asyncio.TimerHandle | None = None
        self._waiter: asyncio.Task[object] | None = None
        self._waiter_cancelling = 0
        self._cut = False  # The timer cancelled the waiter; recv has not seen it yet.
        self._closed = False

    async def recv(self) -> tuple[AppendMessage | None, BaseException | None]:
        wait_s = self._credit.wait_s(self._clock())
        if wait_s <= 0:
            return None, FlowControlUnderflowError(self._min_rate)
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("ChunkReceiver.recv must run in a task")
        if self._timer is None and not self._closed:
            self._timer = asyncio.get_running_loop().call_later(wait_s, self._on_timer)
        self._waiter, self._waiter_cancelling = task, task.cancelling()
        try:
            req = await anext(self._stream)
        except StopAsyncIteration:
            return None, None
        except asyncio.CancelledError:
            if self._take_cut(task):
                return None, FlowControlUnderflowError(self._min_rate)
            raise  # Cancelled from elsewhere (too).
        except grpc.RpcError as exc:
            return None, exc
        finally:
            self._waiter = None
            # A cut whose cancellation the stream swallowed: count it off all the same.
            self._take_cut(task)
        now = self._clock()
        size = len(req.content)
        self._credit.on_chunk(size, now)
        self.total_chunks += 1
        if self._throttle is not None and size:
            delay = self._throttle(size, now)
            if delay > 0:
                # Held back to keep the journal within its maximum rate. The broker held the
                # stream, not the client: the wait is not charged to the client's credit.
                self.delayed_chunks += 1
                await self._sleep(delay)
                self._credit.resume(self._clock())
        return req, None

    def close(self) -> None:
        """Drop the timer (an append's handler calls this when its append is over)."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _take_cut(self, task: asyncio.Task[object]) -> bool:
        """Whether the timer cut this wait (and only it cancelled the task), as asyncio.timeout
        counts: the timer's cancellation is taken back either way."""
        if not self._cut:
            return False
        self._cut = False
        return task.uncancel() <= self._waiter_cancelling

    def _on_timer(self) -> None:
        self._timer = None
        waiter = self._waiter
        if waiter is None or self._closed or self._cut:
            # Not waiting for the client now: the next recv arms the timer again.
            return
        wait_s = self._credit.wait_s(self._clock())
        if wait_s > 0:
            # Chunks came meanwhile: the deadline moved on.
            self._timer = asyncio.get_running_loop().call_later(wait_s, self._on_timer)
            return
        self._cut = True
        waiter.cancel()
