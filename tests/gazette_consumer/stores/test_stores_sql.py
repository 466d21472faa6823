"""SQLStore on SQLite (a temporary file) and PostgreSQL (a database of its own per test): the
store conformance kit, fencing of zombie primaries, pipelined commits, and the table's format.

The kit is also run against deliberately broken variants of SQLStore, to show that its checks
catch what they claim to.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from gazette_consumer.checkpoint import (
    Checkpoint,
    CheckpointDecodeError,
    InvalidCheckpointError,
    encode_checkpoint,
)
from gazette_consumer.stores import conformance
from gazette_consumer.stores.base import (
    CommitDependencyError,
    CommitPipeline,
    FencedError,
    OpFuture,
    PriorCommitFailedError,
    ShardContext,
    Store,
    StoreStateError,
)
from gazette_consumer.stores.conformance import (
    CHECKS,
    Check,
    ConformanceError,
    SimpleShard,
    check_store,
    sample_checkpoint,
)
from gazette_consumer.stores.sql import (
    CHECKPOINTS_TABLE,
    SQLStore,
    checkpoints_table,
    create_checkpoints_table,
    create_sqlite_engine,
)

USER_TABLE = "user_state"
_user = sa.Table(
    USER_TABLE,
    sa.MetaData(),
    sa.Column("k", sa.Text, primary_key=True),
    sa.Column("v", sa.LargeBinary, nullable=False),
)
_checkpoints = checkpoints_table()


def _put(connection: Connection, key: str, value: bytes) -> None:
    # Delete-then-insert: a portable upsert (each dialect spells ON CONFLICT its own way).
    connection.execute(sa.delete(_user).where(_user.c.k == key))
    connection.execute(sa.insert(_user).values(k=key, v=value))


# Plain engines on the SQLite files of store engines, by id of the store engine. A store
# engine begins every transaction with BEGIN IMMEDIATE, so reading through it would wait for
# a pending commit; a plain one reads a WAL snapshot and never waits.
_sqlite_readers: dict[int, Engine] = {}


def _reader(engine: Engine) -> Engine:
    return _sqlite_readers.get(id(engine), engine)


def _get(engine: Engine, key: str) -> bytes | None:
    with _reader(engine).connect() as connection:
        value = connection.execute(sa.select(_user.c.v).where(_user.c.k == key)).scalar()
    return None if value is None else bytes(value)


def _row(engine: Engine, fqn: str) -> tuple[int, bytes] | None:
    with _reader(engine).connect() as connection:
        row = connection.execute(
            sa.select(_checkpoints.c.fence, _checkpoints.c.checkpoint).where(
                _checkpoints.c.shard_fqn == fqn
            )
        ).one_or_none()
    return None if row is None else (int(row.fence), bytes(row.checkpoint))


class SQLFactory:
    """The conformance kit's factory: SQLStores of one engine (a store per `open`)."""

    def __init__(self, engine: Engine, store_type: type[SQLStore] = SQLStore) -> None:
        self.engine = engine
        self.store_type = store_type

    @property
    def stages_while_committing(self) -> bool:
        # SQLite has one writer: a transaction waiting to commit holds it.
        return self.engine.dialect.name != "sqlite"

    async def open(self, shard: ShardContext) -> Store:
        return self.store_type(self.engine)

    async def stage(self, store: Store, key: str, value: bytes) -> None:
        assert isinstance(store, SQLStore)
        await store.run(lambda connection: _put(connection, key, value))

    async def read(self, store: Store, key: str) -> bytes | None:
        return await asyncio.to_thread(_get, self.engine, key)


async def _prepare(engine: Engine) -> Engine:
    await create_checkpoints_table(engine)
    await asyncio.to_thread(_user.create, engine, checkfirst=True)
    return engine


@pytest.fixture
async def sqlite_engine(tmp_path: Path) -> AsyncIterator[Engine]:
    engine = create_sqlite_engine(tmp_path / "store.db")
    _sqlite_readers[id(engine)] = sa.create_engine(f"sqlite:///{tmp_path / 'store.db'}")
    yield await _prepare(engine)
    _sqlite_readers.pop(id(engine)).dispose()
    engine.dispose()


@pytest.fixture
async def pg_engine(pg_url: str) -> AsyncIterator[Engine]:
    """An engine on a database created for this test alone, dropped afterwards."""
    name = f"stores_{uuid.uuid4().hex[:16]}"
    admin = sa.create_engine(pg_url, isolation_level="AUTOCOMMIT")

    def ddl(statement: str) -> None:
        with admin.connect() as connection:
            connection.exec_driver_sql(statement)

    await asyncio.to_thread(ddl, f'CREATE DATABASE "{name}"')
    # A lock wait that outlives lock_timeout_ms is a deadlock between pipelined transactions:
    # fail with an error naming the lock rather than hang until the test's timeout.
    lock_timeout_ms = 20_000
    engine = sa.create_engine(
        sa.make_url(pg_url).set(database=name),
        connect_args={"options": f"-c lock_timeout={lock_timeout_ms}"},
    )
    try:
        yield await _prepare(engine)
    finally:
        engine.dispose()
        await asyncio.to_thread(ddl, f'DROP DATABASE "{name}" WITH (FORCE)')
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def engine(request: pytest.FixtureRequest) -> Engine:
    fixture = "sqlite_engine" if request.param == "sqlite" else "pg_engine"
    value = request.getfixturevalue(fixture)
    assert isinstance(value, Engine)
    return value


def _shard(name: str = "shard-000") -> SimpleShard:
    return SimpleShard(fqn=f"test/consumer/items/{name}")


# --- The conformance kit ------------------------------------------------------------------------


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
async def test_conformance_check(engine: Engine, check: Check) -> None:
    await check(SQLFactory(engine), conformance.fresh_prefix())


async def test_check_store_runs_every_check(sqlite_engine: Engine) -> None:
    await check_store(SQLFactory(sqlite_engine))
    # Every check used a shard of its own, all under one prefix.
    with _reader(sqlite_engine).connect() as connection:
        fqns: list[str] = list(connection.execute(sa.select(_checkpoints.c.shard_fqn)).scalars())
    prefixes = {fqn.split("/items/")[0] for fqn in fqns}
    checks = {fqn.split("/items/")[1] for fqn in fqns}
    assert len(prefixes) == 1
    assert checks == {check.__name__.removeprefix("check_") for check in CHECKS}


# --- Broken stores the kit must reject ----------------------------------------------------------


class UnfencedStore(SQLStore):
    """Restores without moving the fence: a zombie keeps committing."""

    def _restore_sync(self, fqn: str) -> tuple[int, bytes]:
        with self.engine.begin() as connection:
            row = connection.execute(
                sa.select(_checkpoints.c.fence, _checkpoints.c.checkpoint).where(
                    _checkpoints.c.shard_fqn == fqn
                )
            ).one_or_none()
            if row is None:
                connection.execute(
                    sa.insert(_checkpoints).values(shard_fqn=fqn, fence=1, checkpoint=b"")
                )
                return 1, b""
            return int(row.fence), bytes(row.checkpoint)


class NonAtomicStore(SQLStore):
    """Commits the user's changes before, and apart from, the fenced checkpoint update."""

    async def run(self, fn: Callable[[Connection], object]) -> object:  # type: ignore[override]
        def autocommitted(connection: Connection) -> object:
            result = fn(connection)
            connection.commit()
            connection.begin()
            return result

        return await super().run(autocommitted)


class EagerStore(SQLStore):
    """Ignores `wait_for`: commits before the appends it should wait on."""

    async def start_commit(
        self, shard: ShardContext, checkpoint: Checkpoint, wait_for: Sequence[Awaitable[object]]
    ) -> OpFuture:
        return await super().start_commit(shard, checkpoint, [])


class _UnorderedPipeline(CommitPipeline):
    def submit(
        self,
        wait_for: Sequence[Awaitable[object]],
        apply: Callable[[], Awaitable[None]],
        abort: Callable[[], Awaitable[None]],
    ) -> OpFuture:
        self._last = None  # Forget the previous commit: nothing orders this one after it.
        return super().submit(wait_for, apply, abort)


class UnorderedStore(SQLStore):
    """Does not order a commit after the previous one."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self._pipeline = _UnorderedPipeline()


@pytest.mark.parametrize(
    ("store_type", "check", "complaint"),
    [
        (UnfencedStore, conformance.check_zombie_is_fenced, "older instance's commit succeeded"),
        (NonAtomicStore, conformance.check_zombie_is_fenced, "user state is b'zombie'"),
        (EagerStore, conformance.check_failed_dependency_does_not_commit, "commit 2 succeeded"),
        (
            UnorderedStore,
            conformance.check_commit_behind_failed_commit_fails,
            "commit 3 (queued behind 2) succeeded",
        ),
    ],
    ids=lambda value: getattr(value, "__name__", None),
)
async def test_kit_rejects_broken_store(
    sqlite_engine: Engine, store_type: type[SQLStore], check: Check, complaint: str
) -> None:
    name = check.__name__.removeprefix("check_")
    with pytest.raises(ConformanceError, match=rf"^{name}: .*{re.escape(complaint)}"):
        await check(SQLFactory(sqlite_engine, store_type), conformance.fresh_prefix())


# --- Fencing ------------------------------------------------------------------------------------


async def test_zombie_commit_is_fenced_and_rolled_back(engine: Engine) -> None:
    shard = _shard()
    zombie, primary = SQLStore(engine), SQLStore(engine)
    try:
        assert await zombie.restore_checkpoint(shard) == Checkpoint()
        assert zombie.fence == 1
        assert await primary.restore_checkpoint(shard) == Checkpoint()
        assert primary.fence == 2
        assert _row(engine, shard.fqn) == (2, b"")

        await zombie.run(lambda c: _put(c, "k", b"from the zombie"))
        with pytest.raises(FencedError, match=r"fence is no longer 1"):
            await (await zombie.start_commit(shard, sample_checkpoint(1), []))
        # Its staged write went with the failed commit; the row is untouched.
        assert await asyncio.to_thread(_get, engine, "k") is None
        assert _row(engine, shard.fqn) == (2, b"")

        await primary.run(lambda c: _put(c, "k", b"from the primary"))
        await (await primary.start_commit(shard, sample_checkpoint(2), []))
        assert await asyncio.to_thread(_get, engine, "k") == b"from the primary"
        assert _row(engine, shard.fqn) == (2, encode_checkpoint(sample_checkpoint(2)))
    finally:
        await zombie.destroy()
        await primary.destroy()


async def test_zombie_stays_fenced_for_later_commits(sqlite_engine: Engine) -> None:
    shard = _shard()
    zombie, primary = SQLStore(sqlite_engine), SQLStore(sqlite_engine)
    try:
        await zombie.restore_checkpoint(shard)
        await (await zombie.start_commit(shard, sample_checkpoint(1), []))
        await primary.restore_checkpoint(shard)
        with pytest.raises(FencedError):
            await (await zombie.start_commit(shard, sample_checkpoint(2), []))
        # Every later commit fails too, naming the fenced one as its cause.
        with pytest.raises(PriorCommitFailedError, match=r"^commit 3: commit 2 failed") as info:
            await (await zombie.start_commit(shard, sample_checkpoint(3), []))
        assert isinstance(info.value.__cause__, FencedError)
        # The primary recovered what the zombie committed before the hand-over.
        assert _row(sqlite_engine, shard.fqn) == (2, encode_checkpoint(sample_checkpoint(1)))
    finally:
        await zombie.destroy()
        await primary.destroy()


async def test_concurrent_first_restores_get_distinct_fences(engine: Engine) -> None:
    # Both find no row and race to insert it; the loser retries and bumps the winner's fence.
    shard = _shard("shard-race")
    stores = [SQLStore(engine) for _ in range(4)]
    try:
        await asyncio.gather(*(store.restore_checkpoint(shard) for store in stores))
        assert sorted(store.fence or 0 for store in stores) == [1, 2, 3, 4]
        # Only the last to restore may commit.
        for store in stores:
            future = await store.start_commit(shard, sample_checkpoint(store.fence or 0), [])
            error = await _outcome(future)
            assert (error is None) == (store.fence == 4), (store.fence, error)
    finally:
        for store in stores:
            await store.destroy()


async def _outcome(future: OpFuture) -> BaseException | None:
    await asyncio.wait({future})
    return future.exception()


# --- Pipelining ---------------------------------------------------------------------------------


async def test_pipelined_commit_waits_for_its_dependencies_and_predecessor(
    engine: Engine,
) -> None:
    shard = _shard()
    store = SQLStore(engine)
    try:
        await store.restore_checkpoint(shard)
        await store.run(lambda c: _put(c, "k", b"one"))
        append: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        first = await store.start_commit(shard, sample_checkpoint(1), [append])
        # start_commit returned while its dependency is unresolved, so the commit cannot have
        # applied; and the second is queued behind it.
        assert not first.done()
        second = await store.start_commit(shard, sample_checkpoint(2), [])
        assert not second.done()
        # While commit 1 waits, neither has touched the row, though the commit tasks ran (the
        # read below hands the event loop over). A deterministic check of the ordering itself
        # is the kit's, against UnorderedStore (test_kit_rejects_broken_store).
        assert await asyncio.to_thread(_row, engine, shard.fqn) == (1, b"")
        assert not first.done() and not second.done()

        append.set_result(None)
        await first
        await second
        # Both applied, each overwriting the row: it holds the second, so that one came last.
        # (Unordered, the second would apply at once on PostgreSQL, and the first after it.)
        assert _row(engine, shard.fqn) == (1, encode_checkpoint(sample_checkpoint(2)))
        assert await asyncio.to_thread(_get, engine, "k") == b"one"
    finally:
        await store.destroy()


async def test_a_commit_that_staged_nothing_and_the_next_transaction_both_go_through(
    sqlite_engine: Engine,
) -> None:
    """Found by audit (2026-11-29): transaction N stages nothing (its application skipped every
    message), and its commit waits for N's appends; pipelined N+1 stages a change. On SQLite,
    N+1's BEGIN IMMEDIATE took the write lock that N's commit needed once its appends landed,
    while N+1 could not commit before N: N failed "database is locked" after the busy
    timeout (60 s), and again after every restart of the shard. N+1 now begins once N is done."""
    shard = _shard()
    store = SQLStore(sqlite_engine)
    try:
        await store.restore_checkpoint(shard)
        appends: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        first = await store.start_commit(shard, sample_checkpoint(1), [appends])
        following = asyncio.ensure_future(store.run(lambda c: _put(c, "k", b"next")))
        # The chance to begin that a pipelined shard's next transaction has while N's appends
        # are in flight (its outcome is checked whether or not it took it).
        await asyncio.wait({following}, timeout=1.0)
        appends.set_result(None)
        assert await _outcome(first) is None
        await following
        await (await store.start_commit(shard, sample_checkpoint(2), []))
        assert await asyncio.to_thread(_row, sqlite_engine, shard.fqn) == (
            1,
            encode_checkpoint(sample_checkpoint(2)),
        )
        assert await asyncio.to_thread(_get, sqlite_engine, "k") == b"next"
    finally:
        await store.destroy()


async def test_cancelling_a_commit_future_does_not_cancel_the_commit(
    sqlite_engine: Engine,
) -> None:
    # A caller that stops waiting (say, asyncio.wait_for timed out) abandons only its wait: the
    # commit goes on, and so do the commits ordered behind it.
    shard = _shard()
    store = SQLStore(sqlite_engine)
    try:
        await store.restore_checkpoint(shard)
        await store.run(lambda c: _put(c, "k", b"one"))
        append: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        first = await store.start_commit(shard, sample_checkpoint(1), [append])
        second = await store.start_commit(shard, sample_checkpoint(2), [])
        first.cancel()
        append.set_result(None)
        await second
        assert await asyncio.to_thread(_get, sqlite_engine, "k") == b"one"
        assert _row(sqlite_engine, shard.fqn) == (1, encode_checkpoint(sample_checkpoint(2)))
    finally:
        await store.destroy()


async def test_failed_dependency_rolls_back_and_reports_cause(sqlite_engine: Engine) -> None:
    shard = _shard()
    store = SQLStore(sqlite_engine)
    try:
        await store.restore_checkpoint(shard)
        await store.run(lambda c: _put(c, "k", b"staged"))
        append: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future = await store.start_commit(shard, sample_checkpoint(1), [append])
        cause = OSError("append to ns/out failed")
        append.set_exception(cause)
        with pytest.raises(CommitDependencyError, match=r"wait_for\[0\] failed") as info:
            await future
        assert info.value.__cause__ is cause
        assert await asyncio.to_thread(_get, sqlite_engine, "k") is None
    finally:
        await store.destroy()


async def test_coroutine_dependencies_are_awaited(sqlite_engine: Engine) -> None:
    shard = _shard()
    store = SQLStore(sqlite_engine)
    released = asyncio.Event()
    ran: list[str] = []

    async def append() -> None:
        await released.wait()
        ran.append("append")

    try:
        await store.restore_checkpoint(shard)
        future = await store.start_commit(shard, sample_checkpoint(1), [append()])
        released.set()
        await future
        assert ran == ["append"]
        assert _row(sqlite_engine, shard.fqn) == (1, encode_checkpoint(sample_checkpoint(1)))
    finally:
        await store.destroy()


async def test_destroy_cancels_pending_commit_and_rolls_back(sqlite_engine: Engine) -> None:
    shard = _shard()
    store = SQLStore(sqlite_engine)
    await store.restore_checkpoint(shard)
    await store.run(lambda c: _put(c, "k", b"pending"))
    append: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    future = await store.start_commit(shard, sample_checkpoint(1), [append])
    await store.destroy()
    assert future.cancelled()
    assert not append.cancelled()  # Someone else's future: not ours to cancel.
    assert await asyncio.to_thread(_get, sqlite_engine, "k") is None
    assert _row(sqlite_engine, shard.fqn) == (1, b"")


# --- Protocol misuse ----------------------------------------------------------------------------


async def test_misuse_is_refused(sqlite_engine: Engine) -> None:
    store = SQLStore(sqlite_engine)
    with pytest.raises(StoreStateError, match=r"^start_commit: restore_checkpoint must come first"):
        await store.start_commit(_shard(), Checkpoint(), [])
    with pytest.raises(StoreStateError, match=r"^transaction: restore_checkpoint must come first"):
        await store.run(lambda c: None)

    await store.restore_checkpoint(_shard())
    with pytest.raises(StoreStateError, match=r"is not the restored shard"):
        await store.start_commit(_shard("shard-other"), Checkpoint(), [])
    await store.run(lambda c: _put(c, "k", b"v"))
    with pytest.raises(StoreStateError, match=r"^restore_checkpoint: a transaction is open"):
        await store.restore_checkpoint(_shard())

    await store.destroy()
    await store.destroy()  # Idempotent.
    for call in (
        lambda: store.restore_checkpoint(_shard()),
        lambda: store.start_commit(_shard(), Checkpoint(), []),
        lambda: store.run(lambda c: None),
    ):
        with pytest.raises(StoreStateError, match=r"the store was destroyed"):
            await call()


async def test_invalid_checkpoint_is_refused_and_changes_nothing(sqlite_engine: Engine) -> None:
    shard = _shard()
    store = SQLStore(sqlite_engine)
    try:
        await store.restore_checkpoint(shard)
        await store.run(lambda c: _put(c, "k", b"staged"))
        bad = Checkpoint(ack_intents={"": b"ACK"})
        with pytest.raises(InvalidCheckpointError, match=r"^checkpoint\.ack_intents\[\]"):
            await store.start_commit(shard, bad, [])
        # The staged transaction is still open, and commits with the next (valid) checkpoint.
        await (await store.start_commit(shard, sample_checkpoint(1), []))
        assert await asyncio.to_thread(_get, sqlite_engine, "k") == b"staged"
    finally:
        await store.destroy()


async def test_commits_in_flight_are_bounded(sqlite_engine: Engine) -> None:
    shard = _shard()
    store = SQLStore(sqlite_engine, commits_in_flight_max=2)
    try:
        await store.restore_checkpoint(shard)
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        futures = [await store.start_commit(shard, sample_checkpoint(n), [gate]) for n in (1, 2)]
        with pytest.raises(StoreStateError, match=r"2 commits in flight, the maximum"):
            await store.start_commit(shard, sample_checkpoint(3), [])
        gate.set_result(None)
        await asyncio.gather(*futures)
        assert _row(sqlite_engine, shard.fqn) == (1, encode_checkpoint(sample_checkpoint(2)))
    finally:
        await store.destroy()


# --- Table format -------------------------------------------------------------------------------


async def test_restore_reads_a_row_written_by_gazette(engine: Engine) -> None:
    # A row as a Go consumer leaves it: some fence, and a checkpoint in Gazette's wire format
    # (one source "ns/a" read through 300, no producers; see test_checkpoint for the encoding).
    shard = _shard()
    wire = bytes.fromhex("0a0b0a046e732f61120308ac02")
    with engine.begin() as connection:
        connection.execute(
            sa.insert(_checkpoints).values(shard_fqn=shard.fqn, fence=41, checkpoint=wire)
        )
    store = SQLStore(engine)
    try:
        checkpoint = await store.restore_checkpoint(shard)
        assert store.fence == 42
        assert dict(checkpoint.sources) == {"ns/a": Checkpoint.Source(read_through=300)}
        await (await store.start_commit(shard, checkpoint, []))
        assert _row(engine, shard.fqn) == (42, wire)
    finally:
        await store.destroy()


async def test_corrupt_checkpoint_row_is_a_typed_error(sqlite_engine: Engine) -> None:
    shard = _shard()
    with sqlite_engine.begin() as connection:
        connection.execute(
            sa.insert(_checkpoints).values(shard_fqn=shard.fqn, fence=1, checkpoint=b"\xff\xff")
        )
    store = SQLStore(sqlite_engine)
    try:
        with pytest.raises(CheckpointDecodeError, match=r"^checkpoint: not a consumer\.Checkpoint"):
            await store.restore_checkpoint(shard)
        with pytest.raises(StoreStateError, match=r"restore_checkpoint must come first"):
            await store.start_commit(shard, Checkpoint(), [])
    finally:
        await store.destroy()


async def test_custom_table_name(sqlite_engine: Engine) -> None:
    await create_checkpoints_table(sqlite_engine, "other_checkpoints")
    shard = _shard()
    store = SQLStore(sqlite_engine, table_name="other_checkpoints")
    try:
        await store.restore_checkpoint(shard)
        await (await store.start_commit(shard, sample_checkpoint(1), []))
    finally:
        await store.destroy()
    assert _row(sqlite_engine, shard.fqn) is None
    other = checkpoints_table("other_checkpoints")
    with sqlite_engine.connect() as connection:
        fence = connection.execute(
            sa.select(other.c.fence).where(other.c.shard_fqn == shard.fqn)
        ).scalar()
    assert fence == 1


def test_checkpoints_table_name_is_gazettes() -> None:
    assert CHECKPOINTS_TABLE == "gazette_checkpoints"
    assert [c.name for c in checkpoints_table().columns] == ["shard_fqn", "fence", "checkpoint"]
