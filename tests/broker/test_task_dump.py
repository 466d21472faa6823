"""SIGUSR1 makes a process write every asyncio task and what it waits on to its log, without
stopping it: how a soak finds out why a process stopped making progress."""

from __future__ import annotations

import asyncio
import io
import os

import grpc
import grpc.aio
import pytest

from broker import task_dump


async def _waits_for(event: asyncio.Event) -> None:
    await event.wait()


async def test_a_dump_names_each_task_and_where_it_waits() -> None:
    event = asyncio.Event()
    stuck = asyncio.create_task(_waits_for(event), name="stuck-append")
    # A gRPC server's own tasks run compiled coroutines, whose frames have no line number.
    server = grpc.aio.server()
    server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await asyncio.sleep(0)  # It runs up to its wait.
    out = io.StringIO()
    try:
        count = task_dump.dump_tasks(out)
    finally:
        event.set()
        await stuck
        await server.stop(0)
    text = out.getvalue()
    assert count >= 2  # This test's own task, and the stuck one.
    assert "- stuck-append:" in text and "in _waits_for" in text
    assert text.startswith("--- task dump") and text.endswith("--- end of task dump ---\n")


async def _innermost_wait(event: asyncio.Event) -> None:
    await event.wait()


async def _outer_wait(event: asyncio.Event) -> None:
    await _innermost_wait(event)


async def test_a_dump_follows_the_await_chain_to_the_innermost_wait() -> None:
    """A suspended task's own stack is its outermost frame alone: "awaits something". The
    dump shows the coroutine it is stuck in, several awaits down (a broker's stop: `_serve`
    awaiting `broker.stop()` awaiting a lease revoke awaiting etcd)."""
    event = asyncio.Event()
    stuck = asyncio.create_task(_outer_wait(event), name="stuck-stop")
    await asyncio.sleep(0)
    out = io.StringIO()
    try:
        task_dump.dump_tasks(out)
    finally:
        event.set()
        await stuck
    text = out.getvalue()
    section = text.split("- stuck-stop:")[1].split("\n- ")[0]
    lines = section.splitlines()
    where = [i for i, line in enumerate(lines) if "in _outer_wait" in line]
    inner = [i for i, line in enumerate(lines) if "in _innermost_wait" in line]
    assert where and inner and where[0] < inner[0], section
    assert "locks.py" in section and "in wait" in section, section
    assert "awaiting " in section, section


async def test_sigusr1_dumps_the_tasks_and_the_process_goes_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    loop = asyncio.get_running_loop()
    task_dump.install(loop)
    try:
        os.kill(os.getpid(), task_dump.DUMP_SIGNAL)
        # The handler runs on the loop, at its next turn.
        for _ in range(100):
            await asyncio.sleep(0)
            if "end of task dump" in capsys.readouterr().err:
                break
        else:
            pytest.fail("no task dump after SIGUSR1")
    finally:
        loop.remove_signal_handler(task_dump.DUMP_SIGNAL)
