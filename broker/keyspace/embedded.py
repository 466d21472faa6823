"""EmbeddedBackend: the keyspace Backend in-process, over the sans-IO MVCCStore.

One ``EmbeddedStore`` plays the etcd server: it owns the MVCC core, the lease-expiry timer and the
registry of watchers. Each ``EmbeddedBackend`` is a client connection to it; brokers and consumers
sharing one process each hold their own and close it independently. ``EmbeddedBackend()`` with no
store creates a private one.

Watches. A watch first replays history from its start revision, read lazily from the store's
commit log in bounded batches, then delivers live commits through a bounded per-watch queue. A
watcher that lets its queue fill up is ended with UnavailableError instead of losing events: the
caller resumes from the last revision it saw, and the replay catches it up from the log.

Lease expiry. A timer (``loop.call_later``) fires at the earliest lease deadline and revokes what
is due; it is re-armed after every grant, refresh, revocation and expiry. A timer handle rather
than a sleeping task: it holds no stack, cannot fail half-way, and is simply cancelled when the
last client closes. Every request also revokes leases that are already due first, so that with an
injected ``clock`` the store behaves exactly as that clock says, whenever the timer fires.
"""

from __future__ import annotations

import asyncio
import collections
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Sequence

from broker.keyspace.backend import (
    Backend,
    CompactedError,
    Compare,
    Header,
    KeySpaceError,
    Op,
    RangeResponse,
    TxnResponse,
    UnavailableError,
    WatchResponse,
)
from broker.keyspace.mvcc import (
    Commit,
    InvalidRequestError,
    MVCCStore,
    history_revisions_max_default,
    lease_ttl_min_s_default,
    txn_ops_max_default,
)

# Live responses a watch may hold unread before it is ended with UnavailableError.
watch_queue_responses_max_default = 1024
# Events per replayed response (a revision is never split, so one response may exceed it).
watch_batch_events_max_default = 1000


class BackendClosedError(KeySpaceError):
    """The embedded backend client was closed."""


class EmbeddedStore:
    """The in-process keyspace server shared by EmbeddedBackend clients. Bound to the event loop
    that first uses its leases."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        history_revisions_max: int = history_revisions_max_default,
        lease_ttl_min_s: int = lease_ttl_min_s_default,
        txn_ops_max: int = txn_ops_max_default,
        watch_queue_responses_max: int = watch_queue_responses_max_default,
        watch_batch_events_max: int = watch_batch_events_max_default,
    ) -> None:
        if watch_queue_responses_max < 1 or watch_batch_events_max < 1:
            raise ValueError("watch_queue_responses_max and watch_batch_events_max: must be >= 1")
        self.core = MVCCStore(
            history_revisions_max=history_revisions_max,
            lease_ttl_min_s=lease_ttl_min_s,
            txn_ops_max=txn_ops_max,
        )
        self.clock = clock
        self.watch_queue_responses_max = watch_queue_responses_max
        self.watch_batch_events_max = watch_batch_events_max
        self._clients: set[EmbeddedBackend] = set()
        self._timer: asyncio.TimerHandle | None = None

    def connect(self) -> EmbeddedBackend:
        """A new client of this store."""
        return EmbeddedBackend(self)

    def break_watches(self) -> None:
        """Fault injection: every active watch of every client raises UnavailableError, as if
        its connection broke. Clients stay usable and resume their watches."""
        for client in self._clients:
            for stream in list(client._streams):
                stream._fail(UnavailableError("embedded keyspace: watch broken (fault injection)"))

    def expire_leases(self) -> None:
        """Revoke the leases due at ``clock()`` now. The timer calls this; tests driving a fake
        clock may too."""
        self._dispatch(self.core.expire(self.clock()))
        self._rearm()

    def _dispatch(self, commits: Iterable[Commit | None]) -> None:
        for commit in commits:
            if commit is None:
                continue
            for client in self._clients:
                for stream in list(client._streams):
                    stream._offer(commit)

    def _rearm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        deadline = self.core.next_lease_deadline()
        if deadline is None or not self._clients:
            return
        delay_s = max(0.0, deadline - self.clock())
        self._timer = asyncio.get_running_loop().call_later(delay_s, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.expire_leases()

    def _detach(self, client: EmbeddedBackend) -> None:
        self._clients.discard(client)
        if not self._clients and self._timer is not None:
            self._timer.cancel()
            self._timer = None


class EmbeddedBackend(Backend):
    """A client of an EmbeddedStore (a private one unless given)."""

    def __init__(self, store: EmbeddedStore | None = None) -> None:
        self.store = store if store is not None else EmbeddedStore()
        self._closed = False
        # Weak: a watch its caller dropped without aclose() just disappears.
        self._streams: weakref.WeakSet[_WatchStream] = weakref.WeakSet()
        self.store._clients.add(self)

    @property
    def closed(self) -> bool:
        return self._closed

    def new_client(self) -> EmbeddedBackend:
        """Another client of the same store (as a second connection to one etcd), of this
        client's class (so that a test double's second client behaves like the first)."""
        return type(self)(self.store)

    def break_watches(self) -> None:
        """See EmbeddedStore.break_watches (it breaks the watches of every client)."""
        self.store.break_watches()

    def _begin(self) -> MVCCStore:
        if self._closed:
            raise BackendClosedError("embedded keyspace: backend is closed")
        # Leases already due are revoked before the request, as if the timer had just fired.
        self.store._dispatch(self.store.core.expire(self.store.clock()))
        return self.store.core

    async def _end(self, *commits: Commit | None, rearm: bool = False) -> None:
        self.store._dispatch(commits)
        if rearm:
            self.store._rearm()
        # A real backend's request always suspends the caller; yielding here keeps a writer
        # loop from starving watchers (and overflowing their queues) where etcd would not.
        await asyncio.sleep(0)

    async def range(
        self, key: bytes, range_end: bytes | None = None, revision: int = 0
    ) -> RangeResponse:
        resp = self._begin().range(key, range_end, revision)
        await self._end()
        return resp

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> Header:
        header, commit = self._begin().put(key, value, lease)
        await self._end(commit)
        return header

    async def delete(self, key: bytes, range_end: bytes | None = None) -> tuple[Header, int]:
        header, deleted, commit = self._begin().delete(key, range_end)
        await self._end(commit)
        return header, deleted

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResponse:
        resp, commit = self._begin().txn(compares, success, failure)
        await self._end(commit)
        return resp

    async def lease_grant(self, ttl_s: int) -> tuple[int, int]:
        granted = self._begin().lease_grant(ttl_s, self.store.clock())
        await self._end(rearm=True)
        return granted

    async def lease_keepalive_once(self, lease_id: int) -> int:
        ttl_s = self._begin().lease_keepalive(lease_id, self.store.clock())
        await self._end(rearm=True)
        return ttl_s

    async def lease_revoke(self, lease_id: int) -> None:
        _, commit = self._begin().lease_revoke(lease_id)
        await self._end(commit, rearm=True)

    async def compact(self, revision: int) -> None:
        self._begin().compact(revision)
        await self._end()

    def watch(
        self, key: bytes, range_end: bytes | None = None, start_revision: int = 0
    ) -> AsyncIterator[WatchResponse]:
        if not key:
            raise InvalidRequestError("watch: key is empty")
        if start_revision < 0:
            raise InvalidRequestError(f"watch: start_revision must be >= 0 ({start_revision})")
        if start_revision == 0:
            start_revision = self.store.core.revision + 1
        return _WatchStream(self, key, range_end, start_revision)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.store._detach(self)
        for stream in list(self._streams):
            stream._wake.set()


class _WatchStream(AsyncIterator[WatchResponse]):
    """One watch. It registers with its client on the first ``__anext__``; from then on it
    replays [start, revision at registration] from the log, then yields live responses."""

    def __init__(
        self, client: EmbeddedBackend, key: bytes, range_end: bytes | None, start: int
    ) -> None:
        self._client = client
        self._key = key
        self._range_end = range_end
        self._next_revision = start
        self._replay_end: int | None = None  # None until registered
        self._queue: collections.deque[WatchResponse] = collections.deque()
        self._wake = asyncio.Event()
        self._error: KeySpaceError | None = None
        self._done = False

    def __aiter__(self) -> _WatchStream:
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
        if self._next_revision < core.compact_revision:
            self._error = CompactedError(self._next_revision, core.compact_revision)
            return
        self._replay_end = core.revision
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
        return WatchResponse(Header(last), events) if events else None

    def _offer(self, commit: Commit) -> None:
        """Queue the part of a live commit this watch covers (called by the store)."""
        if self._done or self._error is not None:
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
        self._queue.append(WatchResponse(Header(commit.revision), events))
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
