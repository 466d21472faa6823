"""A counting consumer application: exactly-once counts per key in SQL, and a derived stream.

Input: JSON lines ``{"key": "...", "n": 3}`` (``n`` defaults to 1) in the shard's source
journals, published by Gazette Publishers (each carries its ``"UUID"``). For each message the
shard adds ``n`` to the key's count in its store, and, if the shard has an output journal,
publishes a `Counted` message ``{"key", "total", "source"}`` to it: the key's new total and the
UUID of the message that caused it. Counts and the checkpoint commit in one SQL transaction;
derived messages are published uncommitted and acknowledged only once that transaction
commits, so a read-committed reader of the output sees each update exactly once, however often
the consumer crashes and re-runs a transaction.

Configuration:

- ``COUNTER_DB_URL``: a SQLAlchemy URL (``postgresql+psycopg://user@host/db``) shared by every
  shard of the process. Unset: each shard keeps a SQLite file of its own,
  ``$COUNTER_DATA_DIR/<shard id>.sqlite`` (``COUNTER_DATA_DIR`` defaults to ``counter-data``).
  A shard label ``counter.example/db-url-env`` names another environment variable holding the
  URL of that shard's database (labels cannot hold URLs: ``:`` is not a label character).
- Shard label ``counter.example/output``: the journal derived messages go to (none: no output).

Tables (created if missing): Gazette's ``gazette_checkpoints`` and
``counter_counts(shard, key, n)``. Counts are kept per shard (its ShardSpec ID).

The running totals a transaction publishes come from an in-memory cache of the counts,
filled per key from SQL on first use after the shard's store was restored (so after the fence:
a zombie can no longer change what is read) and updated as messages are consumed; the
transaction writes the totals it changed in `finalize_txn`. A failed transaction fails the
shard, and its next assignment starts with a fresh cache.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from broker.client.async_append import AsyncAppend
from broker.protocol import protocol_pb2 as pb
from gazette_consumer.application import Application, Shard
from gazette_consumer.message import CONTENT_TYPE_JSON_LINES, JSONMessage, Partition
from gazette_consumer.message.message import Envelope
from gazette_consumer.message.publisher import Publisher
from gazette_consumer.stores.base import Store
from gazette_consumer.stores.sql import (
    SQLStore,
    checkpoints_table,
    create_sqlite_engine,
)

__all__ = ["COUNTS", "Count", "Counted", "Counter", "read_counts"]

DB_URL_ENV = "COUNTER_DB_URL"
DATA_DIR_ENV = "COUNTER_DATA_DIR"
DATA_DIR_DEFAULT = "counter-data"
DB_URL_ENV_LABEL = "counter.example/db-url-env"
OUTPUT_LABEL = "counter.example/output"


class Count(JSONMessage, kw_only=True):
    """An input message: add `n` to `key`'s count."""

    key: str = ""
    n: int = 1


class Counted(JSONMessage, kw_only=True):
    """A derived message: `key` reached `total` through the input message `source` (its UUID)."""

    key: str = ""
    total: int = 0
    source: str = ""


_metadata = sa.MetaData()
COUNTS = sa.Table(
    "counter_counts",
    _metadata,
    sa.Column("shard", sa.Text, primary_key=True),
    sa.Column("key", sa.Text, primary_key=True),
    sa.Column("n", sa.BigInteger, nullable=False),
)
_CHECKPOINTS = checkpoints_table(metadata=_metadata)


@dataclass
class _ShardState:
    """What one shard's current assignment keeps in memory (see the module docstring)."""

    totals: dict[str, int] = field(default_factory=dict)  # Committed or staged, per key.
    changed: set[str] = field(default_factory=set)  # Keys this transaction changed.
    output: Callable[[Any], Partition] | None = None


class Counter(Application):
    """The counting application (see the module docstring). Run it with::

    gazette-consumer serve --app examples.counter:Counter ...
    """

    def __init__(self, *, data_dir: str | os.PathLike[str] | None = None) -> None:
        # Where SQLite files go; None: $COUNTER_DATA_DIR, read when a shard first needs it.
        self._data_dir = data_dir
        self._engines: dict[str, Engine] = {}
        # Engines are created from the event loop only; the lock guards table creation, which
        # runs in a store's worker thread.
        self._schema_lock = threading.Lock()
        self._shards: dict[str, _ShardState] = {}

    # --- Stores --------------------------------------------------------------------------------

    def _engine(self, shard: Shard) -> Engine:
        env = _label(shard, DB_URL_ENV_LABEL) or DB_URL_ENV
        url = os.environ.get(env)
        if url is None and env != DB_URL_ENV:
            raise ValueError(f"shard {shard.id}: {DB_URL_ENV_LABEL} names ${env}, which is not set")
        if url:
            key = url
        else:
            data_dir = Path(self._data_dir or os.environ.get(DATA_DIR_ENV, DATA_DIR_DEFAULT))
            data_dir.mkdir(parents=True, exist_ok=True)
            key = str(data_dir / f"{shard.id.replace('/', '_')}.sqlite")
        engine = self._engines.get(key)
        if engine is None:
            engine = sa.create_engine(url) if url else create_sqlite_engine(key)
            self._engines[key] = engine
        return engine

    async def new_store(self, shard: Shard, recorder: object | None) -> Store:
        engine = self._engine(shard)
        store = SQLStore(engine)
        output = _label(shard, OUTPUT_LABEL)
        self._shards[shard.fqn] = _ShardState(
            output=None if output is None else _to(output),
        )
        # Tables first: the restore that follows needs the checkpoints table.
        await _create_tables(engine, self._schema_lock)
        return store

    def new_message(self, journal_spec: pb.JournalSpec) -> type[Any]:
        return Count

    # --- Transactions --------------------------------------------------------------------------

    async def consume_message(
        self, shard: Shard, store: Store, envelope: Envelope[Any], publisher: Publisher[AsyncAppend]
    ) -> None:
        message: Count = envelope.message
        state = self._shards[shard.fqn]
        total = state.totals.get(message.key)
        if total is None:
            total = await _sql(store).run(lambda c: _read_count(c, shard.id, message.key))
        total += message.n
        state.totals[message.key] = total
        state.changed.add(message.key)
        if state.output is not None:
            derived = Counted(key=message.key, total=total, source=str(envelope.uuid))
            await publisher.publish_uncommitted(state.output, derived)

    async def finalize_txn(
        self, shard: Shard, store: Store, publisher: Publisher[AsyncAppend]
    ) -> None:
        state = self._shards[shard.fqn]
        if not state.changed:
            return
        rows = {key: state.totals[key] for key in sorted(state.changed)}
        state.changed = set()
        await _sql(store).run(lambda c: _write_counts(c, shard.id, rows))


# --- SQL helpers ----------------------------------------------------------------------------------


async def _create_tables(engine: Engine, lock: threading.Lock) -> None:
    def create() -> None:
        with lock:
            _metadata.create_all(engine, checkfirst=True)

    await asyncio.to_thread(create)


def _sql(store: Store) -> SQLStore:
    if not isinstance(store, SQLStore):
        raise TypeError(f"the counter needs a SQLStore (got {type(store).__name__})")
    return store


def _read_count(connection: Connection, shard: str, key: str) -> int:
    n = connection.execute(
        sa.select(COUNTS.c.n).where(COUNTS.c.shard == shard, COUNTS.c.key == key)
    ).scalar()
    return 0 if n is None else int(n)


def _write_counts(connection: Connection, shard: str, rows: dict[str, int]) -> None:
    # Absolute totals: the cache holds the committed count plus this transaction's changes.
    # ON CONFLICT ... DO UPDATE works on SQLite and PostgreSQL alike.
    connection.execute(
        sa.text(
            "INSERT INTO counter_counts (shard, key, n) VALUES (:shard, :key, :n) "
            "ON CONFLICT (shard, key) DO UPDATE SET n = excluded.n"
        ),
        [{"shard": shard, "key": key, "n": n} for key, n in rows.items()],
    )


def read_counts(engine: Engine, shard: str) -> dict[str, int]:
    """A shard's committed counts (blocking; for tools and tests)."""
    with engine.connect() as connection:
        rows = connection.execute(
            sa.select(COUNTS.c.key, COUNTS.c.n).where(COUNTS.c.shard == shard)
        )
        return {row.key: int(row.n) for row in rows}


def _label(shard: Shard, name: str) -> str | None:
    values = shard.labels.get(name)
    return values[0] if values else None


def _to(journal: str) -> Callable[[Any], Partition]:
    partition = Partition(journal, CONTENT_TYPE_JSON_LINES)
    return lambda _message: partition
