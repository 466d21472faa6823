"""Writes, exactly once: tasks publish uncommitted transactions, the driver commits them.

Batch (`GazetteBatchWriter`): every task publishes its partition as one transaction of its own
producer (publish.py) and returns its ACK and rollback messages. `commit(messages)`, called by
Spark once every task succeeded, checks that every journal still takes appends, then appends the
ACKs (batch_commit.py): from then on read-committed readers see every row once (a retried ACK
append is ignored by readers). Gazette has no transaction across journals: a failure between
the check and the last ACK is reported as GazettePartialCommitError, naming what landed. `abort(messages)` appends the rollbacks of
the tasks that had succeeded; the failed ones rolled back themselves, or left a span that no ACK
will ever commit. Either way read-committed readers see nothing of an aborted write.
Speculative or retried task attempts publish under producers of their own, and only the attempt
whose commit message reaches the driver is acknowledged.

Both are Spark's Arrow writers: tasks receive their rows as Arrow record batches, encoded in
bulk as each journal's content-type says (write_framing.py), and routed to journals by option,
column or key (routing.py). Journals routed to by key are listed once, here on the driver, so
that every task of the write (and every retry) maps keys over the same journals; for rows that
name their journal, the driver lists every journal's content-type once (per write, or
micro-batch), so that tasks need not look each up. The width of the CSV journals the driver
knows is checked here too (csv_width.py), before any task runs.

Streaming (`GazetteStreamWriter`): the same per micro-batch, under producers reused from one
micro-batch to the next (sink_task.py), committed through the query's register in each journal
so that a micro-batch is committed once whichever runs of the query ran it (sink_commit.py).
Spark builds a new stream writer for each micro-batch it plans: that is when the micro-batch's
base clock is taken.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    ByteType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

from broker.client.list_apply import get_journal, list_journals
from broker.client.route_cache import JournalClient
from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import JournalNotFoundError
from gazette_consumer.message.clock import clock_from_unix_nanos
from spark_integration.arrow_protobuf import uuid_field
from spark_integration.batch_commit import commit_acks, roll_back
from spark_integration.csv_width import check_width, first_record_fields, known_fields
from spark_integration.journal_io import GazetteJournalError, resolve_journals, run_with_client
from spark_integration.options import GazetteOptionError, WriteOptions, journals_max
from spark_integration.publish import PublishedTxn, publish_partition
from spark_integration.routing import RowShape
from spark_integration.sink_commit import BatchTxns, abort_batch, commit_batch
from spark_integration.write_framing import WriteFraming, write_content_type

try:  # pyspark >= 4.1; before, a stream writer's tasks receive rows (publish.py takes both).
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase
except ImportError:  # pragma: no cover - depends on the installed pyspark
    from pyspark.sql.datasource import (  # type: ignore[assignment]
        DataSourceStreamWriter as _StreamWriterBase,
    )

_KEY_TYPES = (StringType, BinaryType, LongType, IntegerType, ShortType, ByteType)


def row_shape(opts: WriteOptions, schema: StructType) -> RowShape:
    """Validate the DataFrame's schema against the options (on the driver, before any task);
    list the journals rows are routed to by key, and the content-type of every journal the
    options name (write_framing.py: a journal that cannot be written, protobuf columns that
    do not fit the message, a CSV journal of another width, are refused here)."""
    fields = {f.name: f for f in schema.fields}
    journal_column = not opts.journal and not opts.key_column
    if journal_column:
        column = fields.get("journal")
        if column is None:
            raise GazetteOptionError(
                "journal",
                "is required, unless the DataFrame has a 'journal' column or rows are routed"
                " by keyColumn",
            )
        if not isinstance(column.dataType, StringType):
            raise GazetteOptionError("journal", "the 'journal' column must be a string")
    if opts.key_column:
        key = fields.get(opts.key_column)
        if key is None:
            raise GazetteOptionError(
                "keyColumn",
                f"the DataFrame has no column {opts.key_column!r} (columns:"
                f" {', '.join(schema.fieldNames())})",
            )
        if not isinstance(key.dataType, _KEY_TYPES):
            raise GazetteOptionError(
                "keyColumn",
                f"column {opts.key_column!r} is {key.dataType.simpleString()}: keys must be"
                " strings, binary or integers",
            )
    plan = run_with_client(opts.broker, lambda client: _plan(client, opts))
    content = fields.get("content")
    content_column = content is not None and isinstance(content.dataType, StringType)
    shape = RowShape(
        content_column=content_column,
        journal_column=journal_column,
        journal=opts.journal,
        key_column=opts.key_column,
        key_journals=plan.key_journals,
        mapping=opts.mapping,
        content_types=plan.content_types,
        content_type=opts.content_type,
        journal_labels=plan.journal_labels,
        protobuf_class=opts.protobuf_class,
    )
    names = schema.fieldNames()
    if opts.protobuf_class:
        uuid_field(opts.protobuf_class)  # Importable here, with a field for the UUID.
    proto = any(t == gl.CONTENT_TYPE_PROTO_FIXED for _, t in plan.content_types)
    types = to_arrow_schema(schema) if proto else None  # Protobuf fields are checked by type.
    framings = {  # Refuse what tasks would refuse, now.
        journal: WriteFraming.of(journal, content_type, shape, names, types)
        for journal, content_type in plan.content_types
    }
    csv = [j for j, f in framings.items() if f.content_type == gl.CONTENT_TYPE_CSV]
    if not csv:
        return shape
    columns = shape.message_columns(names)
    wanted = {j: framings[j].csv_fields for j in csv}
    widths = run_with_client(
        opts.broker, lambda client: _csv_fields(client, opts.broker, wanted, columns)
    )
    return replace(shape, csv_fields=widths)


@dataclass(frozen=True)
class _Plan:
    """What the driver looks up for a write: the journals of keyColumn routing (sorted), the
    content-type of each journal it knows rows go to, and for a write whose rows name their
    journal, the content-type label of every journal (routing.RowShape)."""

    key_journals: tuple[str, ...] = ()
    content_types: tuple[tuple[str, str], ...] = ()
    journal_labels: tuple[tuple[str, str], ...] = ()


async def _plan(client: JournalClient, opts: WriteOptions) -> _Plan:
    if opts.key_column:
        specs = await resolve_journals(client, (), opts.selector, check=False)
        if not specs:
            raise GazetteOptionError("selector", f"{opts.selector!r} matches no journal")
        key_journals = tuple((spec.name, _content_type(spec, opts)) for spec in specs)
        return _Plan(tuple(name for name, _ in key_journals), key_journals)
    if opts.journal:
        try:
            spec = await get_journal(client, opts.journal)
        except JournalNotFoundError:
            raise GazetteJournalError(f"journal {opts.journal!r} does not exist") from None
        return _Plan(content_types=((opts.journal, _content_type(spec, opts)),))
    # Rows name their journals: list every journal once (per write, or micro-batch) rather
    # than have each task look up each journal it meets. Beyond journals_max, tasks do.
    listing = await list_journals(client)
    if len(listing.journals) > journals_max:
        return _Plan()
    return _Plan(
        journal_labels=tuple(
            sorted(
                (j.spec.name, gl.value_of(j.spec.labels, gl.CONTENT_TYPE)) for j in listing.journals
            )
        )
    )


async def _csv_fields(
    client: JournalClient, broker: str, wanted: dict[str, int], columns: list[str]
) -> tuple[tuple[str, int], ...]:
    """The width of each CSV journal (remembered once known: csv_width.known_fields), checked
    against the write's (`wanted`, per journal); a remembered width that refuses the write is
    looked up again first (the journal may have been re-created since)."""

    async def one(journal: str) -> int:
        def probe(j: str) -> Coroutine[Any, Any, int]:
            return first_record_fields(client, j)

        existing = await known_fields(broker, journal, probe)
        if existing and existing != wanted[journal]:
            existing = await known_fields(broker, journal, probe, fresh=True)
        check_width(journal, existing, wanted[journal], columns)
        return existing

    journals = sorted(wanted)
    widths = await asyncio.gather(*(one(j) for j in journals))
    return tuple(zip(journals, widths, strict=True))


def _content_type(spec: pb.JournalSpec, opts: WriteOptions) -> str:
    label = gl.value_of(spec.labels, gl.CONTENT_TYPE)
    return write_content_type(spec.name, label, opts.content_type, opts.protobuf_class)


def _group(messages: Sequence[WriterCommitMessage | None], field: str) -> dict[str, list[bytes]]:
    out: dict[str, list[bytes]] = {}
    for message in messages:
        if isinstance(message, PublishedTxn):
            for journal, ack in getattr(message, field).items():
                out.setdefault(journal, []).append(ack)
    return out


def _base_clock() -> int:
    return clock_from_unix_nanos(time.time_ns())


class GazetteBatchWriter(DataSourceArrowWriter):  # type: ignore[misc]
    def __init__(self, opts: WriteOptions, schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise GazetteOptionError("mode", "journals are append-only: use mode('append')")
        self.opts = opts
        self.shape = row_shape(opts, schema)
        self.base_clock = _base_clock()

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        """Publish a task's rows: Arrow record batches, as Spark passes them, or rows."""
        return publish_partition(self.opts, self.shape, iterator, self.base_clock, streaming=False)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        acks = _group(messages, "acks")
        run_with_client(self.opts.broker, lambda client: commit_acks(client, acks))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        rollbacks = _group(messages, "rollbacks")
        run_with_client(self.opts.broker, lambda client: roll_back(client, rollbacks))


class GazetteStreamWriter(_StreamWriterBase):  # type: ignore[misc]
    def __init__(self, opts: WriteOptions, schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise GazetteOptionError("outputMode", "journals are append-only: use append")
        self.opts = opts
        self.shape = row_shape(opts, schema)
        self.base_clock = _base_clock()

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return publish_partition(self.opts, self.shape, iterator, self.base_clock, streaming=True)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        txns = BatchTxns.of(
            messages, batchId, self.shape.routing, replay_check=self.opts.replay_check
        )
        if txns is not None:
            run_with_client(self.opts.broker, lambda client: commit_batch(client, txns))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        txns = BatchTxns.of(messages, batchId)
        if txns is not None:
            run_with_client(self.opts.broker, lambda client: abort_batch(client, txns))
