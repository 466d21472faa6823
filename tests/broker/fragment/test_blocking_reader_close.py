"""A BlockingReader's close runs even when its caller is cancelled while the close waits for a
worker thread (a cancelled Read RPC, a reader that stopped): nothing is left to the collector."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

import pytest

from broker.fragment.stores.base import BlockingReader


def _open(path: Path) -> BinaryIO:
    return path.open("rb")  # The reader under test owns and closes it.


async def test_a_close_cancelled_before_a_worker_takes_it_still_closes(tmp_path: Path) -> None:
    path = tmp_path / "fragment.raw"
    path.write_bytes(b"content")
    raw = _open(path)
    reader = BlockingReader(raw)

    loop = asyncio.get_running_loop()
    executor = ThreadPoolExecutor(max_workers=1)
    loop.set_default_executor(executor)
    release = threading.Event()
    busy = loop.run_in_executor(None, release.wait)  # The only worker is taken.
    try:
        closing = asyncio.create_task(reader.aclose())
        await asyncio.sleep(0)  # The close is queued behind the busy worker...
        assert not raw.closed
        closing.cancel()  # ...and its caller is cancelled before a worker takes it.
        await asyncio.sleep(0)
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await closing
        assert raw.closed
    finally:
        release.set()
        await busy
        if not raw.closed:
            raw.close()
