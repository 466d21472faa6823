"""The task side of a write: publish a partition's rows as one uncommitted transaction.

Each task attempt draws its own random ProducerID and publishes every row of its partition as a
CONTINUE_TXN message (`Publisher.publish_uncommitted`) through an AppendService. Nothing of it
is visible to read-committed readers yet. The task returns a `PublishedTxn` commit message: per
journal, the framed ACK_TXN that commits the transaction (the Publisher's ACK intent, one clock
past its last message) and one that rolls it back (the clock just before the producer's first
message in that journal: a reader that saw the span begin treats an ACK of the clock it started
from as "abandon the pending span"). The driver appends the former on commit, the latter on
abort (see write.py). A task attempt that fails appends its own rollbacks, best effort; a task
that dies leaves a pending span that no ACK will ever commit, which readers never deliver.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import WriterCommitMessage

from broker.client.append_service import AppendService
from broker.client.appender import append
from broker.client.async_append import AsyncAppend
from broker.client.route_cache import JournalClient
from broker.protocol import labels
from broker.protocol import protocol_pb2 as pb
from gazette_consumer.message.json_framing import JSONFraming
from gazette_consumer.message.mapping import Partition
from gazette_consumer.message.publisher import Publisher
from gazette_consumer.message.uuid import Flag, ProducerID, build_uuid, get_clock, new_producer_id
from spark_integration.journal_io import run_with_client
from spark_integration.options import WriteOptions
from spark_integration.raw_json import UUID_FIELD, JSONRow
from spark_integration.rows import publish_row

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PublishedTxn(WriterCommitMessage):  # type: ignore[misc]
    """What one task attempt published: its producer (hex), the number of rows, and per journal
    the framed ACK that commits them and the one that rolls them back."""

    producer: str
    rows: int
    acks: dict[str, bytes] = field(default_factory=dict)
    rollbacks: dict[str, bytes] = field(default_factory=dict)


@dataclass(frozen=True)
class RowShape:
    """How rows map to messages: a "content" column of JSON, or every column; the journal of
    option "journal", or each row's "journal" column."""

    content_column: bool
    journal_column: bool
    journal: str


def _ack(framing: JSONFraming, producer: ProducerID, clock: int) -> bytes:
    return framing.marshal(JSONRow({UUID_FIELD: str(build_uuid(producer, clock, Flag.ACK_TXN))}))


def _mapping_to(journal: str) -> Callable[[Any], Partition]:
    """The Publisher's mapping of a message to `journal` (the row chose it already)."""
    partition = Partition(journal, labels.CONTENT_TYPE_JSON_LINES)
    return lambda _message: partition


async def append_acks(client: JournalClient, acks: dict[str, list[bytes]]) -> None:
    """Append each journal's ACKs, all of a journal in one append. A retried append may land
    twice: readers take a repeated ACK (the clock they last acknowledged) as a rollback of
    whatever the producer began since, which is nothing: it publishes no more."""
    await asyncio.gather(
        *(
            append(client, pb.AppendRequest(journal=journal), b"".join(pieces))
            for journal, pieces in acks.items()
        )
    )


async def _publish(client: JournalClient, shape: RowShape, rows: Iterator[Any]) -> PublishedTxn:
    producer = new_producer_id()
    framing = JSONFraming()
    first_clock: dict[str, int] = {}
    batches: dict[int, AsyncAppend] = {}  # The distinct batches our messages joined.
    count = 0
    async with AppendService(client) as service:
        publisher = Publisher(service, producer_id=producer)
        try:
            for row in rows:
                journal, message = publish_row(
                    row,
                    content_column=shape.content_column,
                    journal_column=shape.journal_column,
                    journal=shape.journal,
                )
                batch = await publisher.publish_uncommitted(_mapping_to(journal), message)
                batches.setdefault(id(batch), batch)
                if journal not in first_clock:
                    first_clock[journal] = get_clock(message.get_uuid())  # type: ignore[arg-type]
                count += 1
            for batch in list(batches.values()):
                await batch  # Raises the typed error of a batch that failed.
        except BaseException:
            rollbacks = {j: [_ack(framing, producer, c - 1)] for j, c in first_clock.items()}
            try:
                await append_acks(client, rollbacks)
            except Exception as err:  # The task's own error is what matters.
                _log.warning("gazette: rollback of a failed write task failed: %s", err)
            raise
        acks = publisher.build_ack_intents()
    return PublishedTxn(
        producer=producer.hex(),
        rows=count,
        acks=acks,
        rollbacks={j: _ack(framing, producer, c - 1) for j, c in first_clock.items()},
    )


def publish_partition(opts: WriteOptions, shape: RowShape, rows: Iterator[Any]) -> PublishedTxn:
    return run_with_client(opts.broker, lambda client: _publish(client, shape, rows))
