"""Streaming reads: micro-batches of read-committed messages, each committed message exactly once.

Offsets (offsets.py) are, per journal, a Sequencer checkpoint: the read-through offset and the
producers' states (last ACK clock, begin of a pending transaction). A micro-batch of journal J
is the range [start, end) of J, read through a Sequencer restored from J's start checkpoint.

Why producer states and not offsets alone: a journal read in order holds duplicates (appends are
at-least-once) and transactions whose messages precede their ACK by any distance. With only the
read-through offset carried from one micro-batch to the next, a duplicate of a message delivered
in batch N would be delivered again in batch N+1 (its producer's last clock forgotten), and the
messages of a transaction that was pending when batch N was planned would be lost when its ACK
arrives in batch N+1. The restored checkpoint handles both: the duplicate's clock is not above
the producer's last ACK; the pending transaction's begin offset is remembered, so when its ACK is
read in batch N+1 the Sequencer asks for [begin, ...) to be replayed, and the partition re-reads
that span from the journal, before `start`. Each committed message is thus delivered by the
micro-batch that reads its ACK (or, outside a transaction, the message itself), once. This is
what Gazette's own consumers do with the checkpoints they commit; it never stalls a journal on a
producer that died mid-transaction (whose pending span simply stays pending).

Planning computes each journal's end checkpoint in `latestOffset`, on the driver: it walks
[start, write head) through a Sequencer restored from `start` (`CommittedRange.scan`), keeping
only the producer states. So the driver reads each byte once more than the executors do;
offsets must be known before a micro-batch runs, and producer states cannot be learned
otherwise. The walk reads persisted fragments straight from their store (sources.py), and
takes the checkpoints at the fragment boundaries where the micro-batch is cut into partitions
(`maxPartitionBytes`, `minPartitions`: a large catch-up is read by many tasks): they are kept
in the end offset (`splits`), so each partition starts from the exact state at its start, and
the partitions of a re-run micro-batch are the same. With each split, the largest clock each
transaction pending there (and begun within the micro-batch) reached (`reached`): a checkpoint
does not hold it, and the partition starting there would otherwise scan that transaction's
earlier part again to learn it when its ACK comes (range_read.py, `_replay`). And the messages
after each split that resolve the transactions pending there (`resolving`: an ACK, or a
producer's next message outside a transaction): the partition ending at the split reads only
those ahead, where it would otherwise scan on to the micro-batch's end for them
(resolving.py). The walk reads the UUIDs from the lines' tails where it can, without
decoding the JSON (uuid_tails.py).

Rate limits: option maxBytesPerTrigger / maxMessagesPerTrigger (Spark's ReadMaxBytes /
ReadMaxRows, its default read limit) bound a micro-batch: the budget is shared among the
journals with new data in proportion to what each has, and each journal's walk stops at the
last message its share lets in (one at least, so nothing stalls). Messages are counted as
framed (ACKs and duplicates too), as Kafka counts offsets. Spark passes ReadAllAvailable when
the trigger asks for everything; then the limits do not apply.
Producers idle for longer than option producerHorizonSeconds are forgotten then (a duplicate of
theirs arriving later would be delivered again), which bounds the offset's size.

Read-uncommitted streams carry read-through offsets only.

An idle query costs next to nothing. Spark plans micro-batches back to back (its default trigger),
calling `latestOffset` again within milliseconds of an answer of "nothing new"; each call asks
the broker for the journals and their write heads. So when no journal has data beyond its start,
`latestOffset` waits, at most option idleWaitMs, for an append to any of them (a blocking
metadata-only Read at each write head, which the broker answers when content commits there), then
looks once more and answers: the new offsets if content came, else the start offsets. This is
what Kafka's source does in its poll. Trigger.AvailableNow never waits. A journal with nothing
new keeps its start offset exactly (split checkpoints included): any other answer is new data to
Spark, which would run a micro-batch of no rows after each micro-batch of data.

A selector is re-evaluated at every micro-batch: journals it newly matches are read from their
beginning. A journal that leaves the journals read (relabelled out of the selection, or out of
option journals across a restart) keeps its offset, marked deselected: back, it is read on
from there, not again from its beginning. One that left because it was deleted is data loss,
as a partition gone is to Kafka's source (`_not_read`). `Trigger.AvailableNow` reads up to the
write heads of when the query started.

Where the query starts a journal (startingOffsets) is its origin, kept in every offset: starting
at an offset other than 0, `initialOffset` learns the producers open there (range_start.py),
and the transactions they began before the origin are skipped when they commit, however many
micro-batches later (range_read.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping, Sequence
from typing import Any, Final, TypeVar

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from broker.client.write_head import confirm_write_head
from broker.fragment.verify import DataLossError
from broker.protocol import labels as gl
from gazette_consumer.message.clock import clock_span
from gazette_consumer.sequencer.types import SequencerCheckpoint
from spark_integration import offsets
from spark_integration.batch_read import JournalRange, read_partition
from spark_integration.fragment_plan import split_ranges, store_stream_head, target_bytes
from spark_integration.framings import decoder_factory
from spark_integration.journal_io import (
    GazetteJournalError,
    journal_exists,
    resolve_journals,
    wait_for_append,
    write_heads,
)
from spark_integration.offset_by_time import offset_at_time
from spark_integration.offsets import JournalOffset
from spark_integration.options import GazetteOptionError
from spark_integration.range_read import CommittedRange
from spark_integration.range_start import check_boundary, start_checkpoint
from spark_integration.read_options import ReadOptions
from spark_integration.read_plan import (
    JournalInfo,
    ReadContext,
    journal_infos,
    position_offset,
    run_in_context,
)
from spark_integration.sources import GazetteDataLossError

_log = logging.getLogger(__name__)

# Journals whose new content the driver walks at once when planning a micro-batch: their
# reads (fragment files, broker reads) overlap; their decoding shares the driver's event loop.
planning_walks_max: Final = 8

T = TypeVar("T")


async def gather_bounded(
    work: Mapping[str, Callable[[], Awaitable[T]]], limit: int
) -> dict[str, T]:
    """The result of each of `work`'s calls, at most `limit` of them running at once (each
    called only when it may run). The first failure cancels the rest and is raised as it was
    (a GazetteOptionError stays one, as when the journals were walked one by one)."""
    gate = asyncio.Semaphore(limit)

    async def one(call: Callable[[], Awaitable[T]]) -> T:
        async with gate:
            return await call()

    try:
        async with asyncio.TaskGroup() as group:
            tasks = {key: group.create_task(one(call)) for key, call in work.items()}
    except ExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return {key: task.result() for key, task in tasks.items()}


class GazetteJournalDeletedError(GazetteDataLossError):
    """A journal a streaming query read was deleted: what it held beyond the query's offset
    may not have been read. Raised when option failOnDataLoss is true (the default)."""

    def __init__(self, journal: str, offset: int) -> None:
        DataLossError.__init__(
            self,
            journal,
            f"journal {journal}: deleted while the query read it from offset {offset}; content"
            " it held beyond that offset may not have been read. Set option failOnDataLoss to"
            " false to run on without it (with a warning) instead",
        )
        self.begin = offset
        self.end = offset


def _share(budget: int | None, available: int, total: int) -> int | None:
    """A journal's part of a micro-batch's budget: in proportion to what it has new."""
    if budget is None or total <= 0:
        return None
    return max(1, budget * available // total)


class GazetteStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema
        # Trigger.AvailableNow: the write heads to stop at.
        self._available_now: dict[str, int] | None = None
        # The journals planned by the last latestOffset (partitions of that micro-batch).
        self._infos: dict[str, JournalInfo] = {}
        # The first answer of initialOffset, given again: Spark asks a new query's twice (to
        # plan micro-batch 0, then for its partitions), and with startingOffsets latest (or a
        # timestamp) a second look would start after content the first plan covers, which
        # would then be read by no partition (as Kafka's source keeps its initial offsets).
        self._initial: dict[str, Any] | None = None

    # -- planning (driver) -------------------------------------------------------------------

    async def _heads(self, ctx: ReadContext, read_before: Collection[str] = ()) -> dict[str, int]:
        """The journals read and their write heads (or, with no broker, where their persisted
        content ends). A journal named by option journals that does not exist is an error,
        unless the query read it before (`read_before`): then it was deleted, which
        `_not_read` judges (data loss, or with failOnDataLoss false a warning)."""
        opts = self.opts
        if ctx.client is not None:
            specs = await resolve_journals(
                ctx.client, opts.journals, opts.selector, check=False, missing_ok=read_before
            )
            return await write_heads(ctx.client, [s.name for s in specs])
        now_s, grace_s = time.time(), opts.store_gap_grace_s
        return {
            info.name: store_stream_head(info.fragments, now_s, grace_s)
            for info in await journal_infos(ctx)
        }

    def initialOffset(self) -> dict[str, Any]:
        """Where the query starts reading each journal: its origin. Starting elsewhere than the
        journal's first offset, read-committed, the offset also holds the producers open there
        (range_start.py), whose transactions are skipped. Asked again, the same answer."""
        if self._initial is not None:
            return self._initial

        async def plan(ctx: ReadContext) -> dict[str, JournalOffset]:
            infos = await journal_infos(ctx)
            if not infos:
                raise GazetteJournalError(f"selector {self.opts.selector!r} matches no journal")
            starts = {info.name: functools.partial(self._start, ctx, info) for info in infos}
            return await gather_bounded(starts, planning_walks_max)

        self._initial = self._to_json(run_in_context(self.opts, plan))
        return self._initial

    def _to_json(self, entries: Mapping[str, JournalOffset]) -> dict[str, Any]:
        return offsets.to_json(entries, uncommitted=not self.opts.committed)

    def _from_json(self, entries: dict[str, Any]) -> dict[str, JournalOffset]:
        """Offsets Spark gives back: of this query's isolation (offsets.check_isolation)."""
        offsets.check_isolation(entries, committed=self.opts.committed)
        return offsets.from_json(entries)

    async def _start(self, ctx: ReadContext, info: JournalInfo) -> JournalOffset:
        opts = self.opts
        starting = opts.starting
        new_decoder = decoder_factory(info.content_type, opts.protobuf_class)
        offset = position_offset(starting, info, default=info.fragments.begin)
        if offset is None:
            assert isinstance(starting, int)
            offset = await offset_at_time(ctx, info, starting, new_decoder)
        elif offset > info.head:
            raise GazetteOptionError(
                "startingOffsets",
                f"offset {offset} of {info.name} is beyond its write head {info.head}",
            )
        source = ctx.source(info.name, info.fragments.overlapping(0, info.head))
        if isinstance(starting, Mapping) and starting.get(info.name, -1) >= 0:
            await check_boundary(source, offset, "startingOffsets")
        start = await self._start_at(ctx, info, offset, source)
        # The journal's create revision from the start, not only once a micro-batch reads it:
        # a journal idle since the start, deleted and created again while the query is down,
        # is otherwise read on from its old offset.
        return dataclasses.replace(start, created=info.create_revision)

    async def _start_at(
        self, ctx: ReadContext, info: JournalInfo, offset: int, source: Any = None
    ) -> JournalOffset:
        """The query's start at `offset` of a journal, its origin: read-committed, with the
        producers open there (their transactions are never delivered)."""
        opts = self.opts
        floor = info.fragments.begin
        if offset <= floor or not opts.committed:
            return JournalOffset.at(info.name, offset, offset)
        if source is None:
            source = ctx.source(info.name, info.fragments.overlapping(0, info.head))
        new_decoder = decoder_factory(info.content_type, opts.protobuf_class)
        checkpoint = await start_checkpoint(
            source,
            offset,
            lookback=opts.lookback_bytes,
            ring_size=opts.ring_size,
            floor=floor,
            new_decoder=new_decoder,
            csv=info.content_type == gl.CONTENT_TYPE_CSV,
        )
        return JournalOffset(checkpoint, offset)

    def prepareForTriggerAvailableNow(self) -> None:
        # The offsets read before are not known here: a named journal missing now is judged
        # by latestOffset (an error, or a deleted journal's data loss), which reads them.
        async def heads(ctx: ReadContext) -> dict[str, int]:
            found = await self._heads(ctx, read_before=self.opts.journals)
            if ctx.client is None:
                return found
            client = ctx.client
            # What is available now is all that is committed: a head read from a broker that
            # has not listed its store yet is too low, and the query would end without the
            # rest (broker.client.write_head). Confirmed once per query, by the listing.
            confirm = {
                j: functools.partial(confirm_write_head, client, j, head)
                for j, head in found.items()
            }
            return await gather_bounded(confirm, planning_walks_max)

        self._available_now = run_in_context(self.opts, heads)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_messages_per_trigger:
            return ReadMaxRows(self.opts.max_messages_per_trigger)
        if self.opts.max_bytes_per_trigger:
            return ReadMaxBytes(self.opts.max_bytes_per_trigger)
        return ReadAllAvailable()

    def _budgets(self, limit: ReadLimit | None) -> tuple[int | None, int | None]:
        """(bytes, messages) a micro-batch may take: Spark's limit, and the option of the
        other kind (none at all when Spark asks for everything)."""
        if limit is None or isinstance(limit, ReadAllAvailable):
            return None, None
        opts = self.opts
        max_bytes = opts.max_bytes_per_trigger or None
        max_messages = opts.max_messages_per_trigger or None
        if isinstance(limit, ReadMaxRows):
            max_messages = limit.max_rows
        elif isinstance(limit, ReadMaxBytes):
            max_bytes = limit.max_bytes
        return max_bytes, max_messages

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit | None = None) -> dict[str, Any]:
        """The end checkpoint of every journal read (see the module docstring).

        With nothing new in any journal, it first waits (see the module docstring) for an
        append, at most option idleWaitMs, then looks once more."""
        opts = self.opts
        starts = self._from_json(start)
        # Relative to each journal's newest producer, as Gazette's Sequencer prunes.
        horizon = clock_span(opts.producer_horizon_s)
        # Trigger.AvailableNow stops at the heads it captured: nothing to wait for.
        wait_s = 0.0 if self._available_now is not None else opts.idle_wait_ms / 1000
        max_bytes, max_messages = self._budgets(limit)

        def begin_of(journal: str) -> int:
            entry = starts.get(journal)
            return entry.offset(journal) if entry is not None else 0

        async def look(ctx: ReadContext) -> dict[str, int]:
            heads = await self._heads(ctx, read_before=starts.keys())
            if self._available_now is not None:
                # A journal not read when the query started reads nothing (its offset stays).
                capped = self._available_now
                heads = {j: min(h, capped.get(j, begin_of(j))) for j, h in heads.items()}
            return heads

        async def plan(ctx: ReadContext) -> dict[str, JournalOffset]:
            heads = await look(ctx)
            # A selector matching no journal gives nothing to wait on: answer at once.
            if wait_s and heads and all(h <= begin_of(j) for j, h in heads.items()):
                if ctx.client is not None:
                    await wait_for_append(ctx.client, heads, wait_s)
                else:
                    await asyncio.sleep(wait_s)  # A store has no append to wait on: poll.
                heads = await look(ctx)
            for journal, head in list(heads.items()):
                # With no broker a head is where persisted content ends, which may lag behind
                # an offset read from a broker: only a broker's write head is known to be all.
                if ctx.client is not None and head < begin_of(journal):
                    # A broker that has not listed its store yet answers too low a head:
                    # confirmed by the listing (broker.client.write_head).
                    head = heads[journal] = await confirm_write_head(ctx.client, journal, head)
                    if head < begin_of(journal):
                        self._behind(journal, head, begin_of(journal))
                        del starts[journal]  # Read again from its first offset.
            active = [j for j, h in heads.items() if j not in starts or h > begin_of(j)]
            infos = {i.name: i for i in await journal_infos(ctx, active)} if active else {}
            self._infos.update(infos)
            for journal, known in infos.items():
                created = starts[journal].created if journal in starts else 0
                if created and known.create_revision and created != known.create_revision:
                    self._recreated(journal, begin_of(journal), created, known.create_revision)
                    del starts[journal]  # Read again from its first offset.
            out: dict[str, JournalOffset] = {}
            news: dict[str, JournalOffset] = {}
            for journal in heads:
                if journal in starts:
                    news[journal] = starts[journal]
                else:  # Newly matched by the selector: read from its first offset.
                    floor = infos[journal].fragments.begin
                    news[journal] = JournalOffset.at(journal, floor, floor)
            available = {j: max(0, heads[j] - news[j].offset(j)) for j in heads if j in infos}
            total = sum(available.values())
            target = target_bytes(total, opts.max_partition_bytes, opts.min_partitions)
            walks: dict[str, Callable[[], Awaitable[JournalOffset]]] = {}
            for journal, entry in news.items():
                info = infos.get(journal)
                begin, head = entry.offset(journal), heads[journal]
                if info is None or head <= begin:
                    # Nothing new: the start offset as it is (its splits too). An answer that
                    # differs in any way, even in splits no later partition uses, is new data
                    # to Spark: it would run a micro-batch of no rows after each one of data.
                    # (Once, for a journal read again, its deselected mark goes.)
                    out[journal] = dataclasses.replace(entry, deselected=False)
                    continue
                walks[journal] = functools.partial(
                    self._walk,
                    ctx,
                    info,
                    entry,
                    head,
                    target=target,
                    horizon=horizon,
                    max_bytes=_share(max_bytes, available[journal], total),
                    max_messages=_share(max_messages, available[journal], total),
                )
            walked = await gather_bounded(walks, planning_walks_max)
            out.update(
                {
                    journal: dataclasses.replace(end, created=infos[journal].create_revision)
                    for journal, end in walked.items()
                }
            )
            kept = await self._not_read(ctx, {j: e for j, e in starts.items() if j not in heads})
            return {**{journal: out[journal] for journal in news}, **kept}

        return self._to_json(run_in_context(opts, plan))

    def _behind(self, journal: str, head: int, offset: int) -> None:
        """A journal's write head is below the query's offset in it: it was deleted and created
        again (or is another cluster's journal of that name). As Kafka's source with an
        offset out of range: data loss, or with failOnDataLoss false (a warning) the journal
        is read again from its first offset. Waiting for the head to pass the offset and
        reading on from there would skip, silently, all before it."""
        reason = (
            f"the journal's write head {head} is below the query's offset {offset} in it"
            " (deleted and created again, or another journal of that name)"
        )
        if self.opts.fail_on_data_loss:
            raise GazetteDataLossError(journal, head, offset, reason)
        _log.warning(
            "gazette: journal %s: %s: read again from its first offset (failOnDataLoss is false)",
            journal,
            reason,
        )

    def _recreated(self, journal: str, offset: int, created: int, now: int) -> None:
        """The journal was deleted and created again since the query read it (its etcd create
        revision is another), and written past the query's offset in it meanwhile (else
        `_behind` would have told): data loss, or with failOnDataLoss false (a warning) read
        again from its first offset. Reading on from the old offset would skip, silently,
        every message of the new journal before it."""
        reason = (
            f"the journal was deleted and created again since the query read it (created at"
            f" etcd revision {created} then, {now} now): the query's offset {offset} is not an"
            " offset of the new journal, whose content before it would be skipped"
        )
        if self.opts.fail_on_data_loss:
            raise GazetteDataLossError(journal, 0, offset, reason)
        _log.warning(
            "gazette: journal %s: %s: read again from its first offset (failOnDataLoss is false)",
            journal,
            reason,
        )

    async def _not_read(
        self, ctx: ReadContext, entries: Mapping[str, JournalOffset]
    ) -> dict[str, JournalOffset]:
        """The offsets of journals read before and no longer: kept, marked deselected, so that
        a journal read again (back in the selection, or in option journals) goes on where it
        was, rather than from its beginning, which would deliver its messages again. A journal
        that left because it was deleted is data loss, as a Kafka partition gone is for
        Kafka's source (what it held beyond the offset may not have been read): it fails the
        query, or with failOnDataLoss false is forgotten with a warning (one named by option
        journals stays, at offset 0 and marked deselected: the query runs on without it, and
        reads it from its first offset if it is created again). Existence is asked once, when
        a journal leaves (with no broker to ask, it is kept)."""
        left = [j for j, e in entries.items() if not e.deselected]
        deleted: set[str] = set()
        if left and ctx.client is not None:
            client = ctx.client
            found = await gather_bounded(
                {j: functools.partial(journal_exists, client, j) for j in left},
                planning_walks_max,
            )
            deleted = {j for j, exists in found.items() if not exists}
        for journal in sorted(deleted):
            offset = entries[journal].offset(journal)
            if self.opts.fail_on_data_loss:
                raise GazetteJournalDeletedError(journal, offset)
            _log.warning(
                "gazette: journal %s was deleted while read from offset %d: the query goes on"
                " without it; content it held beyond that offset may not have been read"
                " (failOnDataLoss is false)",
                journal,
                offset,
            )
        named = set(self.opts.journals)
        out: dict[str, JournalOffset] = {}
        for journal, entry in entries.items():
            if journal not in deleted:
                out[journal] = dataclasses.replace(entry, deselected=True)
            elif journal in named:
                # Created again, it is another journal: read from its first offset (its
                # write head may have passed the old offset, so _behind could not tell).
                out[journal] = JournalOffset(
                    SequencerCheckpoint(read_through={journal: 0}), deselected=True
                )
        return out

    async def _walk(
        self,
        ctx: ReadContext,
        info: JournalInfo,
        entry: JournalOffset,
        head: int,
        *,
        target: int,
        horizon: int,
        max_bytes: int | None,
        max_messages: int | None,
    ) -> JournalOffset:
        """The end offset of a journal's part of the micro-batch, with its split checkpoints."""
        journal, begin = info.name, entry.offset(info.name)
        cuts = [lo for lo, _ in split_ranges(info.fragments.fragments, begin, head, target)][1:]
        limited = max_bytes is not None or max_messages is not None
        if not self.opts.committed and not limited:
            return JournalOffset.at(journal, head, entry.origin)
        walk = CommittedRange(
            ctx.source(journal, self._fragments_of(info, entry.checkpoint, begin, head)),
            begin,
            head,
            ring_size=self.opts.ring_size,
            checkpoint=entry.checkpoint,
            replay=False,
            new_decoder=decoder_factory(info.content_type, self.opts.protobuf_class),
        )
        stops, end = await walk.scan(
            cuts if self.opts.committed else (),
            horizon,
            bytes_max=max_bytes,
            messages_max=max_messages,
        )
        if not self.opts.committed:
            return JournalOffset.at(journal, end, entry.origin)
        splits = tuple((at, cp) for at, cp in sorted(stops.items()) if at < end)
        reached = {at: walk.reached_at[at] for at, _ in splits if walk.reached_at.get(at)}
        resolving = {at: tuple(walk.resolving_at[at]) for at, _ in splits}
        return JournalOffset(
            walk.checkpoint_at(end, horizon), entry.origin, splits, reached, resolving
        )

    @staticmethod
    def _fragments_of(
        info: JournalInfo, checkpoint: SequencerCheckpoint, begin: int, end: int
    ) -> tuple[Any, ...]:
        """The fragments a walk from `checkpoint` may read: from the first pending
        transaction's start (a replay), else `begin`."""
        pending = [s.begin for s in checkpoint.producers.values() if s.begin >= 0]
        return info.fragments.overlapping(min([begin, *pending]), end)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        starts = self._from_json(start)
        ends = self._from_json(end)
        for journal, end_entry in ends.items():
            # An end below its start, or of another journal of that name: the journal was read
            # again from its first offset (its write head fell below the start, `_behind`; it
            # was created again, `_recreated`): read from its end's origin.
            entry = starts.get(journal)
            if entry is not None and (
                end_entry.offset(journal) < entry.offset(journal)
                or (entry.created and end_entry.created and entry.created != end_entry.created)
            ):
                del starts[journal]
        starts.update(self._restarted(start, starts, ends))
        needed = [
            j
            for j, e in ends.items()
            if j not in self._infos
            and e.offset(j) > (starts[j].offset(j) if j in starts else e.origin)
        ]
        if needed:
            self._infos.update(
                {i.name: i for i in run_in_context(self.opts, lambda c: journal_infos(c, needed))}
            )
        parts: list[InputPartition] = []
        for journal, end_entry in ends.items():
            entry = starts.get(journal) or JournalOffset.at(
                journal, end_entry.origin, end_entry.origin
            )
            begin, stop = entry.offset(journal), end_entry.offset(journal)
            if stop <= begin:
                continue
            info = self._infos[journal]
            bounds = [(begin, entry.checkpoint)]
            bounds += [(at, cp) for at, cp in end_entry.splits if begin < at < stop]
            for i, (lo, checkpoint) in enumerate(bounds):
                hi = bounds[i + 1][0] if i + 1 < len(bounds) else stop
                encoded = None
                if self.opts.committed:
                    encoded = offsets.to_json({journal: JournalOffset(checkpoint, entry.origin)})[
                        journal
                    ]
                parts.append(
                    JournalRange(
                        journal,
                        lo,
                        hi,
                        encoded,
                        entry.origin,
                        # Up to the micro-batch's end: the partition may look ahead.
                        fragments=self._fragments_of(info, checkpoint, lo, stop),
                        labels=info.labels,
                        content_type=info.content_type,
                        floor=info.fragments.begin,
                        deliver_from=lo if i else None,
                        read_end=stop,
                        reached=tuple(end_entry.reached.get(lo, {}).items()) if i else (),
                        resolving=end_entry.resolving.get(hi) if hi < stop else None,
                    )
                )
        return parts

    def _restarted(
        self,
        start: dict[str, Any],
        starts: dict[str, JournalOffset],
        ends: dict[str, JournalOffset],
    ) -> dict[str, JournalOffset]:
        """The start of a micro-batch 0 run again after a restart, where the query began.

        A query that dies after Spark logged micro-batch 0's end, but before the batch
        committed, runs micro-batch 0 again when it restarts: its end from the offset log, its
        start from `initialOffset` asked afresh in a new source process. With startingOffsets
        `latest` (or a timestamp) that answer is where the journal is now, after rows the batch
        planned: they would be read by no partition. The logged end names the query's origin
        in each journal; where it differs from this start's, the start is rebuilt there, as
        the first run built it (the look-back before the origin is the same content). Any
        other start that disagrees with its end's origin is refused: delivering from either
        one could lose or repeat rows.

        Likewise a journal of the end that the start lacks (a micro-batch 0 run again by a
        query that no longer reads it): the start is built at its end's origin, with the
        producers open there, not taken as a plain offset, which would deliver the tails of
        transactions begun before the query started. (A journal newly matched by a selector,
        whose origin is its first offset, starts there plainly either way.)"""
        moved = {
            j: e.origin for j, e in ends.items() if j in starts and starts[j].origin != e.origin
        }
        absent = {
            j: e.origin
            for j, e in ends.items()
            if j not in starts
            and e.offset(j) > e.origin  # Else nothing to read (a journal that left, say).
            and e.origin > (self._infos[j].fragments.begin if j in self._infos else 0)
        }
        if not moved and not absent:
            return {}
        if moved and start != self._initial:
            journal, origin = next(iter(moved.items()))
            raise offsets.GazetteOffsetError(
                f"the micro-batch's end offset of {journal} is of a query that began reading"
                f" it at {origin}, its start offset of one that began at"
                f" {starts[journal].origin}: the checkpoint's offsets are not of one query"
                " (start the query from a new checkpoint location)"
            )

        async def rebuild(ctx: ReadContext) -> dict[str, JournalOffset]:
            rebuilt = {**moved, **absent}
            infos = {i.name: i for i in await journal_infos(ctx, list(rebuilt))}
            self._infos.update(infos)
            starts_at = {
                j: functools.partial(self._start_at, ctx, infos[j], origin)
                for j, origin in rebuilt.items()
            }
            return await gather_bounded(starts_at, planning_walks_max)

        return run_in_context(self.opts, rebuild)

    def commit(self, end: dict[str, Any]) -> None:
        # Nothing to release: journals are retained by their own retention, not by readers.
        pass

    # -- reading (executors) ---------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.opts, self.schema, partition)
