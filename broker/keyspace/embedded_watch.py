"""One watch of an EmbeddedBackend (embedded.py): history replayed from the store's log, then
live commits through a bounded queue (see embedded.py's docstring)."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from broker.keyspace.backend import (
    CompactedError,
    KeySpaceError,
    UnavailableError,
    WatchResponse,
)
from broker.keyspace.changes import Commit

if TYPE_CHECKING:
    from broker.keyspace.embedded import EmbeddedBackend, EmbeddedStore


class WatchStream(AsyncIterator[WatchResponse]):
    """One watch. It registers with its client on the first ``__anext__``; from then on it
    replays [start, durable revision at registration] from the log, then yields live responses
    (commits the store publishes, each once durable)."""

    def __init__(
        self, client: EmbeddedBackend, key: bytes, range_end: bytes | None, start: int
    ) -> None:
        self._client = client
        self._key = key
        self._range_end = range_end
        self._start = start
        self._next_revision = start
        self._replay_end: int | None = None  # None until registered
        self._queue: collections.deque[WatchResponse] = collections.deque()
        self._wake = asyncio.Event()
        self._error: KeySpaceError | None = None
        self._done = False

    def __aiter__(self) -> WatchStream:
        return self

    async def __anext__(self) -> WatchResponse:
        store = self._client.store
        while True:
            if self._done:
                raise StopAsyncIteration
            if self._error is not None:
                error, self._error = self._error, None
                self._finish()
                raise error
            if self._replay_end is None:
                self._register()
                continue
            if self._next_revision <= self._replay_end:
                resp = self._replay_batch(store)
                if resp is not None:
                    return resp
                continue
            if self._queue:
                return self._queue.popleft()
            if self._client.closed:
                self._finish()
                raise StopAsyncIteration
            self._wake.clear()
            await self._wake.wait()

    async def aclose(self) -> None:
        self._finish()

    def _register(self) -> None:
        core = self._client.store.core
        if self._client.closed:
            self._done = True
            return
        if self._client.store.failed:
            self._error = self._client.store._storage_error()
            return
        if self._next_revision < core.compact_revision:
            self._error = CompactedError(self._next_revision, core.compact_revision)
            return
        # Commits after the durable revision are published to registered watches once synced.
        self._replay_end = self._client.store.durable_revision
        self._client._streams.add(self)

    def _replay_batch(self, store: EmbeddedStore) -> WatchResponse | None:
        assert self._replay_end is not None
        try:
            events, last = store.core.replay(
                self._key,
                self._range_end,
                self._next_revision,
                self._replay_end,
                store.watch_batch_events_max,
            )
        except KeySpaceError as exc:
            # Compacted while we replayed: the caller must re-load, as with etcd.
            self._error = exc
            return None
        self._next_revision = last + 1
        return WatchResponse(store.core.header_at(last), events) if events else None

    def _offer(self, commit: Commit) -> None:
        """Queue the part of a live commit this watch covers (called by the store)."""
        if self._done or self._error is not None or commit.revision < self._start:
            return
        events = commit.events_in(self._key, self._range_end)
        if not events:
            return
        if len(self._queue) >= self._client.store.watch_queue_responses_max:
            self._fail(
                UnavailableError(
                    f"embedded keyspace: watch of {self._key!r} fell "
                    f"{len(self._queue)} responses behind; resume from the last revision seen"
                )
            )
            return
        self._queue.append(
            WatchResponse(self._client.store.core.header_at(commit.revision), events)
        )
        self._wake.set()

    def offer_progress(self, revision: int) -> None:
        """Queue a progress notification at ``revision`` (the store's durable revision): every
        commit up to it was offered already (commits are published in order, once durable), so
        every event of this watch up to it is queued ahead of the notification. Not while the
        watch still replays its history, nor if its queue is full (the waiter asks again)."""
        if (
            self._done
            or self._error is not None
            or self._replay_end is None
            or self._next_revision <= self._replay_end
            or revision < self._start
            or len(self._queue) >= self._client.store.watch_queue_responses_max
        ):
            return
        self._queue.append(WatchResponse(self._client.store.core.header_at(revision), ()))
        self._wake.set()

    def _fail(self, error: KeySpaceError) -> None:
        # Queued responses are dropped with the watch; the caller resumes from the last
        # revision it saw, so none of them is lost.
        self._queue.clear()
        self._error = error
        self._wake.set()

    def _finish(self) -> None:
        self._done = True
        self._queue.clear()
        self._client._streams.discard(self)
