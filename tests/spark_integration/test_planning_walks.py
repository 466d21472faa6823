"""The driver walks the journals of a streaming micro-batch at once, at most
`planning_walks_max` of them (stream_read.gather_bounded)."""

from __future__ import annotations

import asyncio

import pytest

from spark_integration.stream_read import gather_bounded, planning_walks_max


async def test_walks_run_at_once_up_to_the_limit() -> None:
    running, most = 0, 0
    all_started = asyncio.Event()
    release = asyncio.Event()
    started = 0

    async def walk(name: str) -> str:
        nonlocal running, most, started
        running += 1
        started += 1
        most = max(most, running)
        if started == 3:
            all_started.set()
        await release.wait()
        running -= 1
        return name.upper()

    names = [f"j{i}" for i in range(7)]
    task = asyncio.create_task(
        gather_bounded({n: (lambda n=n: walk(n)) for n in names}, 3)  # type: ignore[misc]
    )
    await all_started.wait()
    await asyncio.sleep(0)  # Would a fourth start now? It must not: the limit is 3.
    assert running == 3
    release.set()
    assert await task == {n: n.upper() for n in names}
    assert most == 3
    assert planning_walks_max > 1


async def test_the_first_failure_is_raised_as_it_was() -> None:
    class WalkError(Exception):
        pass

    async def fail() -> int:
        raise WalkError("journal a/b: bad")

    async def ok() -> int:
        return 1

    with pytest.raises(WalkError, match="bad"):
        await gather_bounded({"a": ok, "b": fail, "c": ok}, 2)
