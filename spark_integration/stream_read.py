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
[start, write head) through a Sequencer restored from `start` (`scan_committed`), keeping only
the producer states. So the driver reads each byte once more than the executors do; offsets
must be known before a micro-batch runs, and producer states cannot be learned otherwise.
Producers idle for longer than option producerHorizonSeconds are forgotten then (a duplicate of
theirs arriving later would be delivered again), which bounds the offset's size.

Read-uncommitted streams carry read-through offsets only.

An idle query costs next to nothing. Spark plans micro-batches back to back (its default trigger),
calling `latestOffset` again within milliseconds of an answer of "nothing new"; each call asks
the broker for the journals and their write heads. So when no journal has data beyond its start,
`latestOffset` waits, at most option idleWaitMs, for an append to any of them (a blocking
metadata-only Read at each write head, which the broker answers when content commits there), then
looks once more and answers: the new offsets if content came, else the start offsets. This is
what Kafka's source does in its poll. Trigger.AvailableNow never waits.

A selector is re-evaluated at every micro-batch: journals it newly matches are read from their
beginning. `Trigger.AvailableNow` reads up to the write heads of when the query started.

Where the query starts a journal (startingOffsets) is its origin, kept in every offset: starting
at an offset other than 0, `initialOffset` learns the producers open there (range_start.py),
and the transactions they began before the origin are skipped when they commit, however many
micro-batches later (range_read.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from broker.client.route_cache import JournalClient
from broker.protocol import protocol_pb2 as pb
from gazette_consumer.message.clock import clock_from_unix_nanos
from spark_integration import offsets
from spark_integration.batch_read import JournalRange, read_partition
from spark_integration.journal_io import (
    GazetteJournalError,
    resolve_journals,
    run_with_client,
    wait_for_append,
    write_heads,
)
from spark_integration.offsets import JournalOffset
from spark_integration.options import GazetteOptionError, ReadOptions
from spark_integration.range_read import scan_committed
from spark_integration.range_start import check_boundary, start_checkpoint


class GazetteStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema
        # Trigger.AvailableNow: the write heads to stop at.
        self._available_now: dict[str, int] | None = None

    # -- planning (driver) -------------------------------------------------------------------

    async def _journals(self, client: JournalClient) -> list[pb.JournalSpec]:
        return await resolve_journals(client, self.opts.journals, self.opts.selector)

    def initialOffset(self) -> dict[str, Any]:
        """Where the query starts reading each journal: its origin. Starting at an offset other
        than 0, read-committed, the offset also holds the producers open there (range_start.py),
        whose transactions are skipped."""

        async def start_at(client: JournalClient, journal: str, offset: int) -> JournalOffset:
            if not offset or not self.opts.committed:
                return JournalOffset.at(journal, offset, offset)
            checkpoint = await start_checkpoint(
                client,
                journal,
                offset,
                lookback=self.opts.lookback_bytes,
                ring_size=self.opts.ring_size,
            )
            return JournalOffset(checkpoint, offset)

        async def plan(client: JournalClient) -> dict[str, JournalOffset]:
            names = [s.name for s in await self._journals(client)]
            if not names:
                raise GazetteJournalError(f"selector {self.opts.selector!r} matches no journal")
            starting = self.opts.starting
            if starting == "latest":
                start = await write_heads(client, names)
            elif isinstance(starting, Mapping):
                start = offsets.starting_offsets(starting, names)
                heads = await write_heads(client, [j for j, o in start.items() if o])
                for journal, head in heads.items():
                    if start[journal] > head:
                        raise GazetteOptionError(
                            "startingOffsets",
                            f"offset {start[journal]} of {journal} is beyond its write head {head}",
                        )
                    await check_boundary(client, journal, start[journal], "startingOffsets")
            else:
                start = dict.fromkeys(names, 0)
            return {j: await start_at(client, j, offset) for j, offset in start.items()}

        return offsets.to_json(run_with_client(self.opts.broker, plan))

    def prepareForTriggerAvailableNow(self) -> None:
        async def heads(client: JournalClient) -> dict[str, int]:
            return await write_heads(client, [s.name for s in await self._journals(client)])

        self._available_now = run_with_client(self.opts.broker, heads)

    def latestOffset(self, start: dict[str, Any], limit: Any = None) -> dict[str, Any]:
        """The end checkpoint of every journal read (see the module docstring). `limit` is
        always ReadAllAvailable: the source declares no other default limit.

        With nothing new in any journal, it first waits (see the module docstring) for an
        append, at most option idleWaitMs, then looks once more."""
        starts = offsets.from_json(start)
        horizon = 0
        if self.opts.producer_horizon_s:
            horizon = clock_from_unix_nanos(
                time.time_ns() - self.opts.producer_horizon_s * 1_000_000_000
            )
        # Trigger.AvailableNow stops at the heads it captured: nothing to wait for.
        wait_s = 0.0 if self._available_now is not None else self.opts.idle_wait_ms / 1000

        def begin_of(journal: str) -> int:
            entry = starts.get(journal)
            return entry.offset(journal) if entry is not None else 0

        async def look(client: JournalClient) -> dict[str, int]:
            names = [s.name for s in await self._journals(client)]
            heads = await write_heads(client, names)
            if self._available_now is not None:
                heads = {j: min(h, self._available_now.get(j, 0)) for j, h in heads.items()}
            return heads

        async def plan(client: JournalClient) -> dict[str, JournalOffset]:
            heads = await look(client)
            # A selector matching no journal gives nothing to wait on: answer at once.
            if wait_s and heads and all(h <= begin_of(j) for j, h in heads.items()):
                await wait_for_append(client, heads, wait_s)
                heads = await look(client)
            out: dict[str, JournalOffset] = {}
            for journal, head in heads.items():
                entry = starts.get(journal) or JournalOffset.at(journal, 0)  # Newly matched.
                begin = entry.offset(journal)
                if head <= begin:
                    out[journal] = entry
                elif self.opts.committed:
                    checkpoint = await scan_committed(
                        client,
                        journal,
                        begin,
                        head,
                        ring_size=self.opts.ring_size,
                        checkpoint=entry.checkpoint,
                        horizon_clock=horizon,
                    )
                    out[journal] = JournalOffset(checkpoint, entry.origin)
                else:
                    out[journal] = JournalOffset.at(journal, head, entry.origin)
            return out

        return offsets.to_json(run_with_client(self.opts.broker, plan))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        starts = offsets.from_json(start)
        parts: list[InputPartition] = []
        for journal, stop in offsets.read_through(end).items():
            entry = starts.get(journal) or JournalOffset.at(journal, 0)
            begin = entry.offset(journal)
            if stop > begin:
                checkpoint = start.get(journal) if self.opts.committed else None
                parts.append(JournalRange(journal, begin, stop, checkpoint, entry.origin))
        return parts

    def commit(self, end: dict[str, Any]) -> None:
        # Nothing to release: journals are retained by their own retention, not by readers.
        pass

    # -- reading (executors) ---------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        return read_partition(self.opts, self.schema, partition)
