"""Batch reads: partitions cut from the fragment index, read as Arrow record batches.

The journals (named, or matched by the selector, less those pushed filters exclude), their
fragments and where each read starts and ends are resolved once, when Spark plans the read
(read_plan.py); every partition then reads a fixed range, so a re-run task reads the same
messages. A journal's range is cut into partitions at fragment boundaries
(`maxPartitionBytes`, `minPartitions`: fragment_plan.py); each partition reads its persisted
fragments straight from their store and the rest from a broker (sources.py), and yields
`pyarrow.RecordBatch`es (arrow_rows.py).

Read-committed (the default) runs each partition through a fresh Sequencer (range_read.py). A
batch read sees the transactions committed within its range: one whose ACK lies beyond the
range (not yet written when the read was planned) is not seen, nor is one that began before
the read's start. A partition that starts inside the range (not at the read's start) learns
what was open there from the `lookbackBytes` before it (range_start.py). Each partition
delivers the committed messages within its own range: of a transaction spanning several, each
delivers its part, the earlier ones looking ahead for its ACK (range_read.py). Partitions split
a read without changing what it returns: a later partition's look-back cannot tell whether a
transaction began before the read's start, so the driver finds the transactions open there
once, and tells the later partitions (origin_open.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, Filter, InputPartition
from pyspark.sql.types import StructType

from broker.protocol import labels as gl
from spark_integration import pushdown
from spark_integration.fragment_plan import split_ranges, target_bytes
from spark_integration.framings import decoder_factory, protobuf_fields
from spark_integration.journal_io import GazetteJournalError
from spark_integration.offset_by_time import offset_at_time
from spark_integration.offsets import from_json
from spark_integration.options import GazetteOptionError
from spark_integration.origin_open import OpenAtOrigin, at_start, open_at_origin
from spark_integration.range_decode import read_uncommitted
from spark_integration.range_read import CommittedRange
from spark_integration.range_start import check_boundary, start_checkpoint
from spark_integration.read_options import Position, ReadOptions
from spark_integration.read_plan import (
    JournalInfo,
    ReadContext,
    iterate_in_context,
    journal_infos,
    position_offset,
    run_in_context,
)
from spark_integration.rows import infer_samples_max, infer_schema
from spark_integration.sources import FragmentRef

if TYPE_CHECKING:
    # Imported where batches are built (executors): it imports pyarrow.compute, whose first
    # import (~0.3 s of CPU) the driver's planning, a streaming query's among it, never needs.
    from spark_integration.arrow_rows import RecordBatchBuilder


@dataclass(frozen=True)
class JournalRange(InputPartition):  # type: ignore[misc]
    """A partition: [begin, end) of one journal. `checkpoint` (streaming, read-committed) is the
    journal's offset JSON at `begin` (see offsets.py); None starts a Sequencer that learns what
    was open at `begin` (range_start.py). Transactions begun before `origin` are skipped.
    `fragments` are those it reads (with its look-back's); `floor` is where the journal's
    content begins (what was before was removed)."""

    journal: str
    begin: int
    end: int
    checkpoint: dict[str, Any] | None = None
    origin: int = 0
    fragments: tuple[FragmentRef, ...] = ()
    labels: tuple[tuple[str, str], ...] | None = None
    content_type: str = gl.CONTENT_TYPE_JSON_LINES
    floor: int = 0
    split_checkpoints: Mapping[int, Any] = field(default_factory=dict)
    # Read-committed, a partition that is not its journal's first in the read: the ones before
    # it deliver the messages before `begin` (range_read.py's module docstring).
    deliver_from: int | None = None
    # Where the journal's read ends: transactions pending at `end` are resolved by looking
    # ahead up to it (0: no look-ahead).
    read_end: int = 0
    # Read-committed, a later partition: the transactions open at `origin` (origin_open.py).
    open_at_origin: tuple[OpenAtOrigin, ...] = ()
    # Streaming, a later partition of a micro-batch: the clock each transaction pending at
    # `begin` reached before it, as the planner's walk saw (offsets.JournalOffset.reached).
    reached: tuple[tuple[bytes, int], ...] = ()
    # Streaming, a partition of a micro-batch but its last: the messages after `end` resolving
    # the transactions pending there, as the planner's walk found them (offsets.JournalOffset
    # .resolving), which its look-ahead reads instead of scanning up to `read_end`.
    resolving: tuple[tuple[int, int], ...] | None = None


async def _position(
    ctx: ReadContext, info: JournalInfo, position: Position, option: str, default: int
) -> int:
    offset = position_offset(position, info, default=default)
    if offset is None:
        assert isinstance(position, int)
        new_decoder = decoder_factory(info.content_type, ctx.opts.protobuf_class)
        return await offset_at_time(ctx, info, position, new_decoder)
    if offset > info.head:
        raise GazetteOptionError(
            option, f"offset {offset} of {info.name} is beyond its write head {info.head}"
        )
    if isinstance(position, Mapping) and info.name in position and position[info.name] >= 0:
        source = ctx.source(info.name, info.fragments.overlapping(max(0, offset - 1), offset))
        await check_boundary(source, offset, option)
    return offset


def journal_ranges(
    info: JournalInfo, begin: int, end: int, target: int, lookback: int
) -> list[JournalRange]:
    """The partitions of [begin, end) of a journal: cut at fragment boundaries, each with the
    fragments it reads: those of its look-back, its own, and those it may look ahead into
    (up to `end`)."""
    floor = info.fragments.begin
    out = []
    for lo, hi in split_ranges(info.fragments.fragments, begin, end, target):
        fragments = info.fragments.overlapping(max(floor, lo - lookback - 1), end)
        out.append(
            JournalRange(
                info.name,
                lo,
                hi,
                origin=begin,
                fragments=fragments,
                labels=info.labels,
                content_type=info.content_type,
                floor=floor,
                deliver_from=lo if lo > begin else None,
                read_end=end,
            )
        )
    return out


async def plan_ranges(ctx: ReadContext, filters: Sequence[Filter] = ()) -> list[JournalRange]:
    opts = ctx.opts
    infos = await journal_infos(ctx)
    if not infos:
        raise GazetteJournalError(f"selector {opts.selector!r} matches no journal")
    infos = [i for i in infos if pushdown.keeps(filters, i.name, i.labels)]
    spans = []
    for info in infos:
        begin = await _position(
            ctx, info, opts.starting, opts.starting_option, info.fragments.begin
        )
        end = await _position(ctx, info, opts.ending, opts.ending_option, info.head)
        if begin > end:
            raise GazetteOptionError(
                opts.starting_option, f"offset {begin} of {info.name} is beyond its end {end}"
            )
        spans.append((info, begin, end))
    total = sum(end - begin for _, begin, end in spans)
    target = target_bytes(total, opts.max_partition_bytes, opts.min_partitions)
    ranges = []
    for info, begin, end in spans:
        parts = journal_ranges(info, begin, end, target, opts.lookback_bytes)
        if opts.committed and len(parts) > 1 and begin > info.fragments.begin:
            parts = await _with_open_at_origin(ctx, info, parts, begin, end)
        ranges.extend(parts)
    return ranges


async def _with_open_at_origin(
    ctx: ReadContext, info: JournalInfo, parts: list[JournalRange], begin: int, end: int
) -> list[JournalRange]:
    """The partitions after the first, told which transactions are open at the read's origin
    `begin` (origin_open.py)."""
    opts = ctx.opts
    floor = info.fragments.begin
    source = ctx.source(
        info.name, info.fragments.overlapping(max(floor, begin - opts.lookback_bytes - 1), end)
    )
    open_txns = await open_at_origin(
        source,
        begin,
        end,
        lookback=opts.lookback_bytes,
        ring_size=opts.ring_size,
        floor=floor,
        new_decoder=decoder_factory(info.content_type, opts.protobuf_class),
        csv=info.content_type == gl.CONTENT_TYPE_CSV,
    )
    if not open_txns:
        return parts
    return [parts[0], *(dataclasses.replace(p, open_at_origin=open_txns) for p in parts[1:])]


def batch_builder(opts: ReadOptions, schema: StructType, part: JournalRange) -> RecordBatchBuilder:
    from spark_integration.arrow_rows import RecordBatchBuilder

    payload = {gl.CONTENT_TYPE_CSV: "csv", gl.CONTENT_TYPE_PROTO_FIXED: "protobuf"}.get(
        part.content_type, "json"
    )
    class_path = opts.protobuf_class
    return RecordBatchBuilder(
        schema,
        part.labels,
        payload=payload,
        protobuf_fields=(lambda payload: protobuf_fields(payload, class_path))
        if class_path
        else None,
    )


async def read_range(
    ctx: ReadContext, schema: StructType, part: JournalRange
) -> AsyncIterator[pa.RecordBatch]:
    """Record batches of one partition."""
    opts = ctx.opts
    build = batch_builder(opts, schema, part).build
    source = ctx.source(part.journal, part.fragments)
    new_decoder = decoder_factory(part.content_type, opts.protobuf_class)
    if not opts.committed:
        async for batch in read_uncommitted(source, part.begin, part.end, new_decoder):
            yield build(batch)
        return
    walk = await committed_range(ctx, part)
    async for batch in walk.batches():
        yield build(batch)


async def committed_range(ctx: ReadContext, part: JournalRange) -> CommittedRange:
    """The read-committed walk of a partition, from its checkpoint: the streaming offset, or
    what the look-back before `begin` learns (range_start.py)."""
    opts = ctx.opts
    source = ctx.source(part.journal, part.fragments)
    new_decoder = decoder_factory(part.content_type, opts.protobuf_class)
    if part.checkpoint is not None:
        checkpoint = from_json({part.journal: part.checkpoint})[part.journal].checkpoint
    else:
        checkpoint = await start_checkpoint(
            source,
            part.begin,
            lookback=opts.lookback_bytes,
            ring_size=opts.ring_size,
            floor=part.floor,
            new_decoder=new_decoder,
            csv=part.content_type == gl.CONTENT_TYPE_CSV,
        )
        checkpoint = at_start(checkpoint, part.journal, part.begin, part.open_at_origin)
    return CommittedRange(
        source,
        part.begin,
        part.end,
        ring_size=opts.ring_size,
        checkpoint=checkpoint,
        origin=part.origin,
        new_decoder=new_decoder,
        deliver_from=part.deliver_from,
        read_end=part.read_end or None,
        reached=dict(part.reached),
        resolving=part.resolving,
    )


def read_partition(
    opts: ReadOptions, schema: StructType, part: InputPartition
) -> Iterator[pa.RecordBatch]:
    if not isinstance(part, JournalRange):
        if getattr(part, "value", 0) is None:
            return iter(())  # Spark's stand-in when a read has no partition: nothing to read.
        raise TypeError(f"gazette data source: unexpected partition {part!r}")

    async def work(ctx: ReadContext) -> AsyncIterator[pa.RecordBatch]:
        async for batch in read_range(ctx, schema, part):
            if batch.num_rows:
                yield batch

    return iterate_in_context(opts, work)


def sample_schema(opts: ReadOptions) -> StructType:
    """Infer option("format", "json")'s fields from the first committed messages."""

    async def sample(ctx: ReadContext) -> list[str]:
        lines: list[str] = []
        for part in await plan_ranges(ctx):
            walk = await committed_range(ctx, part)
            async for batch in walk.batches():
                lines.extend(batch.content.to_pylist())
                if len(lines) >= infer_samples_max:
                    return lines[:infer_samples_max]
        return lines

    return infer_schema(line.encode() for line in run_in_context(opts, sample))


class GazetteBatchReader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema
        self.filters: list[Filter] = []

    def partitions(self) -> Sequence[InputPartition]:
        return run_in_context(self.opts, lambda ctx: plan_ranges(ctx, self.filters))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.opts, self.schema, partition)


class GazetteFilteringReader(GazetteBatchReader):
    """A batch reader that takes pushed filters (option filterPushdown: pushdown.py)."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        taken, left = pushdown.push(filters)
        self.filters.extend(taken)
        return left
