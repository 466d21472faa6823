"""Review reproducer: a batch write over two journals is not committed "whole, or not at all".

GazetteBatchWriter.commit appends each journal's ACKs independently (publish.append_acks, an
asyncio.gather of one append per journal). If one journal's ACK append fails (here: the journal
was made read-only by an operator between the tasks and the driver's commit; equally a broker
down past the append's retries), the other journal's ACK has already landed: its rows are
visible to every read-committed reader, the job fails, and Spark's abort (called with the same
messages after a failed commit) appends rollback ACKs at the base clock, which readers ignore
(an ACK older than the producer's last ACK). docs/spark.md claims: "A batch write is committed
whole, or not at all | always".

Runs against the real broker process of the Spark tests, without Spark: the writer's methods are
called as Spark calls them (write per task, then commit, then abort when commit raised).
"""

from __future__ import annotations

import asyncio

import pyarrow as pa
import pytest
from pyspark.sql.types import StringType, StructField, StructType

from broker.client import JournalClient, apply_journals, upsert
from broker.client.list_apply import list_journals
from broker.protocol import protocol_pb2 as pb
from spark_integration.options import parse_write_options
from spark_integration.write import GazetteBatchWriter
from tests.spark_integration.spark_testkit import committed_texts, create_journals, unique

# An open defect, found by review on 2026-11-28 (docs/spark.md, "Open defects"). Not strict:
# the commit appends to both journals at once and ends when the refused one fails, so the other
# journal's ACK lands in most runs (the defect shown), not in all (about one run in six here).
pytestmark = pytest.mark.xfail(
    strict=False,
    reason="open defect: a batch write's commit is per journal: a failed commit leaves other journals committed",
)


def _set_read_only(broker: str, journal: str) -> None:
    async def go() -> None:
        client = JournalClient(broker)
        try:
            listing = await list_journals(client, f"name={journal}")
            (found,) = [j for j in listing.journals if j.spec.name == journal]
            spec = pb.JournalSpec()
            spec.CopyFrom(found.spec)
            spec.flags = pb.JournalSpec.O_RDONLY
            await apply_journals(client, [upsert(spec, found.mod_revision)])
        finally:
            await client.close()

    asyncio.run(go())


def test_batch_write_to_two_journals_is_all_or_nothing(broker: str) -> None:
    j1, j2 = unique("review/a"), unique("review/b")
    create_journals(broker, [j1, j2])
    schema = StructType([StructField("journal", StringType()), StructField("text", StringType())])
    writer = GazetteBatchWriter(parse_write_options({"broker": broker}), schema, False)

    # Two tasks, one per journal (rows routed by the `journal` column).
    def batch(journal: str, texts: list[str]) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict({"journal": [journal] * len(texts), "text": texts})

    messages = [
        writer.write(iter([batch(j1, ["a-0", "a-1", "a-2"])])),
        writer.write(iter([batch(j2, ["b-0", "b-1"])])),
    ]
    # Between the tasks and the driver's commit, j2 stops taking appends.
    _set_read_only(broker, j2)

    with pytest.raises(Exception) as failed:
        writer.commit(messages)
    try:  # Spark's V2 write calls abort(messages) after a commit that raised.
        writer.abort(messages)
    except Exception:
        pass

    # The job failed, yet j1's rows are committed: the write was not all-or-nothing.
    visible = committed_texts(broker, j1)
    assert visible == [], (
        f"job failed with {type(failed.value).__name__}: {failed.value!s:.200}; yet read-committed"
        f" readers of {j1} see {visible}"
    )
