"""Batch reads: one Spark partition per journal, the offset range [begin, write head).

The journals (named, or matched by the selector) and their write heads are resolved once, when
Spark plans the read; every partition then reads a fixed range, so a re-run task reads the same
messages. Read-committed (the default) runs each range through a fresh Sequencer: a batch read
sees the transactions committed within its range; a transaction whose ACK lies beyond the range
(not yet written when the read was planned) is not seen, nor are the messages of a transaction
that began before `begin`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from broker.client.route_cache import JournalClient
from spark_integration.journal_io import (
    GazetteJournalError,
    iterate_with_client,
    resolve_journals,
    run_with_client,
    write_heads,
)
from spark_integration.offsets import from_json
from spark_integration.options import GazetteOptionError, ReadOptions
from spark_integration.range_read import CommittedRange, read_uncommitted
from spark_integration.range_start import check_boundary, start_checkpoint
from spark_integration.rows import infer_samples_max, infer_schema, row_builder


@dataclass(frozen=True)
class JournalRange(InputPartition):  # type: ignore[misc]
    """A partition: [begin, end) of one journal. `checkpoint` (streaming, read-committed) is the
    journal's offset JSON at `begin` (see offsets.py); None starts a Sequencer that learns what
    was open at `begin` (range_start.py). Transactions begun before `origin` are skipped."""

    journal: str
    begin: int
    end: int
    checkpoint: dict[str, Any] | None = None
    origin: int = 0


async def plan_ranges(client: JournalClient, opts: ReadOptions) -> list[JournalRange]:
    specs = await resolve_journals(client, opts.journals, opts.selector)
    names = [s.name for s in specs]
    unknown = sorted((set(opts.begin) | set(opts.end)) - set(names))
    if unknown:
        raise GazetteOptionError("begin", f"names journals not read: {', '.join(unknown)}")
    heads = await write_heads(client, names)
    ranges = []
    for name in names:
        begin = opts.begin.get(name, 0)
        end = opts.end.get(name, heads[name])
        if end > heads[name]:
            raise GazetteOptionError(
                "end", f"offset {end} of {name} is beyond its write head {heads[name]}"
            )
        if begin > end:
            raise GazetteOptionError(
                "begin", f"offset {begin} of {name} is beyond its end {end} (the write head)"
            )
        for option, offsets in (("begin", opts.begin), ("end", opts.end)):
            if name in offsets:
                await check_boundary(client, name, offsets[name], option)
        ranges.append(JournalRange(name, begin, end, origin=begin))
    return ranges


async def read_range(
    client: JournalClient, opts: ReadOptions, schema: StructType, part: JournalRange
) -> AsyncIterator[list[tuple[Any, ...]]]:
    """Rows of one partition, a chunk's worth at a time."""
    build = row_builder(schema)
    if not opts.committed:
        async for envelopes in read_uncommitted(client, part.journal, part.begin, part.end):
            yield [build(env) for env in envelopes]
        return
    walk = await committed_range(client, opts, part)
    async for envelopes in walk.read():
        yield [build(env) for env in envelopes]


async def committed_range(
    client: JournalClient, opts: ReadOptions, part: JournalRange
) -> CommittedRange:
    """The read-committed walk of a partition, from its checkpoint: the streaming offset, or
    what the look-back before `begin` learns (range_start.py)."""
    if part.checkpoint is not None:
        checkpoint = from_json({part.journal: part.checkpoint})[part.journal].checkpoint
    else:
        checkpoint = await start_checkpoint(
            client, part.journal, part.begin, lookback=opts.lookback_bytes, ring_size=opts.ring_size
        )
    return CommittedRange(
        client,
        part.journal,
        part.begin,
        part.end,
        ring_size=opts.ring_size,
        checkpoint=checkpoint,
        origin=part.origin,
    )


def read_partition(
    opts: ReadOptions, schema: StructType, part: InputPartition
) -> Iterator[tuple[Any, ...]]:
    if not isinstance(part, JournalRange):
        raise TypeError(f"gazette data source: unexpected partition {part!r}")

    def work(client: JournalClient) -> AsyncIterator[list[tuple[Any, ...]]]:
        return read_range(client, opts, schema, part)

    for rows in iterate_with_client(opts.broker, work):
        yield from rows


def sample_schema(opts: ReadOptions) -> StructType:
    """Infer option("format", "json")'s fields from the first committed messages."""

    async def sample(client: JournalClient) -> list[bytes]:
        lines: list[bytes] = []
        for part in await plan_ranges(client, opts):
            walk = await committed_range(client, opts, part)
            async for envelopes in walk.read():
                lines.extend(env.message.line for env in envelopes)
                if len(lines) >= infer_samples_max:
                    return lines[:infer_samples_max]
        return lines

    return infer_schema(run_with_client(opts.broker, sample))


class GazetteBatchReader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        ranges = run_with_client(self.opts.broker, lambda c: plan_ranges(c, self.opts))
        if not ranges:
            raise GazetteJournalError(f"selector {self.opts.selector!r} matches no journal")
        return ranges

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        return read_partition(self.opts, self.schema, partition)
