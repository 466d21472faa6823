"""The summer: a consumer Application folding chunks into per-stream sums, exactly once.

Each shard reads `Chunk`s from its source journals, folds each into its stream's state
(`messages.fold`, which raises `SequenceViolation` on any chunk out of sequence: the shard then
fails, and its status names the stream, the expected and the observed chunk), and when a
stream ends publishes its `Sum` (uncommitted: it is acknowledged with the transaction) to the
sums journal. Stream states and the checkpoint commit together, in the shard's store:

- shard label ``stream-sum.example/store: postgres``: a fenced `SQLStore` over the PostgreSQL
  database named by ``$STREAM_SUM_PG_URL`` (table ``stream_sums``, created if missing);
- ``stream-sum.example/store: rocksdb``: a `RocksDBStore` recorded into the shard's recovery
  log (the spec needs ``recovery_log_prefix``; give it ``hot_standbys`` for a standby that
  tails the log and takes over at once).

Shard label ``stream-sum.example/sums`` names the sums journal.

As in examples/counter, a transaction reads a stream's state from the store once per shard
assignment and keeps it in memory while it changes (a pipelined transaction must not read
state its predecessor has not committed yet: PostgreSQL would show the old rows), writing the
streams it changed in `finalize_txn`. A stream that ended leaves the cache once the commit that
wrote its end is durable (`finished_txn`), so the cache holds the open streams only.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from broker.client.async_append import AsyncAppend
from broker.protocol import protocol_pb2 as pb
from examples.stream_sum.messages import Chunk, StreamState, Sum, fold
from gazette_consumer.application import Application, Shard
from gazette_consumer.message import CONTENT_TYPE_JSON_LINES, Partition
from gazette_consumer.message.message import Envelope
from gazette_consumer.message.publisher import Publisher
from gazette_consumer.recoverylog.recorder import Recorder
from gazette_consumer.stores.base import OpFuture, Store
from gazette_consumer.stores.rocksdb import RocksDBStore
from gazette_consumer.stores.sql import SQLStore, checkpoints_table

__all__ = ["PG_URL_ENV", "STORE_LABEL", "SUMS_LABEL", "Summer", "SummerConfigError"]

PG_URL_ENV: Final = "STREAM_SUM_PG_URL"
STORE_LABEL: Final = "stream-sum.example/store"
SUMS_LABEL: Final = "stream-sum.example/sums"
STORE_POSTGRES: Final = "postgres"
STORE_ROCKSDB: Final = "rocksdb"
_ROCKS_PREFIX: Final = b"stream/"

_metadata = sa.MetaData()
SUMS_TABLE = sa.Table(
    "stream_sums",
    _metadata,
    sa.Column("shard", sa.Text, primary_key=True),
    sa.Column("stream", sa.Text, primary_key=True),
    sa.Column("seq", sa.BigInteger, nullable=False),
    sa.Column("value", sa.BigInteger, nullable=False),
    sa.Column("done", sa.Boolean, nullable=False),
)
_CHECKPOINTS = checkpoints_table(metadata=_metadata)


class SummerConfigError(ValueError):
    """A shard the summer cannot run: a missing or unknown label, or a missing setting."""


@dataclass
class _ShardState:
    """One shard assignment's in-memory state (see the module docstring)."""

    sums: Callable[[Any], Partition]
    streams: dict[str, StreamState] = field(default_factory=dict)
    changed: set[str] = field(default_factory=set)  # Streams the open transaction changed.
    ended: list[str] = field(default_factory=list)  # Streams it ended.


class Summer(Application):
    """The summer (see the module docstring): ``gazette-consumer serve --app
    examples.stream_sum:Summer ...``."""

    def __init__(self) -> None:
        self._engine: Engine | None = None
        self._schema_lock = threading.Lock()
        self._shards: dict[str, _ShardState] = {}

    async def new_store(self, shard: Shard, recorder: Recorder | None) -> Store:
        kind = _label(shard, STORE_LABEL)
        sums = _label(shard, SUMS_LABEL)
        if not sums:
            raise SummerConfigError(f"shard {shard.id}: label {SUMS_LABEL} must name a journal")
        store: Store
        if kind == STORE_ROCKSDB:
            if recorder is None:
                raise SummerConfigError(
                    f"shard {shard.id}: a rocksdb store needs the spec's recovery_log_prefix"
                )
            store = RocksDBStore.recorded(recorder)
        elif kind == STORE_POSTGRES:
            engine = self._pg_engine(shard)
            await asyncio.to_thread(self._create_tables, engine)
            store = SQLStore(engine)
        else:
            raise SummerConfigError(
                f"shard {shard.id}: label {STORE_LABEL} must be {STORE_POSTGRES!r} or"
                f" {STORE_ROCKSDB!r} (got {kind!r})"
            )
        partition = Partition(sums, CONTENT_TYPE_JSON_LINES)
        self._shards[shard.fqn] = _ShardState(sums=lambda _message: partition)
        return store

    def new_message(self, journal_spec: pb.JournalSpec) -> type[Any]:
        return Chunk

    async def consume_message(
        self, shard: Shard, store: Store, envelope: Envelope[Any], publisher: Publisher[AsyncAppend]
    ) -> None:
        chunk: Chunk = envelope.message
        state = self._shards[shard.fqn]
        current = state.streams.get(chunk.stream)
        if current is None:
            current = await _load(store, shard.id, chunk.stream)
        after = fold(current, chunk)  # SequenceViolation fails the shard, naming the stream.
        state.streams[chunk.stream] = after
        state.changed.add(chunk.stream)
        if after.done:
            state.ended.append(chunk.stream)
            total = Sum(stream=chunk.stream, seq=after.seq, value=after.value)
            await publisher.publish_uncommitted(state.sums, total)

    async def finalize_txn(
        self, shard: Shard, store: Store, publisher: Publisher[AsyncAppend]
    ) -> None:
        state = self._shards[shard.fqn]
        if not state.changed:
            return
        rows = {stream: state.streams[stream] for stream in sorted(state.changed)}
        state.changed = set()
        if isinstance(store, RocksDBStore):
            for stream, value in rows.items():
                store.put(_ROCKS_PREFIX + stream.encode(), value.encode())
        else:
            await _sql(store).run(lambda c: _write_sql(c, shard.id, rows))

    def finished_txn(self, shard: Shard, store: Store, commit: OpFuture) -> None:
        state = self._shards.get(shard.fqn)
        if state is None or not state.ended:
            return
        ended, state.ended = state.ended, []

        def forget(future: OpFuture) -> None:
            # Once durable, an ended stream is read from the store if it ever shows up again
            # (which `fold` refuses); until then the cache must keep it.
            if not future.cancelled() and future.exception() is None:
                for stream in ended:
                    cached = state.streams.get(stream)
                    if cached is not None and cached.done:
                        del state.streams[stream]

        commit.add_done_callback(forget)

    # --- PostgreSQL ----------------------------------------------------------------------------

    def _pg_engine(self, shard: Shard) -> Engine:
        if self._engine is None:
            url = os.environ.get(PG_URL_ENV)
            if not url:
                raise SummerConfigError(
                    f"shard {shard.id}: a postgres store needs ${PG_URL_ENV} (a SQLAlchemy URL)"
                )
            # pool_pre_ping: a database restarted since a connection was pooled is noticed
            # when the connection is checked out, not by the transaction that uses it.
            self._engine = sa.create_engine(url, pool_pre_ping=True)
        return self._engine

    def _create_tables(self, engine: Engine) -> None:
        with self._schema_lock:
            _metadata.create_all(engine, checkfirst=True)


async def _load(store: Store, shard: str, stream: str) -> StreamState:
    if isinstance(store, RocksDBStore):
        data = store.get(_ROCKS_PREFIX + stream.encode())
        return StreamState() if data is None else StreamState.decode(data)
    return await _sql(store).run(lambda c: _read_sql(c, shard, stream))


def _sql(store: Store) -> SQLStore:
    if not isinstance(store, SQLStore):
        raise TypeError(f"the summer needs a SQLStore or RocksDBStore (got {type(store).__name__})")
    return store


def _read_sql(connection: Connection, shard: str, stream: str) -> StreamState:
    t = SUMS_TABLE
    row = connection.execute(
        sa.select(t.c.seq, t.c.value, t.c.done).where(t.c.shard == shard, t.c.stream == stream)
    ).first()
    return StreamState() if row is None else StreamState(int(row.seq), int(row.value), row.done)


def _write_sql(connection: Connection, shard: str, rows: dict[str, StreamState]) -> None:
    connection.execute(
        sa.text(
            "INSERT INTO stream_sums (shard, stream, seq, value, done)"
            " VALUES (:shard, :stream, :seq, :value, :done)"
            " ON CONFLICT (shard, stream) DO UPDATE"
            " SET seq = excluded.seq, value = excluded.value, done = excluded.done"
        ),
        [
            {"shard": shard, "stream": s, "seq": v.seq, "value": v.value, "done": v.done}
            for s, v in rows.items()
        ],
    )


def _label(shard: Shard, name: str) -> str:
    values = shard.labels.get(name)
    return values[0] if values else ""
