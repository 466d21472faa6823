"""SQLStore: a shard store in a SQL database (SQLAlchemy 2), fenced against zombie primaries.

SQLite is the embedded default; PostgreSQL serves clusters. Checkpoints live in one table,
compatible with Gazette's own SQLStore so that both can share a database:

    gazette_checkpoints(shard_fqn TEXT PRIMARY KEY, fence INTEGER NOT NULL,
                        checkpoint BLOB NOT NULL)        -- BYTEA on PostgreSQL

Fencing (docs/architecture.md, Invariants; docs/stores.md has the argument in full).
`restore_checkpoint`
increments the shard's `fence` in a transaction of its own and remembers the value. Every
commit then runs, in the same SQL transaction as the application's staged changes,

    UPDATE gazette_checkpoints SET checkpoint=:cp WHERE shard_fqn=:fqn AND fence=:fence

and commits only if that updated the row. Once a newer instance has restored, the fence no
longer matches, the UPDATE matches no row, and the zombie's whole transaction — its staged
changes with it — is rolled back with `FencedError`. The row's lock (PostgreSQL) or the
database write lock (SQLite) serializes a commit against a concurrent restore: whichever comes
second sees the first.

Unlike Gazette's, this store creates the shard's row on restore (fence 1, empty checkpoint)
instead of inserting it on the first commit: that way two instances restoring a never-committed
shard still get distinct fences, and the earlier one cannot commit after the later restored.

Threads. SQLAlchemy's core is synchronous, and its asyncio extension needs the greenlet package
plus an async driver per database (aiosqlite, psycopg's async mode). We keep the synchronous
engine and run every database call in a worker thread of the store's own two-thread pool: one
thread for the transaction being staged, one for the commit in progress. Their own pool, not the
event loop's shared default executor, because on SQLite a transaction's BEGIN may wait (up to
`SQLITE_BUSY_TIMEOUT_S`) for the previous transaction's commit to release the database: if
many shards parked such waits on the shared executor, the commits they wait for could find no
thread to run on. A database call is never abandoned mid-way: a cancelled caller waits for its
thread to finish, so that no two threads ever use one connection.

The application stages its changes through `await store.run(fn)`, which calls `fn(connection)`
on the current consumer transaction's connection in a worker thread (the transaction begins on
first use). `await store.transaction()` returns that connection itself, for code that accepts
blocking the event loop while it runs SQL.

Pipelining. `start_commit` detaches the current transaction and queues its commit (see
`CommitPipeline`); the next transaction begins on a fresh connection. On PostgreSQL the two
overlap freely. On SQLite, which has a single writer, engines from `create_sqlite_engine` begin
every transaction with BEGIN IMMEDIATE: the next transaction's first `run` waits until the
previous commit releases the database, instead of failing later with a stale-snapshot error.
It waits for the commits in flight to finish before it begins: a commit of a transaction that
staged nothing takes the write lock only once its dependencies resolve, and a next transaction
that took it first would hold what that commit waits for while waiting for that commit (a
deadlock until the busy timeout, then again after the shard's restart: found by audit,
2026-11-29).
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from gazette_consumer.checkpoint import Checkpoint, decode_checkpoint, encode_checkpoint
from gazette_consumer.stores.base import (
    COMMITS_IN_FLIGHT_MAX,
    CommitPipeline,
    FencedError,
    OpFuture,
    ShardContext,
    StoreError,
    StoreStateError,
)

__all__ = [
    "CHECKPOINTS_TABLE",
    "SQLITE_BUSY_TIMEOUT_S",
    "FencedError",
    "SQLStore",
    "checkpoints_table",
    "create_checkpoints_table",
    "create_sqlite_engine",
]

T = TypeVar("T")

CHECKPOINTS_TABLE = "gazette_checkpoints"
"""Gazette's table name; shared with Go consumers of the same database."""

SQLITE_BUSY_TIMEOUT_S = 60.0
"""How long a SQLite statement waits for another connection's write lock before failing with
"database is locked". A pipelined transaction waits this long, at most, for the previous
commit, whose `wait_for` appends normally resolve in milliseconds."""

RESTORE_ATTEMPTS_MAX = 3
"""Restores of a shard whose row does not exist yet race to insert it; the loser retries, and
finds the row. Two attempts always suffice (rows are never deleted); one more for slack."""

WORKER_THREADS = 2
"""Per store: one thread stages the open transaction, one runs the commit in progress."""


def checkpoints_table(
    name: str = CHECKPOINTS_TABLE, metadata: sa.MetaData | None = None
) -> sa.Table:
    """The checkpoints table's SQLAlchemy definition (LargeBinary is BLOB / BYTEA)."""
    return sa.Table(
        name,
        metadata if metadata is not None else sa.MetaData(),
        sa.Column("shard_fqn", sa.Text, primary_key=True),
        sa.Column("fence", sa.Integer, nullable=False),
        sa.Column("checkpoint", sa.LargeBinary, nullable=False),
    )


async def create_checkpoints_table(engine: Engine, name: str = CHECKPOINTS_TABLE) -> None:
    """Create the checkpoints table if it does not exist (Gazette leaves this to the user)."""
    table = checkpoints_table(name)
    await asyncio.to_thread(table.create, engine, checkfirst=True)


def create_sqlite_engine(path: str | os.PathLike[str]) -> Engine:
    """An engine on the SQLite file at `path`, configured as SQLStore needs it.

    - BEGIN IMMEDIATE for every transaction (see the module docstring, "Pipelining").
    - WAL journal, so that readers do not wait for the writer, and synchronous=FULL, so that a
      commit — and with it the checkpoint — survives power loss once it returns.
    - A busy timeout of SQLITE_BUSY_TIMEOUT_S; connections usable from the worker threads.

    Every transaction on this engine takes the write lock, reads included: readers outside the
    store should use a plain engine of their own, which reads a WAL snapshot without waiting.
    """
    engine = sa.create_engine(
        f"sqlite:///{os.fspath(path)}",
        connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S, "check_same_thread": False},
    )

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Stop the sqlite3 module from issuing its own (deferred) BEGIN: we issue ours below.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


@dataclass
class _Txn:
    """One consumer transaction's SQL connection. `lock` keeps one thread at a time on it."""

    connection: Connection
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    closed: bool = False


class SQLStore:
    """A Store over a SQLAlchemy engine. See the module docstring.

    The engine is the caller's: `destroy` does not dispose of it, as several shards' stores
    may share one engine (and its connection pool).
    """

    def __init__(
        self,
        engine: Engine,
        *,
        table_name: str = CHECKPOINTS_TABLE,
        commits_in_flight_max: int = COMMITS_IN_FLIGHT_MAX,
    ) -> None:
        self._engine = engine
        self._table = t = checkpoints_table(table_name)
        # Built once, with parameters bound per commit: building and caching the UPDATE at
        # each commit cost ~125 us of CPU per transaction.
        self._commit_update = (
            sa.update(t)
            .where(t.c.shard_fqn == sa.bindparam("fqn"), t.c.fence == sa.bindparam("fence_"))
            .values(checkpoint=sa.bindparam("data"))
        )
        self._pipeline = CommitPipeline(commits_in_flight_max)
        self._executor = ThreadPoolExecutor(WORKER_THREADS, thread_name_prefix="sqlstore")
        self._fqn: str | None = None
        self._fence: int | None = None
        self._txn: _Txn | None = None
        # Held while the open transaction is created or detached, so that a commit started
        # while a first `run` is still connecting takes that transaction with it.
        self._txn_lock = asyncio.Lock()
        self._destroyed = False
        self._single_writer = engine.dialect.name == "sqlite"

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def fence(self) -> int | None:
        """The fence this instance holds, from its last restore (None before any)."""
        return self._fence

    # --- The application's transaction ---------------------------------------------------------

    async def run(self, fn: Callable[[Connection], T]) -> T:
        """Call `fn(connection)` in a worker thread, on the current consumer transaction's
        connection, and return its result. Changes it makes commit with the next
        `start_commit`, or not at all.

        While the previous transaction's commit is pending, PostgreSQL (READ COMMITTED) shows
        this one the data as of before it: update in SQL (`SET n = n + 1`) or read with
        `SELECT ... FOR UPDATE` rather than read-modify-write in Python (docs/stores.md)."""
        txn = await self._current_txn()
        async with txn.lock:
            if txn.closed:
                raise StoreStateError(
                    "run: the transaction was committed while this call waited for it"
                )
            return await self._in_worker(fn, txn.connection)

    async def transaction(self) -> Connection:
        """The current consumer transaction's connection, begun if need be. Statements run on
        it directly block the event loop; prefer `run`."""
        return (await self._current_txn()).connection

    async def _current_txn(self) -> _Txn:
        self._check_usable("transaction")
        if self._fence is None:
            raise StoreStateError("transaction: restore_checkpoint must come first")
        async with self._txn_lock:
            if self._txn is None:
                if self._single_writer:
                    # Every commit in flight holds SQLite's write lock, or will take it (one
                    # that staged nothing): this transaction begins after them (see the module
                    # docstring, "Pipelining").
                    await self._pipeline.settled()
                # A cancelled begin must not leak its connection (and SQLite's write lock).
                connection = await self._in_worker(
                    _begin, self._engine, on_cancel=_rollback_and_close
                )
                self._txn = _Txn(connection)
            return self._txn

    # --- Store ---------------------------------------------------------------------------------

    async def restore_checkpoint(self, shard: ShardContext) -> Checkpoint:
        """Increment the shard's fence (creating its row if need be) and return its checkpoint.

        After this returns, no other instance that restored this shard earlier can commit.
        """
        self._check_usable("restore_checkpoint")
        if self._txn is not None or self._pipeline.in_flight:
            raise StoreStateError(
                "restore_checkpoint: a transaction is open or commits are pending; "
                "restore a store before using it, or use a new one"
            )
        fence, data = await self._in_worker(self._restore_sync, shard.fqn)
        checkpoint = decode_checkpoint(data)
        self._fqn, self._fence = shard.fqn, fence
        return checkpoint

    async def start_commit(
        self, shard: ShardContext, checkpoint: Checkpoint, wait_for: Sequence[Awaitable[object]]
    ) -> OpFuture:
        """Queue the commit of the current transaction with `checkpoint`; see the module
        docstring. The returned future fails with FencedError if a newer instance restored."""
        self._check_usable("start_commit")
        if self._fence is None or self._fqn is None:
            raise StoreStateError("start_commit: restore_checkpoint must come first")
        if shard.fqn != self._fqn:
            # The fence guards one shard's row; committing another's would bypass it.
            raise StoreStateError(
                f"start_commit: shard {shard.fqn!r} is not the restored shard {self._fqn!r}"
            )
        # Encode first: an invalid checkpoint raises here, before anything is detached.
        data = encode_checkpoint(checkpoint)
        fqn, fence = self._fqn, self._fence
        async with self._txn_lock:
            txn = self._txn
            future = self._pipeline.submit(
                wait_for,
                apply=functools.partial(self._apply, txn, fqn, fence, data),
                abort=functools.partial(self._discard, txn),
            )
            # Detached only once queued: if submit refused, the transaction stays open.
            self._txn = None
        return future

    async def destroy(self) -> None:
        """Cancel pending commits, roll back the open transaction, stop the worker threads."""
        if self._destroyed:
            return
        self._destroyed = True
        await self._pipeline.close()
        async with self._txn_lock:
            txn, self._txn = self._txn, None
        await self._discard(txn)
        self._executor.shutdown(wait=False)

    # --- Commit steps --------------------------------------------------------------------------

    async def _apply(self, txn: _Txn | None, fqn: str, fence: int, data: bytes) -> None:
        if txn is None:
            # Nothing was staged: the checkpoint commits in a transaction of its own.
            await self._in_worker(self._commit_sync, None, fqn, fence, data)
            return
        async with txn.lock:
            txn.closed = True
            await self._in_worker(self._commit_sync, txn.connection, fqn, fence, data)

    async def _discard(self, txn: _Txn | None) -> None:
        if txn is None:
            return
        async with txn.lock:
            if not txn.closed:
                txn.closed = True
                await self._in_worker(_rollback_and_close, txn.connection)

    # --- Blocking work (worker threads only) ---------------------------------------------------

    def _restore_sync(self, fqn: str) -> tuple[int, bytes]:
        t = self._table
        last_error: IntegrityError | None = None
        for _attempt in range(RESTORE_ATTEMPTS_MAX):
            try:
                with self._engine.begin() as connection:
                    bumped = connection.execute(
                        sa.update(t).where(t.c.shard_fqn == fqn).values(fence=t.c.fence + 1)
                    )
                    if bumped.rowcount == 0:
                        # A shard that never ran. Its row starts at fence 1 with the empty
                        # checkpoint (zero bytes, which Gazette also decodes as empty).
                        connection.execute(
                            sa.insert(t).values(shard_fqn=fqn, fence=1, checkpoint=b"")
                        )
                    row = connection.execute(
                        sa.select(t.c.fence, t.c.checkpoint).where(t.c.shard_fqn == fqn)
                    ).one()
                    return int(row.fence), bytes(row.checkpoint)
            except IntegrityError as err:
                # Another instance inserted the row between our UPDATE and INSERT: retry, and
                # the UPDATE will find it.
                last_error = err
        raise StoreError(
            f"restore_checkpoint: shard {fqn!r}: could not create or fence its checkpoint row "
            f"in {RESTORE_ATTEMPTS_MAX} attempts"
        ) from last_error

    def _commit_sync(
        self, connection: Connection | None, fqn: str, fence: int, data: bytes
    ) -> None:
        if connection is None:
            connection = _begin(self._engine)
        try:
            updated = connection.execute(
                self._commit_update, {"fqn": fqn, "fence_": fence, "data": data}
            )
            if updated.rowcount != 1:
                raise FencedError(
                    f"shard {fqn!r}: checkpoint fence is no longer {fence} (a newer instance "
                    "restored the shard): this commit and its staged changes were rolled back"
                )
            connection.commit()
        except BaseException:
            _rollback_and_close(connection)
            raise
        connection.close()

    # --- Plumbing ------------------------------------------------------------------------------

    def _check_usable(self, operation: str) -> None:
        if self._destroyed:
            raise StoreStateError(f"{operation}: the store was destroyed")

    async def _in_worker(
        self, fn: Callable[..., T], *args: Any, on_cancel: Callable[[T], None] | None = None
    ) -> T:
        """Run `fn(*args)` in a worker thread. If cancelled, wait for the thread to finish
        before re-raising: a thread cannot be interrupted, and whoever takes the connection
        next must not use it concurrently. If `fn` succeeded nonetheless, `on_cancel` gets its
        result, which nobody else will."""
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._executor, functools.partial(fn, *args))
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            await _settle(future)
            if on_cancel is not None and not future.cancelled() and future.exception() is None:
                on_cancel(future.result())
            raise


def _begin(engine: Engine) -> Connection:
    connection = engine.connect()
    try:
        connection.begin()
    except BaseException:
        connection.close()
        raise
    return connection


def _rollback_and_close(connection: Connection) -> None:
    try:
        connection.rollback()
    except SQLAlchemyError:
        # A broken connection cannot roll back, but its transaction dies with it all the same;
        # the error that got us here is the one worth reporting.
        pass
    finally:
        connection.close()


async def _settle(future: asyncio.Future[Any]) -> None:
    while not future.done():
        try:
            await asyncio.wait({future})
        except asyncio.CancelledError:
            # Cancelled again while waiting: keep waiting; the caller re-raises once done.
            continue
    if not future.cancelled():
        future.exception()  # Retrieved, so asyncio does not report it as lost.
