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

Persistence. ``EmbeddedStore()`` lives in memory; ``EmbeddedStore.open(directory)`` is backed by
a directory (persisted.py), like a one-member etcd: every change is written to its write-ahead
log (to the OS, so that it survives the process being killed) before the request that made it
is answered and before watchers see it. With ``fsync=True`` the log is also fdatasynced first,
so that it survives an OS crash: in a worker thread, one fdatasync covering every change written
meanwhile (group commit). Until its fdatasync completes, a change is applied in memory but not
visible: answers and watch events wait for it, and so does every request that ran after it
(what it read may depend on the change). Leases do not survive a restart: their holders were
processes now gone, so ``open`` revokes them all, as etcd would once their TTLs ran out, in new
revisions, so that a restarted member announces itself at once. A failure to write or sync the
log (a full disk, an I/O error) fails the store for good: the change is in memory but may not be
on disk, so every later request and every watch raises KeySpaceStorageError; restart the process
to recover from what the disk holds.
"""

from __future__ import annotations

import asyncio
import collections
import os
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any

from broker.keyspace.backend import (
    Backend,
    BackendFailedError,
    Compare,
    Header,
    Op,
    RangeResponse,
    TxnResponse,
    UnavailableError,
    WatchResponse,
    error_within,
)
from broker.keyspace.embedded_watch import WatchStream
from broker.keyspace.mvcc import (
    Commit,
    InvalidRequestError,
    MVCCStore,
    history_revisions_max_default,
    lease_ttl_min_s_default,
    txn_ops_max_default,
)
from broker.keyspace.persisted import (
    KeySpaceDir,
    KeySpaceDirError,
    StoreIdentity,
    new_store_id,
    wal_bytes_max_default,
)

# Live responses a watch may hold unread before it is ended with UnavailableError.
watch_queue_responses_max_default = 1024
# Events per replayed response (a revision is never split, so one response may exceed it).
watch_batch_events_max_default = 1000


class BackendClosedError(BackendFailedError):
    """The embedded backend client (or its store) was closed."""


class KeySpaceStorageError(BackendFailedError):
    """The persisted store could not write or sync its log (or snapshot): it refuses every
    request from then on, since memory may hold changes the disk does not. Not retryable."""


def log_failure(logger: Any, event: str, err: BaseException, **fields: Any) -> None:
    """Log `event` at error level for `err`: with its traceback, unless the embedded keyspace's
    storage failed within it (a known cause, whose message says what to do: the process
    stops, and every component it stops would otherwise log the same group's traceback)."""
    storage = storage_error_within(err)
    if storage is not None:
        logger.error(event, error=str(storage), **fields)
    else:
        logger.error(event, exc_info=err, **fields)


def storage_error_within(err: BaseException) -> KeySpaceStorageError | None:
    """The KeySpaceStorageError within `err` (itself, an exception group's member, or a
    cause), if any: what a process whose tasks the keyspace failed reports as it exits (its
    message says what to do), rather than the group's traceback."""
    return error_within(err, KeySpaceStorageError)


class EmbeddedStore:
    """The in-process keyspace server shared by EmbeddedBackend clients. Bound to the event loop
    that first uses its leases. In memory; ``open`` gives one backed by a directory."""

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
        # A fresh identity for response headers (persisted.py: why it must not be zero); a
        # store opened from a directory takes the directory's instead.
        self._set_identity(StoreIdentity(new_store_id(), new_store_id(), 1))
        self.clock = clock
        self.watch_queue_responses_max = watch_queue_responses_max
        self.watch_batch_events_max = watch_batch_events_max
        self._clients: set[EmbeddedBackend] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        # Persistence (see the module docstring); None: in memory.
        self._dir: KeySpaceDir | None = None
        self._fsync = False
        self._failure: tuple[str, BaseException] | None = None
        # Batches of changes written to the log, and how many of them are known synced.
        self._written = 0
        self._synced = 0
        # Commits written but not yet synced, with their batch: published once it is.
        self._unsynced: collections.deque[tuple[int, Commit]] = collections.deque()
        self._syncer: asyncio.Task[None] | None = None
        self._sync_round = asyncio.Event()  # Set (and replaced) after each fdatasync.

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        *,
        fsync: bool = False,
        wal_bytes_max: int = wal_bytes_max_default,
        clock: Callable[[], float] = time.monotonic,
        history_revisions_max: int = history_revisions_max_default,
        lease_ttl_min_s: int = lease_ttl_min_s_default,
        txn_ops_max: int = txn_ops_max_default,
    ) -> EmbeddedStore:
        """A store backed by ``directory`` (created if missing), holding what it held when its
        last process ended, leases excepted (revoked now, in new revisions). Raises
        KeySpaceLockedError if another store has it open, CorruptLogError if it is damaged
        (other than a torn final record, dropped with a warning), KeySpaceDirError if it
        cannot be created, read or written."""
        store = cls(
            clock=clock,
            history_revisions_max=history_revisions_max,
            lease_ttl_min_s=lease_ttl_min_s,
            txn_ops_max=txn_ops_max,
        )
        store.core = MVCCStore(
            history_revisions_max=history_revisions_max,
            lease_ttl_min_s=lease_ttl_min_s,
            txn_ops_max=txn_ops_max,
            record_changes=True,
        )
        path = os.fspath(directory)
        try:
            kdir = KeySpaceDir(path, wal_bytes_max)
        except OSError as exc:
            raise KeySpaceDirError(f"embedded keyspace directory {path}: {exc}") from exc
        try:
            kdir.load(store.core)
            store._set_identity(kdir.open_identity())
            store.core.expire_all()
            changes = store.core.take_changes()
            if changes:
                kdir.append(changes)
            kdir.sync()
            if kdir.wants_snapshot():
                kdir.snapshot(store.core.state())
        except OSError as exc:
            kdir.close()
            raise KeySpaceDirError(f"embedded keyspace directory {path}: {exc}") from exc
        except BaseException:
            kdir.close()
            raise
        store._dir = kdir
        store._fsync = fsync
        return store

    def _set_identity(self, identity: StoreIdentity) -> None:
        self.identity = identity
        self.core.cluster_id = identity.cluster_id
        self.core.member_id = identity.member_id
        self.core.raft_term = identity.raft_term

    @property
    def directory(self) -> KeySpaceDir | None:
        """The directory backing this store (None: in memory)."""
        return self._dir

    @property
    def path(self) -> str | None:
        return self._dir.path if self._dir is not None else None

    def connect(self) -> EmbeddedBackend:
        """A new client of this store."""
        return EmbeddedBackend(self)

    async def close(self) -> None:
        """Stop serving: requests of its clients then fail with BackendClosedError. A persisted
        store syncs its log (whatever ``fsync`` says: a clean exit loses nothing even to a later
        OS crash), then closes its files and releases its directory."""
        if self._closed:
            return
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._syncer is not None:
            await asyncio.gather(self._syncer, return_exceptions=True)
        for client in list(self._clients):
            await client.close()
        if self._dir is not None:
            try:
                if self._failure is None:
                    self._dir.sync()
                    self._synced = self._written
            finally:
                self._dir.close()
                self._next_round()

    def break_watches(self) -> None:
        """Fault injection: every active watch of every client raises UnavailableError, as if
        its connection broke. Clients stay usable and resume their watches."""
        for client in self._clients:
            for stream in list(client._streams):
                stream._fail(UnavailableError("embedded keyspace: watch broken (fault injection)"))

    def expire_leases(self) -> None:
        """Revoke the leases due at ``clock()`` now. The timer calls this; tests driving a fake
        clock may too."""
        if self._closed or self._failure is not None:
            return
        try:
            self._commit(self.core.expire(self.clock()))
        except KeySpaceStorageError:
            return  # The store is failed: every request and watch reports it from now on.
        self._rearm()

    @property
    def failed(self) -> bool:
        """Whether writing the log failed (see KeySpaceStorageError)."""
        return self._failure is not None

    @property
    def durable_revision(self) -> int:
        """The newest revision whose changes are written (and synced, with ``fsync``)."""
        return self._unsynced[0][1].revision - 1 if self._unsynced else self.core.revision

    def _check_usable(self) -> None:
        if self._closed:
            raise BackendClosedError("embedded keyspace: store is closed")
        if self._failure is not None:
            raise self._storage_error()

    def _storage_error(self) -> KeySpaceStorageError:
        assert self._failure is not None
        what, exc = self._failure
        error = KeySpaceStorageError(
            f"embedded keyspace {self.path}: {what} failed ({exc}); it serves no more requests:"
            " restart the process once the disk is fixed"
        )
        error.__cause__ = exc
        return error

    def _commit(self, commits: Iterable[Commit | None]) -> None:
        """Write the core's new changes to the log, then publish ``commits`` (the commits among
        them) to watchers: now, or once synced with ``fsync``. A failed write fails the store
        and raises KeySpaceStorageError (the change may or may not be on disk)."""
        if self._failure is not None:
            raise self._storage_error()
        done = [c for c in commits if c is not None]
        if self._dir is not None:
            changes = self.core.take_changes()
            if changes:
                try:
                    self._dir.append(changes)
                except (OSError, ValueError) as exc:
                    self._fail("appending to the write-ahead log", exc)
                    raise self._storage_error() from exc
                self._written += 1
                if self._fsync:
                    self._unsynced.extend((self._written, c) for c in done)
                    done = []
                    self._start_syncer()
                else:
                    self._synced = self._written
                    self._maybe_snapshot()
        self._dispatch(done)

    def _dispatch(self, commits: Iterable[Commit]) -> None:
        for commit in commits:
            for client in self._clients:
                for stream in list(client._streams):
                    stream._offer(commit)

    async def _durable(self) -> None:
        """Return once everything written so far is synced (at once without ``fsync``): what
        the caller is about to answer may reflect any of it."""
        target = self._written
        while self._synced < target:
            self._check_usable()
            self._start_syncer()
            await self._sync_round.wait()

    def _start_syncer(self) -> None:
        if self._syncer is not None or self._closed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # No loop (a synchronous expire_leases): the next request syncs.
        self._syncer = loop.create_task(self._sync_loop())

    async def _sync_loop(self) -> None:
        assert self._dir is not None
        try:
            while self._synced < self._written and self._failure is None:
                target = self._written
                try:
                    await asyncio.to_thread(self._dir.sync)
                except OSError as exc:
                    self._fail("fdatasync of the write-ahead log", exc)
                    return
                self._synced = target
                self._release(target)
                self._next_round()
        finally:
            self._syncer = None
            self._next_round()
        self._maybe_snapshot()

    def _next_round(self) -> None:
        done, self._sync_round = self._sync_round, asyncio.Event()
        done.set()

    def _release(self, batch: int) -> None:
        """Publish the commits of every batch up to ``batch``, now synced."""
        released = []
        while self._unsynced and self._unsynced[0][0] <= batch:
            released.append(self._unsynced.popleft()[1])
        self._dispatch(released)

    def _maybe_snapshot(self) -> None:
        """Replace the log with a snapshot once it is over its bound (never while an fdatasync
        runs: that would close the file under it)."""
        kdir = self._dir
        if kdir is None or self._failure is not None or self._syncer is not None:
            return
        if self._closed or not kdir.wants_snapshot():
            return
        try:
            kdir.snapshot(self.core.state())
        except OSError as exc:
            self._fail("writing a snapshot", exc)
            return
        # The snapshot (fsynced) holds every change made so far.
        self._synced = self._written
        self._release(self._written)

    def _fail(self, what: str, exc: BaseException) -> None:
        """Fail the store for good (see the module docstring): every watch ends with the error,
        and every request from now on raises it."""
        self._failure = (what, exc)
        self._unsynced.clear()
        for client in self._clients:
            for stream in list(client._streams):
                stream._fail(self._storage_error())
        self._next_round()

    def _rearm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        deadline = self.core.next_lease_deadline()
        if deadline is None or not self._clients or self._closed:
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
        self._streams: weakref.WeakSet[WatchStream] = weakref.WeakSet()
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
        self.store._check_usable()
        # Leases already due are revoked before the request, as if the timer had just fired.
        self.store._commit(self.store.core.expire(self.store.clock()))
        return self.store.core

    async def _end(self, *commits: Commit | None, rearm: bool = False) -> None:
        self.store._commit(commits)
        if rearm:
            self.store._rearm()
        # Answer only once what the answer reflects is durable (see the module docstring).
        await self.store._durable()
        # A real backend's request always suspends the caller; yielding here keeps a writer
        # loop from starving watchers (and overflowing their queues) where etcd would not.
        await asyncio.sleep(0)

    async def range(
        self,
        key: bytes,
        range_end: bytes | None = None,
        revision: int = 0,
        *,
        min_mod_revision: int = 0,
    ) -> RangeResponse:
        resp = self._begin().range(key, range_end, revision, min_mod_revision=min_mod_revision)
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
            start_revision = self.store.durable_revision + 1
        return WatchStream(self, key, range_end, start_revision)

    async def request_watch_progress(self) -> None:
        revision = self.store.durable_revision
        for stream in list(self._streams):
            stream.offer_progress(revision)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.store._detach(self)
        for stream in list(self._streams):
            stream._wake.set()
