"""Writes to CSV journals through Spark: rows become CSV records (the UUID first, then the
columns, no header) committed exactly once, batch and streaming, read back by batch and
streaming reads; a protobuf journal is refused by name, with nothing written. Counts are taken
by Gazette's consumer Sequencer over the raw journal (committed_csv), apart from the data
source's own read path."""

from __future__ import annotations

import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest

from broker.protocol import labels
from gazette_consumer.message.csv_framing import CSVFraming, parse_record
from gazette_consumer.message.uuid import get_flags
from spark_integration.journal_io import GazetteJournalError
from tests.spark_integration.spark_testkit import (
    TextSource,
    committed,
    copy_with_micro_batch_0_twice,
    create_journals,
    framed,
    read_all,
    reader,
    start_copy,
    unique,
    write_batch,
)

pytestmark = pytest.mark.spark
CSV = labels.CONTENT_TYPE_CSV
TRICKY = ["plain", "comma, inside", 'say "hi"', " leading space", "new\nline", "", "é ☃"]


def csv_records(broker: str, journal: str) -> list[list[str]]:
    """Every record of the journal, framed by Gazette's CSV framing (ACKs included)."""
    events = framed(CSVFraming(), broker, journal)
    return [parse_record(e.data.decode().removesuffix("\n")) for e in events]


def committed_csv(broker: str, journal: str) -> list[list[str]]:
    """The fields after the UUID of the journal's committed records (spark_testkit.committed)."""
    records = csv_records(broker, journal)
    assert len({len(r) for r in records}) <= 1, "records of several widths: unreadable"
    return committed(journal, [(uuid.UUID(r[0]), r[1:]) for r in records])


def stream_read(spark: Any, broker: str, journal: str, schema: str, work: Path) -> list[Any]:
    """The journal read by a streaming query (Trigger.AvailableNow), as parquet rows."""
    query = (
        spark.readStream.format("gazette")
        .option("broker", broker)
        .option("journals", journal)
        .schema(schema)
        .load()
        .writeStream.format("parquet")
        .option("path", str(work / "out"))
        .option("checkpointLocation", str(work / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return list(spark.read.parquet(str(work / "out")).collect())


def test_a_batch_write_to_a_csv_journal_reads_back_exactly_once(
    spark: Any, broker: str, tmp_path: Path
) -> None:
    journal = unique("spark/csv-write")
    create_journals(broker, [journal], content_type=CSV)
    rows = [(TRICKY[i % len(TRICKY)], i, i % 2 == 0) for i in range(40)]
    df = spark.createDataFrame(rows, "key STRING, n LONG, ok BOOLEAN").repartition(2)

    write_batch(df, broker, journal)

    expected = sorted(rows, key=lambda r: r[1])
    assert sorted(committed_csv(broker, journal), key=lambda r: int(r[1])) == [
        [k, str(n), str(ok).lower()] for k, n, ok in expected
    ]
    schema = "key STRING, n LONG, ok BOOLEAN"
    got = reader(spark, broker, journals=journal).schema(schema).load().collect()
    assert sorted((r.key, r.n, r.ok) for r in got) == sorted(expected)
    streamed = stream_read(spark, broker, journal, schema, tmp_path)
    assert sorted((r.key, r.n, r.ok) for r in streamed) == sorted(expected)
    # No header; each task's rows then the driver's ACK per task, as wide as the rows.
    flags = [get_flags(uuid.UUID(r[0])) for r in csv_records(broker, journal)]
    assert flags.count(1) == 40 and flags.count(2) == 2 and flags[-2:] == [2, 2]


def test_a_task_that_fails_once_writes_its_csv_rows_once(spark: Any, broker: str) -> None:
    """The first attempt of a task fails after appending rows; its retry's are committed, the
    failed attempt's rolled back by a CSV record as wide as the rows (else readers fail)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    journal = unique("spark/csv-retry")
    create_journals(broker, [journal], content_type=CSV)
    pad = "x" * 20_000  # Rows big enough that the task appends before it fails.

    def fails_once(key):  # type: ignore[no-untyped-def]
        from pyspark import TaskContext

        if TaskContext.get().attemptNumber() == 0 and key == "k-150":
            raise RuntimeError("this attempt fails")
        return key

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # PySpark and the installed pandas.
        flaky = F.udf(fails_once, StringType())
        df = (
            spark.createDataFrame([(f"k-{i}", pad) for i in range(200)], "key STRING, pad STRING")
            .coalesce(1)
            .select(flaky("key").alias("key"), "pad")
        )
    batch_rows = "spark.sql.execution.arrow.maxRecordsPerBatch"
    spark.conf.set(batch_rows, "20")
    try:
        write_batch(df, broker, journal)
    finally:
        spark.conf.unset(batch_rows)

    assert sorted(r[0] for r in committed_csv(broker, journal)) == sorted(
        f"k-{i}" for i in range(200)
    )
    assert len(csv_records(broker, journal)) > 200 + 1  # The failed attempt's rows are there.
    got = reader(spark, broker, journals=journal).schema("key STRING").load().collect()
    assert sorted(r.key for r in got) == sorted(f"k-{i}" for i in range(200))


def test_a_streaming_write_to_a_csv_journal_commits_each_micro_batch_once(
    spark: Any, broker: str, tmp_path: Path
) -> None:
    """JSON messages copied to a CSV journal by a streaming query, whose micro-batch 0 runs
    again after a restart (Spark's record of it deleted, as a driver that died after the
    sink's commit leaves it): each row is committed once."""
    source, sink = unique("spark/csv-src"), unique("spark/csv-sink")
    create_journals(broker, [source])
    create_journals(broker, [sink], content_type=CSV)
    texts = TextSource(broker, source)

    def start() -> Any:
        return start_copy(spark, broker, source, sink, tmp_path / "cp")

    expected = texts.add([f"a-{i}" for i in range(30)] + TRICKY[:-2])
    more = [f"b-{i}" for i in range(20)]
    copy_with_micro_batch_0_twice(start, tmp_path / "cp", lambda: expected.extend(texts.add(more)))

    want = sorted((t, len(t)) for t in expected)
    assert sorted((t, int(n)) for t, n in committed_csv(broker, sink)) == want
    schema = "text STRING, n LONG"
    got = reader(spark, broker, journals=sink).schema(schema).load().collect()
    assert sorted((r.text, r.n) for r in got) == want
    streamed = stream_read(spark, broker, sink, schema, tmp_path / "read")
    assert sorted((r.text, r.n) for r in streamed) == want


def test_a_protobuf_journal_is_refused_with_nothing_written(spark: Any, broker: str) -> None:
    from spark_integration import GazetteDataSource

    journal = unique("spark/proto-write")
    create_journals(broker, [journal], content_type=labels.CONTENT_TYPE_PROTO_FIXED)
    csv_journal = unique("spark/csv-content")
    create_journals(broker, [csv_journal], content_type=CSV)
    # What Spark calls on the driver, called directly (a failing query costs a Python worker).
    schema = spark.createDataFrame([], "key STRING, n LONG").schema
    with pytest.raises(GazetteJournalError, match="writes application/x-ndjson and text/csv"):
        GazetteDataSource({"broker": broker, "journal": journal}).writer(schema, False)
    content = spark.createDataFrame([], "content STRING").schema
    with pytest.raises(GazetteJournalError, match="'content' column"):
        GazetteDataSource({"broker": broker, "journal": csv_journal}).writer(content, False)
    # Named by a journal column, the task refuses it before appending anything.
    routed = spark.createDataFrame([(journal, "a", 1)], "journal STRING, key STRING, n LONG")
    with pytest.raises(Exception, match="writes application/x-ndjson and text/csv"):
        routed.write.format("gazette").mode("append").option("broker", broker).save()

    assert read_all(broker, journal) == b"" and read_all(broker, csv_journal) == b""
