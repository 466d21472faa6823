"""Writes, exactly once: tasks publish uncommitted transactions, the driver commits them.

Batch (`GazetteBatchWriter`): every task publishes its partition as one transaction of its own
producer (publish.py) and returns its ACK and rollback messages. `commit(messages)`, called by
Spark once every task succeeded, appends the ACKs: from then on read-committed readers see every
row once (a retried ACK append is ignored by readers). `abort(messages)` appends the rollbacks of
the tasks that had succeeded; the failed ones rolled back themselves, or left a span that no ACK
will ever commit. Either way read-committed readers see nothing of an aborted write.
Speculative or retried task attempts publish under producers of their own, and only the attempt
whose commit message reaches the driver is acknowledged.

Streaming (`GazetteStreamWriter`): the same per micro-batch, plus one rule for replays. After a
failure Spark may run a micro-batch again, with the same batch id, although the first run's
commit had already reached the journals (the driver died before recording it). The replay
publishes the rows again under new producers; its commit must not acknowledge them. So the ACKs
of a micro-batch are appended, per journal, in one append conditioned on the journal's
*register* `gazette.spark/<sinkId>`: the append requires that the register does not already
hold this batch id, and sets it to this batch id, atomically with the ACKs (Gazette checks and
updates registers within the append transaction). A replayed commit finds its batch id there
and leaves them pending, never delivered. Spark only ever replays the last micro-batch it ran, so the
register needs to hold one batch id per sink. `sinkId` defaults to a hash of the query's
checkpointLocation: the same query keeps the same register across restarts.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any, Final

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import StringType, StructType

from broker.client.appender import append
from broker.client.list_apply import get_journal
from broker.client.route_cache import JournalClient
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import JournalNotFoundError, RegisterMismatchError
from spark_integration.journal_io import GazetteJournalError, check_json_lines, run_with_client
from spark_integration.options import GazetteOptionError, WriteOptions
from spark_integration.publish import PublishedTxn, RowShape, append_acks, publish_partition

REGISTER_PREFIX: Final = "gazette.spark/"

_log = logging.getLogger(__name__)


def row_shape(opts: WriteOptions, schema: StructType) -> RowShape:
    """Validate the DataFrame's schema against the options (on the driver, before any task)."""
    fields = {f.name: f for f in schema.fields}
    journal_column = not opts.journal
    if journal_column:
        column = fields.get("journal")
        if column is None:
            raise GazetteOptionError(
                "journal", "is required, unless the DataFrame has a 'journal' column"
            )
        if not isinstance(column.dataType, StringType):
            raise GazetteOptionError("journal", "the 'journal' column must be a string")
    content = fields.get("content")
    content_column = content is not None and isinstance(content.dataType, StringType)
    return RowShape(
        content_column=content_column, journal_column=journal_column, journal=opts.journal
    )


def _check_journal(opts: WriteOptions) -> None:
    if not opts.journal:
        return

    async def check(client: JournalClient) -> None:
        try:
            check_json_lines(await get_journal(client, opts.journal))
        except JournalNotFoundError:
            raise GazetteJournalError(f"journal {opts.journal!r} does not exist") from None

    run_with_client(opts.broker, check)


def _group(messages: Sequence[WriterCommitMessage | None], field: str) -> dict[str, list[bytes]]:
    out: dict[str, list[bytes]] = {}
    for message in messages:
        if isinstance(message, PublishedTxn):
            for journal, ack in getattr(message, field).items():
                out.setdefault(journal, []).append(ack)
    return out


class GazetteBatchWriter(DataSourceWriter):  # type: ignore[misc]
    def __init__(self, opts: WriteOptions, schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise GazetteOptionError("mode", "journals are append-only: use mode('append')")
        self.opts = opts
        self.shape = row_shape(opts, schema)
        _check_journal(opts)

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return publish_partition(self.opts, self.shape, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        acks = _group(messages, "acks")
        run_with_client(self.opts.broker, lambda client: append_acks(client, acks))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        rollbacks = _group(messages, "rollbacks")
        run_with_client(self.opts.broker, lambda client: append_acks(client, rollbacks))


class GazetteStreamWriter(DataSourceStreamWriter):  # type: ignore[misc]
    def __init__(self, opts: WriteOptions, schema: StructType, overwrite: bool) -> None:
        if not opts.sink_id:
            raise GazetteOptionError(
                "sinkId",
                "is required for a streaming write (or option 'checkpointLocation'): it names"
                " the register that keeps a replayed micro-batch from committing twice",
            )
        if overwrite:
            raise GazetteOptionError("outputMode", "journals are append-only: use append")
        self.opts = opts
        self.shape = row_shape(opts, schema)
        self.register = REGISTER_PREFIX + opts.sink_id
        _check_journal(opts)

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return publish_partition(self.opts, self.shape, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        acks = _group(messages, "acks")

        async def commit(client: JournalClient) -> None:
            for journal, pieces in acks.items():
                if not await self._append_once(client, journal, b"".join(pieces), batchId):
                    # The replay's own messages stay pending, never delivered. No rollback:
                    # when the mismatch is our own retried append landing twice, a rollback
                    # would reach readers as an ACK older than the one that committed.
                    _log.info("gazette: micro-batch %d already committed to %s", batchId, journal)

        run_with_client(self.opts.broker, commit)

    async def _append_once(
        self, client: JournalClient, journal: str, acks: bytes, batch_id: int
    ) -> bool:
        """Append `acks` unless the journal's register says `batch_id` was committed; say
        whether they were appended."""
        label = pb.Label(name=self.register, value=str(batch_id))
        request = pb.AppendRequest(
            journal=journal,
            check_registers=pb.LabelSelector(exclude=pb.LabelSet(labels=[label])),
            union_registers=pb.LabelSet(labels=[label]),
        )
        try:
            await append(client, request, acks)
        except RegisterMismatchError:
            return False
        return True

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        rollbacks = _group(messages, "rollbacks")
        run_with_client(self.opts.broker, lambda client: append_acks(client, rollbacks))
