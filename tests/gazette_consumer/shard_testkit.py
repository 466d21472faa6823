"""Shared fixtures of the shard tests: an in-process broker, SQL engines, a counting Application,
a commit-holding Store wrapper, and input producers with transactions, rollbacks and duplicates.

Everything here is real: the broker serves gRPC on loopback, stores are SQLStores on SQLite or a
PostgreSQL database of the test's own, producers publish through real Publishers and
AppendServices. `GatedStore` is a fake that wraps a real store (it only delays commits), part
of this kit as the style guide's fault-injecting store wrappers are.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import sqlalchemy as sa
from google.protobuf.duration_pb2 import Duration
from sqlalchemy.engine import Connection, Engine

from broker.client.append_service import AppendService, AsyncAppend
from broker.client.route_cache import JournalClient
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import labels
from broker.protocol import protocol_pb2 as pb
from broker.server import Broker
from gazette_consumer.application import Application, Shard
from gazette_consumer.checkpoint import Checkpoint, decode_checkpoint
from gazette_consumer.message import CONTENT_TYPE_JSON_LINES, JSONFraming, JSONMessage
from gazette_consumer.message.mapping import Partition
from gazette_consumer.message.message import Envelope
from gazette_consumer.message.publisher import Publisher
from gazette_consumer.message.uuid import Flag
from gazette_consumer.sequencer.read_iter import ReadCommittedIter
from gazette_consumer.shard_handle import ShardHandle
from gazette_consumer.stores.base import OpFuture, ShardContext, Store
from gazette_consumer.stores.sql import SQLStore, create_checkpoints_table, create_sqlite_engine
from tests.broker.broker_testkit import Cluster, journal_spec, local_content

# Upper bound of any wait in these tests; never a synchronisation device.
WAIT_S = 60.0
JSON = JSONFraming()


class Event(JSONMessage, kw_only=True):
    """A test message: `key` is what the counting app counts, `text` identifies it."""

    key: str = ""
    text: str = ""


# --- Broker -------------------------------------------------------------------------------------


@dataclass
class BrokerEnv:
    cluster: Cluster
    broker: Broker
    client: JournalClient

    async def journal(self, name: str) -> str:
        spec = journal_spec(name)
        spec.labels.CopyFrom(labels.label_set([(labels.CONTENT_TYPE, CONTENT_TYPE_JSON_LINES)]))
        await self.cluster.create(spec, [self.broker])
        return name


@contextlib.asynccontextmanager
async def broker_env() -> AsyncIterator[BrokerEnv]:
    """One in-process broker (R=1) on loopback, and a client of it."""
    cluster = Cluster()
    broker = await cluster.start_broker("zone-a", "broker-a")
    client = JournalClient(broker.endpoint)
    try:
        yield BrokerEnv(cluster, broker, client)
    finally:
        await client.close()
        await cluster.close()


def shard_spec(
    shard_id: str,
    sources: Sequence[str],
    *,
    min_txn_s: float = 0.0,
    max_txn_s: float = 0.2,
    disable_wait_for_ack: bool = True,
) -> cpb.ShardSpec:
    def duration(seconds: float) -> Duration:
        # Through whole nanoseconds: splitting the float into seconds and a rounded fraction
        # can give nanos == 1e9 (0.9999999999s), or mixed signs for a negative value.
        out = Duration()
        out.FromNanoseconds(round(seconds * 1e9))
        return out

    return cpb.ShardSpec(
        id=shard_id,
        sources=[cpb.ShardSpec.Source(journal=j) for j in sorted(sources)],
        min_txn_duration=duration(min_txn_s),
        max_txn_duration=duration(max_txn_s),
        disable_wait_for_ack=disable_wait_for_ack,
    )


# --- SQL ----------------------------------------------------------------------------------------

_metadata = sa.MetaData()
COUNTS = sa.Table(
    "shard_test_counts",
    _metadata,
    sa.Column("shard", sa.Text, primary_key=True),
    sa.Column("key", sa.Text, primary_key=True),
    sa.Column("n", sa.Integer, nullable=False),
)


async def prepare_engine(engine: Engine) -> Engine:
    await create_checkpoints_table(engine)
    await asyncio.to_thread(COUNTS.create, engine, checkfirst=True)
    return engine


@contextlib.asynccontextmanager
async def sqlite_engine(path: Path) -> AsyncIterator[Engine]:
    engine = create_sqlite_engine(path / "shards.db")
    try:
        yield await prepare_engine(engine)
    finally:
        engine.dispose()


@contextlib.asynccontextmanager
async def shard_env(
    tmp_path: Path,
) -> AsyncIterator[tuple[BrokerEnv, Engine, AppendService]]:
    """What most shard tests run in: an in-process broker (`broker_env`), a SQLite database
    under `tmp_path` and an AppendService of the broker's client."""
    async with (
        broker_env() as env,
        sqlite_engine(tmp_path) as engine,
        AppendService(env.client) as appends,
    ):
        yield env, engine, appends


@contextlib.asynccontextmanager
async def pg_engine(pg_url: str) -> AsyncIterator[Engine]:
    """An engine on a database created for this test alone, dropped afterwards."""
    name = f"shards_{uuid.uuid4().hex[:16]}"
    admin = sa.create_engine(pg_url, isolation_level="AUTOCOMMIT")

    def ddl(statement: str) -> None:
        with admin.connect() as connection:
            connection.exec_driver_sql(statement)

    await asyncio.to_thread(ddl, f'CREATE DATABASE "{name}"')
    engine = sa.create_engine(
        sa.make_url(pg_url).set(database=name),
        connect_args={"options": "-c lock_timeout=20000"},
    )
    try:
        yield await prepare_engine(engine)
    finally:
        engine.dispose()
        await asyncio.to_thread(ddl, f'DROP DATABASE "{name}" WITH (FORCE)')
        admin.dispose()


def _reader(engine: Engine) -> Engine:
    # SQLite engines of create_sqlite_engine take the write lock even to read; a plain engine
    # on the same file reads a WAL snapshot instead.
    if engine.dialect.name == "sqlite":
        return sa.create_engine(engine.url)
    return engine


def _query(engine: Engine, fn: Callable[[Connection], Any]) -> Any:
    reader = _reader(engine)
    try:
        with reader.connect() as connection:
            return fn(connection)
    finally:
        if reader is not engine:
            reader.dispose()


async def read_counts(engine: Engine, shard: str) -> dict[str, int]:
    def fn(connection: Connection) -> dict[str, int]:
        rows = connection.execute(
            sa.select(COUNTS.c.key, COUNTS.c.n).where(COUNTS.c.shard == shard)
        )
        return {row.key: int(row.n) for row in rows}

    result: dict[str, int] = await asyncio.to_thread(_query, engine, fn)
    return result


async def read_checkpoint(engine: Engine, fqn: str) -> Checkpoint | None:
    def fn(connection: Connection) -> bytes | None:
        value = connection.execute(
            sa.text("SELECT checkpoint FROM gazette_checkpoints WHERE shard_fqn = :fqn"),
            {"fqn": fqn},
        ).scalar()
        return None if value is None else bytes(value)

    data = await asyncio.to_thread(_query, engine, fn)
    return None if data is None else decode_checkpoint(data)


def _add_counts(connection: Connection, shard: str, counts: dict[str, int]) -> None:
    for key, n in sorted(counts.items()):
        # One statement for SQLite and PostgreSQL: both have ON CONFLICT ... DO UPDATE.
        connection.execute(
            sa.text(
                "INSERT INTO shard_test_counts (shard, key, n) VALUES (:shard, :key, :n) "
                "ON CONFLICT (shard, key) DO UPDATE SET n = shard_test_counts.n + excluded.n"
            ),
            {"shard": shard, "key": key, "n": n},
        )


# --- Stores -------------------------------------------------------------------------------------


class GatedStore:
    """A Store that wraps another and holds its first `hold` commits until the test releases
    them.

    Commit i (from 0) waits, besides its own `wait_for`, on `gates[i]` (already resolved for
    i >= hold); `started` is notified as each commit starts. The rest is the wrapped store's.
    """

    def __init__(self, inner: SQLStore, hold: int) -> None:
        self.inner = inner
        self.hold = hold
        self.gates: list[asyncio.Future[None]] = []
        self.commits: list[OpFuture] = []
        self.wait_fors: list[list[Awaitable[object]]] = []
        # For each commit, which earlier commits had resolved when it started.
        self.done_at_start: list[tuple[bool, ...]] = []
        self.started = Notifier()

    async def run(self, fn: Callable[[Connection], Any]) -> Any:
        return await self.inner.run(fn)

    async def restore_checkpoint(self, shard: ShardContext) -> Checkpoint:
        return await self.inner.restore_checkpoint(shard)

    async def start_commit(
        self, shard: ShardContext, checkpoint: Checkpoint, wait_for: Sequence[Awaitable[object]]
    ) -> OpFuture:
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if len(self.gates) >= self.hold:
            gate.set_result(None)
        self.gates.append(gate)
        self.wait_fors.append(list(wait_for))
        self.done_at_start.append(tuple(c.done() for c in self.commits))
        commit = await self.inner.start_commit(shard, checkpoint, [*wait_for, gate])
        self.commits.append(commit)
        self.started.notify()
        return commit

    def release(self, index: int) -> None:
        self.gates[index].set_result(None)

    async def destroy(self) -> None:
        for gate in self.gates:
            if not gate.done():
                gate.cancel()
        await self.inner.destroy()


class Notifier:
    """Wakes waiters whenever something changed; `until` re-checks a condition on each change."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()

    async def until(self, predicate: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
        async with asyncio.timeout(timeout_s):
            while not predicate():
                await self._event.wait()

    async def read_through(self, handle: ShardHandle, journal: str, end: int) -> None:
        """Until `handle`'s shard has read `journal` through `end`."""
        await self.until(lambda: handle.progress().read_through.get(journal, 0) >= end)


# --- The counting Application -------------------------------------------------------------------


class PoisonError(ValueError):
    """The counting app refuses a message whose text starts with "poison"."""


@dataclass
class CountingApp(Application):
    """Counts messages per key into SQL, exactly once; optionally publishes a derived message
    (same key, the source UUID as text) to `output` for each one.

    Counts are aggregated in memory per transaction and written in `finalize_txn`, as Gazette
    applications do. Hooks for tests: `consumed` records (shard id, text, commits done so far
    of a GatedStore); `events` is notified on every consume and finished transaction.
    """

    engine: Engine
    output: str | None = None
    hold_commits: int = 0  # If > 0, stores are GatedStores holding this many commits.
    consumed: list[tuple[str, str, tuple[bool, ...]]] = field(default_factory=list)
    consumed_total: int = 0
    commits_begun: int = 0
    begins: int = 0
    finishes: list[OpFuture] = field(default_factory=list)
    stores: dict[str, Any] = field(default_factory=dict)
    events: Notifier = field(default_factory=Notifier)
    _pending: dict[str, Counter[str]] = field(default_factory=dict)

    async def new_store(self, shard: Shard, recorder: object | None) -> Store:
        store: Any = SQLStore(self.engine)
        if self.hold_commits:
            store = GatedStore(store, self.hold_commits)
        self.stores[shard.id] = store
        self._pending[shard.fqn] = Counter()
        result: Store = store
        return result

    def new_message(self, journal_spec: pb.JournalSpec) -> type[Any]:
        return Event

    async def begin_txn(self, shard: Shard, store: Store) -> None:
        self.begins += 1

    async def consume_message(
        self, shard: Shard, store: Store, envelope: Envelope[Any], publisher: Publisher[AsyncAppend]
    ) -> None:
        message: Event = envelope.message
        commits = getattr(store, "commits", [])
        self.consumed.append((shard.id, message.text, tuple(c.done() for c in commits)))
        self.consumed_total += 1
        self.events.notify()
        if message.text.startswith("poison"):
            raise PoisonError(f"refusing message {message.text!r}")
        self._pending[shard.fqn][message.key] += 1
        if self.output is not None:
            derived = Event(key=message.key, text=str(envelope.uuid))
            output = self.output
            await publisher.publish_uncommitted(
                lambda _m: Partition(output, CONTENT_TYPE_JSON_LINES), derived
            )

    async def finalize_txn(
        self, shard: Shard, store: Store, publisher: Publisher[AsyncAppend]
    ) -> None:
        pending, self._pending[shard.fqn] = dict(self._pending[shard.fqn]), Counter()
        if pending:
            run = getattr(store, "run")  # noqa: B009 -- SQLStore or GatedStore.
            await run(lambda connection: _add_counts(connection, shard.id, pending))

    def finished_txn(self, shard: Shard, store: Store, commit: OpFuture) -> None:
        self.finishes.append(commit)
        self.events.notify()


# --- Producers ----------------------------------------------------------------------------------


def to(journal: str) -> Callable[[Any], Partition]:
    return lambda _message: Partition(journal, CONTENT_TYPE_JSON_LINES)


class Producer:
    """An input producer over its own AppendService: committed messages, transactions that are
    acknowledged or rolled back, and duplicates (a message's frame appended again right after
    it, as a retried append does). `expected` counts what a read-committed reader must see."""

    def __init__(self, appends: AppendService, name: str) -> None:
        self.appends = appends
        self.publisher: Publisher[AsyncAppend] = Publisher(appends)
        self.name = name
        self.expected: Counter[str] = Counter()
        self._open: Counter[str] = Counter()
        self._open_journals: set[str] = set()
        self._last_acks: dict[str, bytes] = {}
        self._serial = 0

    def _event(self, key: str) -> Event:
        self._serial += 1
        return Event(key=key, text=f"{self.name}-{self._serial}")

    async def _duplicate(self, journal: str, message: Event) -> None:
        appended = await self.appends.start_append(journal)
        appended.write(JSON.marshal(message))
        appended.release()

    async def committed(self, journal: str, key: str, *, duplicate: bool = False) -> AsyncAppend:
        message = self._event(key)
        appended = await self.publisher.publish_committed(to(journal), message)
        if duplicate:
            await self._duplicate(journal, message)
        self.expected[key] += 1
        return appended

    async def committed_together(self, journal: str, messages: Sequence[Event]) -> AsyncAppend:
        """Committed messages in one append (so a reader reads them in one chunk)."""
        appended = await self.appends.start_append(journal)
        for message in messages:
            message.set_uuid(self.publisher.sequence_uuid(Flag.OUTSIDE_TXN))
            appended.write(JSON.marshal(message))
            self.expected[message.key] += 1
        appended.release()
        return appended

    async def uncommitted(self, journal: str, key: str, *, duplicate: bool = False) -> None:
        message = self._event(key)
        await self.publisher.publish_uncommitted(to(journal), message)
        if duplicate:
            await self._duplicate(journal, message)
        self._open[key] += 1
        self._open_journals.add(journal)

    async def acknowledge(self) -> list[AsyncAppend]:
        intents = self.publisher.build_ack_intents()
        self._last_acks.update(intents)
        self.expected.update(self._open)
        self._open.clear()
        self._open_journals.clear()
        return await self.publisher.write_ack_intents(intents)

    def can_roll_back(self) -> bool:
        """Whether every journal of the open transaction had an earlier ACK to re-send."""
        return bool(self._open_journals) and self._open_journals <= self._last_acks.keys()

    async def roll_back(self) -> list[AsyncAppend]:
        """Re-append the last ACK of each journal of the open transaction: readers roll the
        open transaction back (as a restarted consumer's recovery does)."""
        assert self.can_roll_back()
        self.publisher.build_ack_intents()  # Forget the open transaction's intents.
        journals, self._open_journals = sorted(self._open_journals), set()
        self._open.clear()
        return await self.publisher.write_ack_intents(
            {journal: self._last_acks[journal] for journal in journals}
        )


def journal_frames(broker: Broker, journal: str) -> list[Event]:
    """The messages a broker holds of `journal`, raw (read-uncommitted, duplicates and ACKs
    included), from its local fragments."""
    _, content = local_content(broker, journal)
    return [msgspec.json.decode(line, type=Event) for line in content.splitlines() if line]


async def read_committed(
    client: JournalClient,
    journal: str,
    *,
    until_text: str | None = None,
    until_count: int | None = None,
) -> list[Envelope[Any]]:
    """Committed messages of `journal` from its start, up to the one with `until_text` or
    until `until_count` were read."""
    out: list[Envelope[Any]] = []
    async with ReadCommittedIter(client, {journal: 0}, message_type=Event) as it:
        async with asyncio.timeout(WAIT_S):
            while True:
                envelope = await it.next()
                out.append(envelope)
                if envelope.message.text == until_text or len(out) == until_count:
                    return out
