"""Reading a bounded offset range [begin, end) of one journal, uncommitted or committed, a batch
of messages at a time.

A Spark partition is such a range: it must read the same messages whenever it is (re-)run, so
it reads exactly to `end` and never blocks at the head. Its content comes from a
`JournalSource` (sources.py: fragment files, else a broker) and is decoded a piece at a time
into `MessageBatch`es (range_decode.py).

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

Split reads. A read cut into partitions (batch partitions, and the partitions of a streaming
micro-batch) must return what one walk of the whole read returns. Each partition delivers the
committed messages that lie in its own range, whichever partition holds their ACK:

- a transaction still pending at the partition's `end` is resolved by looking ahead, up to
  `read_end` (where the journal's read ends): the messages of its producer that can resolve it
  (ACKs, messages outside transactions) are read there, content-less, until each such
  transaction is resolved; its messages within the range are delivered if it commits, through
  the ACK's clock, exactly as the Sequencer would deliver them. Other messages after `end`
  cannot change that outcome (it depends only on the producer's last ACK), so they are skipped;
- a transaction that began before the partition's start (`deliver_from`, set for every
  partition but the first of its journal's read) is delivered from there on only: the part
  before it is the earlier partitions' to deliver. Only the clock that part brings the producer
  to is needed (so that a re-sent duplicate is not delivered twice): a content-less scan finds it.

So a transaction spanning many partitions is delivered by all of them at once, rather than by
the one holding its ACK (which would re-read the whole transaction, alone on one core). Replays
of transactions longer than the ring are picked from the walk's own decoded batches when they
are still held (`replay_cache_bytes_max`), rather than read and decoded again.

`origin` is where the reader started reading the journal (a batch read's `begin`, a streaming
query's starting offset): a transaction that began before it is skipped whole when its ACK
commits it, never delivered in part (range_start.py says how the reader knows).
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Collection, Iterator, Mapping, Sequence
from typing import Final

import numpy as np

from gazette_consumer.sequencer.commit_pending import commit_pending
from gazette_consumer.sequencer.types import (
    FLAG_ACK_TXN,
    FLAG_CONTINUE_TXN,
    JournalProducer,
    ReplayRequired,
    SequencerCheckpoint,
)
from spark_integration.bulk_commit import BulkSequencer
from spark_integration.message_batch import BatchRow, MessageBatch, ProducerIntern, gather
from spark_integration.range_decode import (
    DecoderFactory,
    decoded,
    json_decoder,
    no_batches,
    scan_decoder_of,
)
from spark_integration.range_decode import (
    read_uncommitted as read_uncommitted,  # Re-exported: its callers read ranges from here.
)
from spark_integration.resolving import Resolutions
from spark_integration.sources import JournalSource

# Journal bytes of a walk's decoded batches kept for replays (a transaction longer than the
# ring is replayed from them rather than read and decoded again).
replay_cache_bytes_max: Final = 256 << 20


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
        deliver_from: int | None = None,
        read_end: int | None = None,
        bulk: bool = True,
        reached: Mapping[bytes, int] | None = None,
        resolving: Sequence[tuple[int, int]] | None = None,
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
        self._scan_decoder = scan_decoder_of(new_decoder)
        self._deliver_from = deliver_from
        # Per producer, the clock its transaction pending at `deliver_from` reached before it,
        # when the planner knew it (else the part before `deliver_from` is scanned: _replay).
        self._reached = {int.from_bytes(p, "big"): c for p, c in (reached or {}).items()}
        # At each stop of `scan`: the clocks its transactions pending there reached (`reached`).
        self.reached_at: dict[int, dict[bytes, int]] = {}
        # At each stop of `scan`: the messages after it that resolve the transactions pending
        # there, [begin, end) each (resolving.py).
        self._resolutions = Resolutions()
        self.resolving_at = self._resolutions.at
        # Given (a partition of a planned micro-batch): those messages after `end`, which the
        # look-ahead reads instead of scanning [end, read_end) (None: it scans).
        self._resolving = None if resolving is None else sorted(resolving)
        self.look_ahead_bytes = 0  # Content the look-ahead decoded.
        self._read_end = end if read_end is None else max(end, read_end)
        # The walk's recent batches, which replays pick their rows from (see _replay_batches).
        self._cache: deque[MessageBatch] = deque()
        self._cache_bytes = 0
        self._seq = BulkSequencer(ring_size, checkpoint)
        self._intern = ProducerIntern()
        self._replay_wanted = replay
        # Rows decided by columns (bulk_commit.py), or one by one only (the reference path,
        # which tests compare it with). A walk starting before its origin delivers no
        # transaction begun there; the bulk path never skips one: one by one then.
        self._bulk = bulk and (begin >= origin or not replay)
        self.replays = 0
        self.clock_scans = 0  # Replays that scanned the part before `deliver_from` (_replay).
        self.bulk_rows = 0  # Rows decided by columns, and rows decided one by one.
        self.single_rows = 0

    def checkpoint(self, horizon: int = 0) -> SequencerCheckpoint:
        return self.checkpoint_at(self._end, horizon)

    def checkpoint_at(self, offset: int, horizon: int) -> SequencerCheckpoint:
        """The state at `offset`, where the walk stopped (or a stop of `scan`)."""
        cp = self._seq.checkpoint(horizon)
        # Everything before `offset` was consumed (a range ends at a message boundary).
        read_through = dict(cp.read_through)
        read_through[self._journal] = max(read_through.get(self._journal, 0), offset)
        return SequencerCheckpoint(read_through=read_through, producers=dict(cp.producers))

    async def batches(self) -> AsyncIterator[MessageBatch]:
        async for batch in decoded(self._source, self._begin, self._end, self._new_decoder):
            self._remember(batch)
            async for out in self._commit_range(batch, 0, len(batch)):
                yield out
        if self._read_end > self._end:
            async for out in self._look_ahead():
                yield out

    def _remember(self, batch: MessageBatch) -> None:
        """Keep `batch` for replays, within `replay_cache_bytes_max`."""
        if not len(batch):
            return
        self._cache.append(batch)
        self._cache_bytes += batch.end - int(batch.begins[0])
        while self._cache_bytes > replay_cache_bytes_max and len(self._cache) > 1:
            dropped = self._cache.popleft()
            self._cache_bytes -= dropped.end - int(dropped.begins[0])

    async def _replay_batches(self, begin: int, end: int) -> AsyncIterator[MessageBatch]:
        """The messages of [begin, end): from the walk's remembered batches when they hold
        all of it (a transaction longer than the ring is then not decoded twice), else read
        and decoded again."""
        cache = self._cache
        if cache and int(cache[0].begins[0]) <= begin and cache[-1].end >= end:
            for batch in list(cache):
                if batch.end <= begin or int(batch.begins[0]) >= end:
                    continue
                lo = int(np.searchsorted(batch.begins, begin))
                hi = int(np.searchsorted(batch.ends, end, "right"))
                if lo == 0 and hi == len(batch):
                    yield batch
                elif lo < hi:
                    yield batch.take(np.arange(lo, hi))
            return
        async for batch in decoded(self._source, begin, end, self._new_decoder):
            yield batch

    async def _look_ahead(self) -> AsyncIterator[MessageBatch]:
        """Deliver the messages of the range whose transactions are still pending at `end`
        and commit before `read_end` (the module docstring): the ACKs and other resolving
        messages of their producers are read from [end, read_end), content-less, until every
        one of those transactions is resolved; their other messages there are not this
        range's to deliver, and cannot change what the resolving message does to those before
        `end` (it depends only on the producer's last ACK)."""
        watched = self._pending_producers()
        if not watched:
            return
        batches = (
            self._resolving_batches(self._resolving)
            if self._resolving is not None
            else decoded(self._source, self._end, self._read_end, self._scan_decoder)
        )
        try:
            async for batch in batches:
                self.look_ahead_bytes += batch.end - int(batch.begins[0])
                keys = np.fromiter(watched, np.uint64, len(watched))
                picked = np.flatnonzero(
                    np.isin(batch.producers, keys) & (batch.flags != FLAG_CONTINUE_TXN)
                )
                if not len(picked):
                    continue
                async for out in self._commit(batch.rows_at(picked, self._intern)):
                    yield out
                watched &= self._pending_producers()
                if not watched:
                    return
        finally:
            await batches.aclose()

    async def _resolving_batches(
        self, ranges: Sequence[tuple[int, int]]
    ) -> AsyncGenerator[MessageBatch, None]:
        """The messages the planner found resolving the transactions pending at `end`, in
        journal order: all the look-ahead needs of [end, read_end) (resolving.py)."""
        for begin, end in ranges:
            if self._end <= begin < end <= self._read_end:
                batches = decoded(self._source, begin, end, self._scan_decoder)
                try:
                    async for batch in batches:
                        yield batch
                finally:
                    await batches.aclose()

    def _pending_producers(self) -> set[int]:
        """Producers with a transaction pending that began at or after the origin."""
        return {
            int.from_bytes(jp.producer, "big")
            for jp, state in self._seq.checkpoint().producers.items()
            if state.begin >= self._origin and jp.journal == self._journal
        }

    async def scan(
        self,
        stops: Collection[int] = (),
        horizon: int = 0,
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
        batches = decoded(self._source, self._begin, self._end, self._scan_decoder)
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
                at = 0
                while pending_stops and take and pending_stops[0] <= int(batch.ends[take - 1]):
                    stop = pending_stops.pop(0)
                    cut = int(np.searchsorted(batch.begins[:take], stop))
                    async for _ in self._commit_range(batch, at, cut):
                        pass
                    self._resolutions.note(batch, at, cut)
                    at = cut
                    out[stop] = self.checkpoint_at(stop, horizon)
                    self.reached_at[stop] = self._seq.pending_clocks(self._journal, self._begin)
                    self._resolutions.watch(stop, self._seq.pending_acks(self._journal))
                async for _ in self._commit_range(batch, at, take):
                    pass
                self._resolutions.note(batch, at, take)
                walked += take
                if take:
                    through = int(batch.ends[take - 1])
                if take < n:
                    return out, through
        finally:
            await batches.aclose()
        return out, self._end

    async def _commit_range(
        self, batch: MessageBatch, lo: int, hi: int
    ) -> AsyncIterator[MessageBatch]:
        """Commit rows [lo, hi) of `batch`: those `BulkSequencer.commit_bulk` decides by
        columns, the rest one by one (`_commit`), their output interleaved in the order one
        walk one by one delivers it (by the position of the message committing each row)."""
        if hi <= lo:
            return
        seq = self._seq
        plan = seq.commit_bulk(batch, lo, hi, self._intern) if self._bulk else None
        if plan is None:
            self.single_rows += hi - lo
            rows = (
                batch.rows(self._intern)
                if hi - lo == len(batch)
                else batch.rows_at(np.arange(lo, hi), self._intern)
            )
            async for out in self._commit(rows):
                yield out
            return
        delivered, commits, fallback = plan.delivered, plan.commits, plan.fallback
        self.single_rows += len(fallback)
        self.bulk_rows += hi - lo - len(fallback)
        i = j = 0
        while i < len(fallback) or j < len(delivered):
            if j < len(delivered) and (i == len(fallback) or commits[j] < fallback[i]):
                # Bulk rows committed before the next row one by one.
                k = len(delivered)
                if i < len(fallback):
                    k = int(np.searchsorted(commits, fallback[i]))
                whole = k - j == len(batch)  # Every row, in journal order.
                if (mine := self._own(batch if whole else batch.take(delivered[j:k]))) is not None:
                    yield mine
                j = k
            else:
                k = len(fallback)
                if j < len(delivered):
                    k = int(np.searchsorted(fallback, commits[j]))
                async for out in self._commit(batch.rows_at(fallback[i:k], self._intern)):
                    yield out
                i = k
        seq.read_through_to(batch.journal, int(batch.ends[hi - 1]))

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
            if (committed := self._own(gather(out))) is not None:
                yield committed
            out = []
            async for replayed in self._replay(ack, required):
                if (mine := self._own(replayed)) is not None:
                    yield mine
        if (committed := self._own(gather(out))) is not None:
            yield committed

    def _own(self, batch: MessageBatch | None) -> MessageBatch | None:
        """The rows of `batch` that lie before `end` (the look-ahead commits those after it
        too: they are the next range's). Rows are in delivery order, not journal order: a row
        past `end` may come before rows within it."""
        if batch is None:
            return None
        mine = batch.begins < self._end
        if mine.all():
            return batch
        kept = np.flatnonzero(mine)
        return batch.take(kept) if len(kept) else None

    async def _replay(self, ack: BatchRow, required: ReplayRequired) -> AsyncIterator[MessageBatch]:
        seq = self._seq
        producer = int.from_bytes(ack.producer, "big")
        last = seq.checkpoint().producers[JournalProducer(ack.journal, ack.producer)].last_ack
        feed = _ReplayFeed()
        seq.replay(feed)
        self.replays += 1
        begin, end = required.begin, min(required.end, self._end)
        if self._deliver_from is not None and begin < self._deliver_from:
            # Messages before deliver_from are another range's to deliver: only the clock
            # they bring the producer to is needed here. The planner's walk saw them: the
            # largest is the one it reached, if that is within the commit (else an ACK of a
            # lower clock: only the messages up to it count, which a scan finds).
            reached = self._reached.get(producer)
            if reached is not None and reached <= ack.clock:
                last = max(last, reached)
            else:
                last = await self._clock_through(
                    producer, last, ack.clock, begin, self._deliver_from
                )
            begin = self._deliver_from
        async for batch in self._replay_batches(begin, end) if begin < end else no_batches():
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
            # The Sequencer would deliver exactly `kept`, each in turn raising the producer's
            # clock: handing it the last one alone leaves it in the same state (that clock,
            # read through its end), without a Python object per replayed message.
            feed.rows.extend(batch.rows_at(kept[-1:], self._intern))
            delivered = seq.dequeue_replayed(1)
            assert len(delivered) == 1  # `kept` are within the commit's clocks, rising.
            yield batch if len(kept) == len(batch) else batch.take(kept)
        rest = []
        while (row := seq.dequeue()) is not None:
            if row.flags != FLAG_ACK_TXN:
                rest.append(row)
        if (committed := gather(rest)) is not None:
            yield committed

    async def _clock_through(
        self, producer: int, last: int, ack_clock: int, begin: int, end: int
    ) -> int:
        """The clock a replay of `producer`'s span up to `ack_clock` reaches through [begin,
        end): its largest clock there (not above the ACK's), or `last`."""
        self.clock_scans += 1
        async for batch in decoded(self._source, begin, end, self._scan_decoder):
            clocks = batch.clocks[(batch.producers == producer) & (batch.clocks <= ack_clock)]
            if len(clocks):
                last = max(last, int(clocks.max()))
        return last


async def scan_committed(
    source: JournalSource,
    begin: int,
    end: int,
    *,
    ring_size: int,
    checkpoint: SequencerCheckpoint,
    horizon: int,
    new_decoder: DecoderFactory = json_decoder,
    bulk: bool = True,
) -> SequencerCheckpoint:
    """The Sequencer's checkpoint of the journal at `end`, walking from `checkpoint` at
    `begin` (`bulk`: see CommittedRange)."""
    walk = CommittedRange(
        source,
        begin,
        end,
        ring_size=ring_size,
        checkpoint=checkpoint,
        replay=False,
        new_decoder=new_decoder,
        bulk=bulk,
    )
    await walk.scan()
    return walk.checkpoint(horizon)
