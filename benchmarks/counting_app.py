"""The counting Application of `bench_consumer.py`, in its exactly-once and at-least-once forms.

`CountApp` counts messages per key in memory (`consume_message`: one dict update) and writes
the counts in `finalize_txn` (one upsert per key touched), publishing a `Summary` per
transaction (or a `Derived` message per message — held, then published a batch at a time —,
the message itself per message — `relay`, the first shard of a chain — or nothing). Exactly-once, it reads the default source
(read-committed) and commits through a `CountingSQLStore` with the checkpoint; at-least-once,
it reads an `UncommittedSource` and writes through a `NoCheckpointStore`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from bench_messages import Reading
from sqlalchemy.engine import Connection, Engine

from broker import client
from broker.client.append_service import AsyncAppend
from broker.client.list_apply import get_journal
from broker.client.retry_reader import RetryReader
from broker.protocol import protocol_pb2 as pb
from gazette_consumer.application import Application, MessageSource, Shard
from gazette_consumer.checkpoint import Checkpoint
from gazette_consumer.message import CONTENT_TYPE_JSON_LINES, JSONMessage, Partition, Publisher
from gazette_consumer.message.message import Envelope
from gazette_consumer.sequencer.decode import ChunkDecoder, new_chunk_decoder
from gazette_consumer.sequencer.read_channel import ReadChannel
from gazette_consumer.sequencer.read_pieces import DECODE_PIECE_BYTES
from gazette_consumer.sequencer.types import FLAG_ACK_TXN, SequencerCheckpoint
from gazette_consumer.stores.base import OpFuture, ShardContext
from gazette_consumer.stores.sql import SQLStore, create_checkpoints_table

SOURCE = "bench/consumer-source"
OUTPUT = "bench/consumer-output"
# The output of a chain's first shard (relaying SOURCE), which its second shard reads.
CHAIN = "bench/consumer-chain"
READ_AHEAD_CHUNKS = 16  # As ReadCommittedIter's default read channel.
# Derived messages (`--publish per-message`) held before they are published at once. Fewer
# than the garbage collector's young generation (700 allocations): the UUIDs a batch publish
# sets (GC-tracked) then die young, where 4096 at a time reached the old generation (gc 14-20%
# of the shard's CPU, measured).
DERIVED_BATCH_MAX = 256

_metadata = sa.MetaData()
COUNTS = sa.Table(
    "bench_counts",
    _metadata,
    sa.Column("shard", sa.Text, primary_key=True),
    sa.Column("key", sa.Text, primary_key=True),
    sa.Column("n", sa.BigInteger, nullable=False),
)
_UPSERT = sa.text(
    "INSERT INTO bench_counts (shard, key, n) VALUES (:shard, :key, :n) "
    "ON CONFLICT (shard, key) DO UPDATE SET n = bench_counts.n + excluded.n"
)


class Summary(JSONMessage, kw_only=True):
    """What a transaction publishes: how many messages and keys it counted."""

    shard: str = ""
    messages: int = 0
    keys: int = 0


class Derived(JSONMessage, kw_only=True, gc=False):
    """What `--publish per-message` publishes for each message counted. Untracked by the
    garbage collector (it holds no containers): a transaction holds thousands of them until
    they are published (see `CountApp.consume_message`)."""

    sensor: str = ""
    sequence: int = 0


def _write_counts(connection: Connection, shard: str, counts: Mapping[str, int]) -> None:
    connection.execute(_UPSERT, [{"shard": shard, "key": k, "n": n} for k, n in counts.items()])


# --- Stores -------------------------------------------------------------------------------------


class CountingSQLStore(SQLStore):
    """Exactly-once: the counts are staged in the store's transaction, which commits them with
    the checkpoint. `counts` is the open transaction's in-memory aggregate."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.counts: dict[str, int] = {}

    async def write_counts(self, shard: str, counts: Mapping[str, int]) -> None:
        await self.run(lambda connection: _write_counts(connection, shard, counts))


class NoCheckpointStore:
    """At-least-once: no checkpoint and no fence. The counts go to the same database, each
    transaction's in a SQL transaction of its own, committed while the next transaction reads
    (as `SQLStore` pipelines exactly-once's commits): `write_counts` starts the write, after
    the previous one finished, and the transaction's commit resolves once it did."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.counts: dict[str, int] = {}
        self._write: asyncio.Future[None] | None = None  # Started, not yet in a commit.
        self._last: asyncio.Future[None] | None = None  # The write started last.

    async def write_counts(self, shard: str, counts: Mapping[str, int]) -> None:
        def write() -> None:
            with self._engine.begin() as connection:
                _write_counts(connection, shard, counts)

        if self._last is not None:
            await self._last  # One at a time, in order (SQLite has a single writer).
        # Awaited by the commit's future, which reports its failure.
        self._write = self._last = asyncio.ensure_future(asyncio.to_thread(write))

    async def restore_checkpoint(self, shard: ShardContext) -> Checkpoint:
        return Checkpoint()

    async def start_commit(
        self, shard: ShardContext, checkpoint: Checkpoint, wait_for: Sequence[Awaitable[object]]
    ) -> OpFuture:
        # Nothing to commit but the counts' write; resolved once it and the transaction's
        # appends landed, so that progress (and the end of a run) means its output is
        # written, as in exactly-once.
        write, self._write = self._write, None

        async def appended() -> None:
            if write is not None:
                await write
            for append in wait_for:
                await append

        return asyncio.ensure_future(appended())

    async def destroy(self) -> None:
        if self._last is not None:  # Its thread finishes first; a failure was the commit's.
            with contextlib.suppress(Exception):
                await self._last


# --- A read-uncommitted source ------------------------------------------------------------------


class _Chunk:
    __slots__ = ("at", "content", "offset")

    def __init__(self, content: bytes, offset: int) -> None:
        self.content, self.offset, self.at = content, offset, 0


class UncommittedSource:
    """A `MessageSource` of one journal, read-uncommitted: every message as read, with no
    Sequencer. Read-ahead, decoding and handing out as `ReadCommittedIter` does them (chunks
    read ahead undecoded by a background reader, decoded DECODE_PIECE_BYTES at a time as
    needed, a decoded piece handed out by `pop()` from a reversed list), so that the two
    sources differ only by what read-committed adds."""

    def __init__(
        self,
        journal_client: client.JournalClient | None,
        journal: str,
        offset: int,
        *,
        read_ahead_chunks: int = READ_AHEAD_CHUNKS,
    ) -> None:
        """A source reading `journal` through `journal_client`; without one, a source of the
        chunks given to `put_chunk` (bench_read_paths.py)."""
        self._journal = journal
        self._channel: ReadChannel[_Chunk] = ReadChannel(read_ahead_chunks)
        # The piece being handed out (ACKs left out), its messages not returned yet (reversed),
        # and the end of its last message, ACKs included.
        self._piece: list[Envelope[Any]] = []
        self._ready: list[Envelope[Any]] = []
        self._before_piece = self._piece_end = offset
        self._chunk: _Chunk | None = None
        self._decoder: ChunkDecoder | None = None
        self._reader: asyncio.Task[None] | None = None
        if journal_client is not None:
            self._reader = asyncio.get_running_loop().create_task(
                self._read(journal_client, offset)
            )

    async def put_chunk(self, decoder: ChunkDecoder, content: bytes, offset: int) -> None:
        """Queue a chunk as the reader would (a source without a client)."""
        self._decoder = decoder
        await self._channel.put(_Chunk(content, offset))

    async def _read(self, journal_client: client.JournalClient, offset: int) -> None:
        request = pb.ReadRequest(journal=self._journal, offset=offset, block=True)
        reader = RetryReader(journal_client, request)
        try:
            spec = await get_journal(journal_client, self._journal)
            self._decoder = new_chunk_decoder(spec, offset, Reading)
            while True:
                chunk = await reader.read_chunk()
                await self._channel.put(_Chunk(chunk.content, chunk.offset))
        except Exception as err:
            self._channel.fail(err)
        finally:
            await reader.close()

    def try_next(self) -> Envelope[Any] | None:
        ready = self._ready
        if ready:
            return ready.pop()
        while True:
            chunk = self._chunk
            if chunk is None:
                chunk = self._chunk = self._channel.get_nowait()
                if chunk is None:
                    return None
            decoder = self._decoder
            assert decoder is not None  # Set before the first chunk is put.
            at = chunk.at
            piece = chunk.content[at : at + DECODE_PIECE_BYTES]
            chunk.at = at + len(piece)
            if chunk.at == len(chunk.content):
                self._chunk = None
            envs = decoder.feed(piece, chunk.offset + at)
            if envs:
                self._before_piece, self._piece_end = self._piece_end, envs[-1].end
                if decoder.lead_run != len(envs):  # Not all OUTSIDE_TXN: drop any ACK.
                    envs = [env for env in envs if env.flags != FLAG_ACK_TXN]
                self._piece, self._ready = envs, envs[::-1]
            if decoder.error is not None:
                raise decoder.error
            if self._ready:
                return self._ready.pop()

    async def next(self) -> Envelope[Any]:
        while (env := self.try_next()) is None:
            await self._channel.wait()
        return env

    def checkpoint(self, horizon_clock: int = 0) -> SequencerCheckpoint:
        piece, left = self._piece, len(self._ready)
        if not left:
            through = self._piece_end
        else:  # Through the last returned message, if any of this piece was.
            last = len(piece) - left - 1
            through = piece[last].end if last >= 0 else self._before_piece
        return SequencerCheckpoint(read_through={self._journal: through})

    def has_pending(self, since: Mapping[str, int]) -> bool:
        return False

    @property
    def in_sequence(self) -> bool:
        return False

    async def close(self) -> None:
        if self._reader is None:
            return
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


# --- The Application ----------------------------------------------------------------------------


@dataclass
class CountApp(Application):
    """The trivial count (see the module docstring). One instance per run (one shard)."""

    exactly_once: bool
    engine: Engine
    publish: str  # per-txn | per-message | relay | none
    source: str = SOURCE  # The journal the shard reads.
    output: str = OUTPUT  # The journal it publishes to.
    # perf_counter, process_time, thread_time (the event loop's thread) at the first txn.
    began_at: tuple[float, float, float] | None = None
    consumed: int = 0  # Counted at finalize, so that consume_message stays trivial.
    transactions: int = 0
    sources: list[MessageSource] = field(default_factory=list)
    # At each begin_txn: (perf_counter, process_time, thread_time, consumed by the transactions
    # before it). Consecutive marks bracket one whole transaction (`--steady-txns`).
    marks: list[tuple[float, float, float, int]] = field(default_factory=list)
    on_mark: Callable[[], None] | None = None

    async def new_store(self, shard: Shard, recorder: object | None) -> Any:
        if self.exactly_once:
            return CountingSQLStore(self.engine)
        return NoCheckpointStore(self.engine)

    def new_message(self, journal_spec: pb.JournalSpec) -> type[Any]:
        return Reading

    def new_message_source(
        self, shard: Shard, store: Any, checkpoint: Checkpoint
    ) -> MessageSource | None:
        if self.exactly_once:
            return None
        source = UncommittedSource(shard.journal_client, self.source, 0)
        self.sources.append(source)
        return source

    async def begin_txn(self, shard: Shard, store: Any) -> None:
        if self.began_at is None:
            self.began_at = (time.perf_counter(), time.process_time(), time.thread_time())
        now = (time.perf_counter(), time.process_time(), time.thread_time())
        self.marks.append((*now, self.consumed))
        if self.on_mark is not None:
            self.on_mark()

    async def consume_message(
        self, shard: Shard, store: Any, envelope: Envelope[Any], publisher: Publisher[AsyncAppend]
    ) -> None:
        counts = store.counts
        key = envelope.message.sensor
        counts[key] = counts.get(key, 0) + 1
        if self.publish == "per-message":
            # Published a batch at a time (Publisher.publish_*_batch): uncommitted, nobody reads
            # them before the transaction's ACK, which follows its commit anyway.
            derived = self._derived
            derived.append(Derived(sensor=key, sequence=envelope.message.sequence))
            if len(derived) == DERIVED_BATCH_MAX:
                await self._publish_derived(publisher)
        elif self.publish == "relay":
            await self._publish(publisher, envelope.message)

    async def finalize_txn(
        self, shard: Shard, store: Any, publisher: Publisher[AsyncAppend]
    ) -> None:
        if self._derived:
            await self._publish_derived(publisher)
        counts, store.counts = store.counts, {}
        consumed = sum(counts.values())
        self.consumed += consumed
        self.transactions += 1
        await store.write_counts(shard.id, counts)
        if self.publish == "per-txn":
            await self._publish(
                publisher, Summary(shard=shard.id, messages=consumed, keys=len(counts))
            )

    def __post_init__(self) -> None:
        partition = Partition(self.output, CONTENT_TYPE_JSON_LINES)
        self._to_output: Callable[[Any], Partition] = lambda _message: partition
        self._derived: list[Derived] = []  # Not published yet; at most DERIVED_BATCH_MAX.

    async def _publish_derived(self, publisher: Publisher[AsyncAppend]) -> None:
        derived, self._derived = self._derived, []
        if self.exactly_once:
            await publisher.publish_uncommitted_batch(self._to_output, derived)
        else:
            await publisher.publish_committed_batch(self._to_output, derived)

    async def _publish(self, publisher: Publisher[AsyncAppend], message: Any) -> None:
        if self.exactly_once:
            await publisher.publish_uncommitted(self._to_output, message)
        else:
            await publisher.publish_committed(self._to_output, message)


async def prepare(engine: Engine) -> Engine:
    await create_checkpoints_table(engine)
    await asyncio.to_thread(COUNTS.create, engine, checkfirst=True)
    return engine
