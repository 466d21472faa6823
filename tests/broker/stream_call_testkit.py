"""What a test of stream-call clean-up looks at: grpc.aio's request-consuming tasks left behind
by calls that ended, and what the loop's exception handler heard."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def reported_to_loop() -> Iterator[list[dict[str, Any]]]:
    """What reaches the running loop's exception handler meanwhile."""
    loop = asyncio.get_running_loop()
    reports: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: reports.append(context))
    try:
        yield reports
    finally:
        loop.set_exception_handler(previous)


def stranded_request_consumers() -> list[asyncio.Task[Any]]:
    """grpc.aio's tasks still consuming the request iterator of a call that ended (those of
    calls still running, such as a live etcd watch, are fine)."""
    stranded = []
    for task in asyncio.all_tasks():
        coro: Any = task.get_coro()
        if task.done() or getattr(coro, "__name__", "") != "_consume_request_iterator":
            continue
        call = coro.cr_frame.f_locals["self"]  # The consumer is a method of its call.
        if call.done():
            stranded.append(task)
    return stranded


async def assert_nothing_left(reports: list[dict[str, Any]]) -> None:
    """No stranded consumer, and nothing reported to the loop's exception handler (`reports`)
    even once garbage is collected: a pending task collected is what asyncio reports as
    "Task was destroyed but it is pending!"."""
    for _ in range(3):
        await asyncio.sleep(0)  # Let finished calls settle.
    assert stranded_request_consumers() == []
    gc.collect()
    for _ in range(3):
        await asyncio.sleep(0)
    gc.collect()
    assert [r.get("message") for r in reports] == []
    assert stranded_request_consumers() == []
