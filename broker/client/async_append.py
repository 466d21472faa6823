"""AsyncAppend: one batch of an AppendService, and the queue of batches of one journal.

A batch goes through three states, driven by its AppendService (whose module explains the
whole): OPEN while it is the tail of its journal's queue and writers may join it; SENDING once
the journal's worker sealed it (it waits on its dependencies, then is appended, retried as
needed: `attempts` and `last_error` show a batch that is being retried); DONE once its future
holds the AppendResponse or the error.

Writers see only `write`, `release`, `abort` and the future. The underscored fields are the
service's to drive (they live here so that the per-write path is a few attribute reads).
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from collections.abc import Callable, Generator
from typing import Any

from broker.client.append_buffer import AppendBuffer
from broker.protocol import protocol_pb2 as pb


class AsyncAppendStateError(RuntimeError):
    """An AsyncAppend was written or released by a writer that does not hold it."""


class AppendState(enum.Enum):
    OPEN = "open"  # The tail of its journal's queue: writers may join it.
    SENDING = "sending"  # Sealed: waiting on dependencies, or being appended.
    DONE = "done"  # Its future is resolved.


# Called by release (with the bytes it added) and abort (with -1).
OnRelease = Callable[["AsyncAppend", int], None]


class AsyncAppend:
    """One batch of one journal: written by writers in turn, then appended in one RPC.

    A writer gets it from `AppendService.start_append`, writes whole messages, then releases
    (or aborts) it without awaiting in between. Awaiting it (or `result()` once `done()`) gives
    the batch's AppendResponse, whose `commit` is the journal span of the whole batch, or raises
    why it failed.
    """

    __slots__ = (
        "_attempts",
        "_buffer",
        "_future",
        "_held",
        "_key",
        "_last_error",
        "_on_release",
        "_queue",
        "_state",
        "dependencies",
        "journal",
        "request",
    )

    def __init__(
        self,
        queue: JournalQueue,
        request: pb.AppendRequest | None,
        key: object,
        dependencies: frozenset[Any],
        buffer: AppendBuffer,
        future: asyncio.Future[pb.AppendResponse],
        on_release: OnRelease,
    ) -> None:
        self.journal = queue.journal
        self.request = request if request is not None else pb.AppendRequest(journal=queue.journal)
        self.dependencies = dependencies
        self._queue = queue
        self._key = key  # Appends join a batch only with the same key (request).
        self._buffer = buffer
        self._future = future
        self._on_release = on_release
        self._state = AppendState.OPEN
        self._held = False
        self._attempts = 0
        self._last_error: BaseException | None = None

    def __repr__(self) -> str:
        return f"<AsyncAppend {self.journal} {self._state.value} {self._buffer.size} bytes>"

    @property
    def state(self) -> AppendState:
        return self._state

    @property
    def attempts(self) -> int:
        """Append RPCs tried for this batch so far (0 until it is sent)."""
        return self._attempts

    @property
    def last_error(self) -> BaseException | None:
        """The failure of the last attempt, while the batch is retried (None once an attempt
        succeeds, or if none failed): how a writer sees that its append is stuck, and why."""
        return self._last_error

    @property
    def size(self) -> int:
        """Bytes released into the batch so far (and, while held, written)."""
        return self._buffer.size

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Add `data` to the batch. Only between `start_append` and `release`/`abort`."""
        if not self._held:
            raise AsyncAppendStateError(f"journal {self.journal}: write to an unheld append")
        self._buffer.write(data)

    def release(self) -> None:
        """Queue what was written since `start_append`; let the next writer have the batch."""
        if not self._held:
            raise AsyncAppendStateError(f"journal {self.journal}: release of an unheld append")
        self._on_release(self, self._buffer.checkpoint())

    def abort(self) -> None:
        """Drop what was written since `start_append`, and release the batch."""
        if not self._held:
            raise AsyncAppendStateError(f"journal {self.journal}: abort of an unheld append")
        self._buffer.rollback()
        self._on_release(self, -1)

    @property
    def future(self) -> asyncio.Future[pb.AppendResponse]:
        return self._future

    def done(self) -> bool:
        return self._future.done()

    def result(self) -> pb.AppendResponse:
        return self._future.result()

    def exception(self) -> BaseException | None:
        return self._future.exception()

    def __await__(self) -> Generator[Any, None, pb.AppendResponse]:
        """Wait for the batch's outcome. A writer whose wait is cancelled (a timeout around
        it, a cancelled task or gather) leaves the batch's own future as it is: the service
        alone resolves it, and a checkpoint's commit waits for that (`pending_except`), so
        a writer that gives up waiting cannot let the commit go ahead without the append. An
        outcome no writer saw (the only waiter gave up) stays unobserved, and is reported."""
        inner = self._future
        if inner.done():
            return inner.__await__()
        outer: asyncio.Future[pb.AppendResponse] = inner.get_loop().create_future()

        def relay(done: asyncio.Future[pb.AppendResponse]) -> None:
            if outer.done():
                return  # The waiter gave up: its outcome is left for others (unobserved).
            if done.cancelled():
                outer.cancel()
            elif (error := done.exception()) is not None:
                outer.set_exception(error)
            else:
                outer.set_result(done.result())

        inner.add_done_callback(relay)
        return outer.__await__()


class JournalQueue:
    """The batches of one journal, oldest first; the last may be OPEN. `holder` is the batch a
    writer holds (always the last), `task` the worker sending them."""

    __slots__ = ("batches", "holder", "journal", "task", "waiters")

    def __init__(self, journal: str) -> None:
        self.journal = journal
        self.batches: deque[AsyncAppend] = deque()
        self.holder: AsyncAppend | None = None
        self.task: asyncio.Task[None] | None = None
        # Futures of writers waiting for the holder to release, and of the worker waiting for
        # its head batch to be released.
        self.waiters: list[asyncio.Future[None]] = []


async def wait_on(waiters: list[asyncio.Future[None]]) -> None:
    """Wait until `notify(waiters)`."""
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    waiters.append(future)
    await future


def notify(waiters: list[asyncio.Future[None]]) -> None:
    """Wake everyone waiting on `waiters` (they re-check what they wait for)."""
    if not waiters:
        return
    ready = waiters[:]
    waiters.clear()
    for future in ready:
        if not future.done():  # Cancelled waiters are skipped.
            future.set_result(None)
