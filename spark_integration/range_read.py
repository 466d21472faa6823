"""Reading a bounded offset range [begin, end) of one journal, uncommitted or committed, a batch
of messages at a time.

A Spark partition is such a range: it must read the same messages whenever it is (re-)run, so
it reads exactly to `end` and never blocks at the head. Its content comes from a
`JournalSource` (sources.py: fragment files, else a broker) and is decoded a piece at a time
into `MessageBatch`es (json_lines.py, or framings.py for CSV and protobuf).

Read-uncommitted, every message framed in the range is returned, ACKs, duplicates and
transactions that never commit included. Content that does not frame fails the read with
`GazetteJournalError` naming its offsets: a Spark read never skips content silently (lost
content is the source's business: option failOnDataLoss).

Read-committed, the range goes through a `Sequencer` started from a `SequencerCheckpoint` of
the journal at `begin` (producers' last ACK clocks and the begin offsets of their pending
transactions). Each decoded batch goes to the Sequencer at once (`commit_pending`, its fast
paths), and the committed rows are cut from their batches by index: each committed message
once, in per-producer order, never an ACK, a duplicate or a rolled-back message. An ACK may
commit a transaction that began before `begin` (or before what the Sequencer's ring still
holds): the Sequencer then asks for that span to be replayed, and it is re-read from the
source, bounded, its committed messages picked out by columns (`_replay`). `scan_committed`
is the same walk that keeps no messages, to compute the checkpoint at `end` (streaming plans
with it), or at chosen offsets inside the range (`stops`); there a replay is not read: only the
state after the ACK matters, and the ACK alone determines it.

`origin` is where the reader started reading the journal (a batch read's `begin`, a streaming
query's starting offset): a transaction that began before it is skipped whole when its ACK
commits it, never delivered in part (range_start.py says how the reader knows).
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Collection, Iterator
from typing import Protocol

import numpy as np

from gazette_consumer.sequencer.commit_pending import commit_pending
from gazette_consumer.sequencer.sequencer import Sequencer
from gazette_consumer.sequencer.types import (
    FLAG_ACK_TXN,
    JournalProducer,
    ReplayRequired,
    SequencerCheckpoint,
)
from spark_integration.json_lines import JSONLinesDecoder
from spark_integration.message_batch import BatchRow, MessageBatch, ProducerIntern, gather
from spark_integration.sources import JournalSource


class BatchDecoder(Protocol):
    """Content chunks in, MessageBatches out (json_lines.py, framings.py)."""

    def feed(self, content: bytes, offset: int) -> list[MessageBatch]: ...

    def flush(self) -> list[MessageBatch]: ...


DecoderFactory = Callable[[str, int], BatchDecoder]


def json_decoder(journal: str, offset: int) -> BatchDecoder:
    return JSONLinesDecoder(journal, offset)


async def decoded(
    source: JournalSource, begin: int, end: int, new_decoder: DecoderFactory
) -> AsyncGenerator[MessageBatch, None]:
    """The messages of [begin, end), in journal order, a decoded piece at a time."""
    if end <= begin:
        return
    decoder = new_decoder(source.journal, begin)
    async for chunk in source.chunks(begin, end):
        for batch in decoder.feed(chunk.content, chunk.offset):
            yield batch
    for batch in decoder.flush():
        yield batch


async def read_uncommitted(
    source: JournalSource, begin: int, end: int, new_decoder: DecoderFactory = json_decoder
) -> AsyncIterator[MessageBatch]:
    async for batch in decoded(source, begin, end, new_decoder):
        yield batch


class _ReplayFeed(Iterator[BatchRow]):
    """The replayed rows handed to the Sequencer: only those it is certain to deliver (as
    gazette_consumer's Replay keeps them), so that it takes each with one `dequeue()`."""

    def __init__(self) -> None:
        self.rows: deque[BatchRow] = deque()

    def __next__(self) -> BatchRow:
        if not self.rows:
            raise StopIteration
        return self.rows.popleft()


class CommittedRange:
    """Read-committed walk of [begin, end) of one journal from `checkpoint` (see the module
    docstring). `batches()` yields committed messages; `checkpoint()` is the state at `end`
    once the walk is done."""

    def __init__(
        self,
        source: JournalSource,
        begin: int,
        end: int,
        *,
        ring_size: int,
        checkpoint: SequencerCheckpoint | None = None,
        replay: bool = True,
        origin: int = 0,
        new_decoder: DecoderFactory = json_decoder,
    ) -> None:
        journal = source.journal
        if checkpoint is None:
            checkpoint = SequencerCheckpoint(read_through={journal: begin})
        self._source = source
        self._journal = journal
        self._begin = begin
        self._end = end
        self._origin = origin
        self._new_decoder = new_decoder
        self._seq: Sequencer[BatchRow] = Sequencer(ring_size, checkpoint)
        self._intern = ProducerIntern()
        self._replay_wanted = replay
        self.replays = 0

    def checkpoint(self, horizon_clock: int = 0) -> SequencerCheckpoint:
        return self.checkpoint_at(self._end, horizon_clock)

    def checkpoint_at(self, offset: int, horizon_clock: int) -> SequencerCheckpoint:
        """The state at `offset`, where the walk stopped (or a stop of `scan`)."""
        cp = self._seq.checkpoint(horizon_clock)
        # Everything before `offset` was consumed (a range ends at a message boundary).
        read_through = dict(cp.read_through)
        read_through[self._journal] = max(read_through.get(self._journal, 0), offset)
        return SequencerCheckpoint(read_through=read_through, producers=dict(cp.producers))

    async def batches(self) -> AsyncIterator[MessageBatch]:
        async for batch in decoded(self._source, self._begin, self._end, self._new_decoder):
            async for out in self._commit(batch.rows(self._intern)):
                yield out

    async def scan(
        self,
        stops: Collection[int] = (),
        horizon_clock: int = 0,
        *,
        bytes_max: int | None = None,
        messages_max: int | None = None,
    ) -> tuple[dict[int, SequencerCheckpoint], int]:
        """Walk the range keeping no messages, at most `bytes_max` bytes and `messages_max`
        messages of it (but one message at least). Returns the checkpoints at `stops` (message
        boundaries inside what was walked) and where the walk ended: `end`, or the end of the
        last message the limits let in."""
        pending_stops = sorted(s for s in stops if self._begin < s < self._end)
        out: dict[int, SequencerCheckpoint] = {}
        walked, through = 0, self._begin
        batches = decoded(self._source, self._begin, self._end, self._new_decoder)
        try:
            async for batch in batches:
                n = len(batch)
                take = n
                if messages_max is not None:
                    take = min(take, max(0, messages_max - walked))
                if bytes_max is not None:
                    fits = np.searchsorted(batch.ends, self._begin + bytes_max, "right")
                    take = min(take, int(fits))
                if walked == 0 and take == 0:
                    take = 1  # Never stall on a message larger than the limit.
                rows = (
                    batch.rows_at(np.arange(take), self._intern)
                    if take < n
                    else batch.rows(self._intern)
                )
                while pending_stops and take and pending_stops[0] <= int(batch.ends[take - 1]):
                    stop = pending_stops.pop(0)
                    cut = int(np.searchsorted(batch.begins[:take], stop))
                    async for _ in self._commit(rows[:cut]):
                        pass
                    rows = rows[cut:]
                    out[stop] = self.checkpoint_at(stop, horizon_clock)
                async for _ in self._commit(rows):
                    pass
                walked += take
                if take:
                    through = int(batch.ends[take - 1])
                if take < n:
                    return out, through
        finally:
            await batches.aclose()
        return out, self._end

    async def _commit(self, rows: list[BatchRow]) -> AsyncIterator[MessageBatch]:
        seq = self._seq
        pending = deque(rows)
        out: list[BatchRow] = []
        while (ack := commit_pending(seq, pending, out)) is not None:
            required = seq.replay_required
            assert required is not None  # What commit_pending stops for.
            if required.begin < self._origin or not self._replay_wanted:
                # Begun before the reader's origin: skipped whole (the module docstring); or
                # planning, where the ACK alone determines the state.
                seq.replay(())
                while seq.dequeue() is not None:
                    pass
                continue
            if (committed := gather(out)) is not None:
                yield committed
            out = []
            async for replayed in self._replay(ack, required):
                yield replayed
        if (committed := gather(out)) is not None:
            yield committed

    async def _replay(self, ack: BatchRow, required: ReplayRequired) -> AsyncIterator[MessageBatch]:
        seq = self._seq
        producer = int.from_bytes(ack.producer, "big")
        last = seq.checkpoint().producers[JournalProducer(ack.journal, ack.producer)].last_ack
        feed = _ReplayFeed()
        seq.replay(feed)
        self.replays += 1
        source = self._source
        async for batch in decoded(source, required.begin, required.end, self._new_decoder):
            # The producer's messages with clocks above the last kept and up to the ACK's,
            # each above the one before: exactly those the Sequencer delivers.
            clocks = batch.clocks
            picked = np.flatnonzero(
                (batch.producers == producer)
                & (clocks > last)
                & (clocks <= ack.clock)
                & (clocks != 0)
            )
            if not len(picked):
                continue
            picked_clocks = clocks[picked]
            before = np.maximum.accumulate(np.concatenate(([np.uint64(last)], picked_clocks[:-1])))
            kept = picked[picked_clocks > before]
            last = int(clocks[kept[-1]])
            feed.rows.extend(batch.rows_at(kept, self._intern))
            taken = [seq.dequeue() for _ in range(len(kept))]
            committed = gather([row for row in taken if row is not None])
            if committed is not None:
                yield committed
        rest = []
        while (row := seq.dequeue()) is not None:
            if row.flags != FLAG_ACK_TXN:
                rest.append(row)
        if (committed := gather(rest)) is not None:
            yield committed


async def scan_committed(
    source: JournalSource,
    begin: int,
    end: int,
    *,
    ring_size: int,
    checkpoint: SequencerCheckpoint,
    horizon_clock: int,
    new_decoder: DecoderFactory = json_decoder,
) -> SequencerCheckpoint:
    """The Sequencer's checkpoint of the journal at `end`, walking from `checkpoint` at
    `begin`."""
    walk = CommittedRange(
        source,
        begin,
        end,
        ring_size=ring_size,
        checkpoint=checkpoint,
        replay=False,
        new_decoder=new_decoder,
    )
    await walk.scan()
    return walk.checkpoint(horizon_clock)
