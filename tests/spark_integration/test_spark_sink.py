"""The streaming sink through Spark: each micro-batch committed exactly once across a task that
fails once, a restart that re-runs a committed micro-batch, a checkpoint reset, and two queries
writing one journal at once. Counts are taken by Gazette's consumer reader (committed_texts),
independently of the data source."""

from __future__ import annotations

import json
import shutil
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gazette_consumer.message.clock import clock_from_unix_nanos
from tests.spark_integration.spark_testkit import (
    OUTSIDE,
    Msg,
    append_messages,
    committed_texts,
    create_journals,
    producer,
    read_all,
    unique,
    uuid_flags,
)

pytestmark = pytest.mark.spark


class Source:
    """A source journal of OUTSIDE_TXN messages {"text": ...}, appended in rounds."""

    def __init__(self, broker: str, prefix: str = "spark/src") -> None:
        self.broker, self.journal = broker, unique(prefix)
        create_journals(broker, [self.journal])
        self.producer = producer()
        self.clock = clock_from_unix_nanos(time.time_ns())

    def add(self, texts: list[str], **fields: Any) -> list[str]:
        messages = []
        for text in texts:
            self.clock += 1
            messages.append(Msg(self.producer, self.clock, OUTSIDE, {"text": text, **fields}))
        append_messages(self.broker, self.journal, messages, together=True)
        return texts


def start(spark: Any, broker: str, journals: str, sink: str, cp: Path, **opts: str) -> Any:
    stream = spark.readStream.format("gazette").option("broker", broker)
    for name, value in {"journals": journals, **opts}.items():
        stream = stream.option(name, value)
    return (
        stream.load()
        .selectExpr("content")
        .writeStream.format("gazette")
        .option("broker", broker)
        .option("journal", sink)
        .option("checkpointLocation", str(cp))
        .start()
    )


def run(query: Any) -> None:
    try:
        query.processAllAvailable()
    finally:
        query.stop()


def test_checkpoint_reset_is_a_new_query(spark, broker, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Deleting the checkpoint makes a new query, whose micro-batches count from 0 again:
    they are committed like the first query's were. (Here the new query reads another
    journal, so that its micro-batch 0 has rows, as the first query's had.)"""
    first_source, second_source = Source(broker), Source(broker)
    sink = unique("spark/sink")
    create_journals(broker, [sink])
    cp = tmp_path / "cp"
    first = first_source.add([f"first-{i}" for i in range(50)])
    run(start(spark, broker, first_source.journal, sink, cp))
    shutil.rmtree(cp)

    second = second_source.add([f"second-{i}" for i in range(50)])
    run(start(spark, broker, second_source.journal, sink, cp))

    assert sorted(committed_texts(broker, sink)) == sorted(first + second)


def test_a_rerun_micro_batch_commits_once(spark, broker, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The driver dies after the sink committed micro-batch 0 but before Spark recorded it
    (done here by deleting Spark's record): the restarted query runs micro-batch 0 again.
    Neither that run nor the next micro-batch, under the same producers, commits it twice."""
    source = Source(broker)
    sink = unique("spark/sink")
    create_journals(broker, [sink])
    cp = tmp_path / "cp"
    first = source.add([f"a-{i}" for i in range(30)])
    run(start(spark, broker, source.journal, sink, cp))
    for record in ("0", ".0.crc"):  # Spark's record of micro-batch 0, and its checksum.
        (cp / "commits" / record).unlink()

    query = start(spark, broker, source.journal, sink, cp)
    try:
        query.processAllAvailable()  # Micro-batch 0 again.
        second = source.add([f"b-{i}" for i in range(30)])
        query.processAllAvailable()
    finally:
        query.stop()

    assert sorted(committed_texts(broker, sink)) == sorted(first + second)
    # The re-run published micro-batch 0's rows again: they are in the journal, rolled back.
    assert uuid_flags(read_all(broker, sink)).count(1) == 90


def test_a_checkpoint_restored_from_an_older_copy_that_re_plans_is_refused(  # type: ignore[no-untyped-def]
    spark, broker, tmp_path: Path
) -> None:
    """The query's checkpoint is restored from a copy taken after micro-batch 0, once
    micro-batch 1 (b) committed, and more rows (c) arrived since: Spark re-plans micro-batch 1
    over b and c. Rolled back as committed already, c would be lost without an error (found by
    review, 2026-11-29); the sink refuses the micro-batch instead, and the query fails saying
    why. Nothing of it is committed."""
    source = Source(broker)
    sink = unique("spark/sink")
    create_journals(broker, [sink])
    cp, backup = tmp_path / "cp", tmp_path / "backup"
    first = source.add([f"a-{i}" for i in range(10)])
    run(start(spark, broker, source.journal, sink, cp))
    shutil.copytree(cp, backup)
    second = source.add([f"b-{i}" for i in range(10)])
    run(start(spark, broker, source.journal, sink, cp))
    assert sorted(committed_texts(broker, sink)) == sorted(first + second)

    shutil.rmtree(cp)
    shutil.copytree(backup, cp)
    source.add([f"c-{i}" for i in range(10)])
    query = start(spark, broker, source.journal, sink, cp)
    with pytest.raises(Exception, match="planned the micro-batch differently") as raised:
        run(query)
    assert "committed 10 rows of it" in str(raised.value)
    assert "holds 20" in str(raised.value)
    assert sorted(committed_texts(broker, sink)) == sorted(first + second)


def test_a_task_that_fails_once_commits_once(spark, broker, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Partition 0's first attempt fails midway, after publishing some rows; its retry
    commits. The next micro-batch's first attempt publishes under the failed attempt's producer
    again: what the failed attempt left is never committed."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    sources = [Source(broker), Source(broker)]  # One partition each.
    sink = unique("spark/sink")
    create_journals(broker, [sink])
    pad = "x" * 20_000  # Rows big enough that a task appends before it has read them all.

    def fails_once(content):  # type: ignore[no-untyped-def]  # (Hints would ask for Arrow.)
        from pyspark import TaskContext

        context = TaskContext.get()
        if context.attemptNumber() == 0 and json.loads(content)["text"] == "fail-here":
            raise RuntimeError("this attempt fails")
        return content

    expected = sources[0].add([f"s0-{i}" for i in range(150)], pad=pad)
    expected += sources[0].add(["fail-here"]) + sources[0].add([f"s0-late-{i}" for i in range(50)])
    expected += sources[1].add([f"s1-{i}" for i in range(40)])
    with warnings.catch_warnings():
        # PySpark warns, making a UDF, that it does not yet support the installed pandas.
        warnings.simplefilter("ignore", FutureWarning)
        flaky = F.udf(fails_once, StringType())
        stream = (
            spark.readStream.format("gazette")
            .option("broker", broker)
            .option("journals", ",".join(s.journal for s in sources))
            .load()
            .select(flaky("content").alias("content"))
        )
    # The writer is handed rows in batches of this many: a few, so that the failing attempt
    # has appended rows (1 MiB at a time) before the row it fails at.
    batch_rows = "spark.sql.execution.arrow.maxRecordsPerBatch"
    spark.conf.set(batch_rows, "20")
    try:
        query = (
            stream.writeStream.format("gazette")
            .option("broker", broker)
            .option("journal", sink)
            .option("checkpointLocation", str(tmp_path / "cp"))
            .start()
        )
        try:
            query.processAllAvailable()
            expected += sources[0].add([f"next-{i}" for i in range(20)])
            query.processAllAvailable()
        finally:
            query.stop()
    finally:
        spark.conf.unset(batch_rows)

    assert sorted(committed_texts(broker, sink)) == sorted(expected)
    # What the failed attempt appended before Spark gave up on it is in the journal too, never
    # committed. It may have appended nothing: Spark retries the task as soon as the UDF
    # fails, and the attempt's Python worker, still draining the rows it was handed, may reach
    # its first append only after the micro-batch is committed; it is refused then
    # (test_sink_commit.py's late attempts), and its rows were never appended.
    content = read_all(broker, sink)
    texts = [json.loads(line).get("text") for line in content.splitlines()]
    surplus = Counter(t for t in texts if t is not None) - Counter(expected)
    assert set(surplus) <= {f"s0-{i}" for i in range(150)}, surplus
    assert uuid_flags(content).count(1) == len(expected) + surplus.total()


def test_two_queries_write_one_journal(spark, broker, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Two queries run at once, writing the same journal: every row of each is committed
    once (each query commits through a register of its own)."""
    one, two = Source(broker), Source(broker)
    sink = unique("spark/sink")
    create_journals(broker, [sink])
    queries = [
        start(spark, broker, one.journal, sink, tmp_path / "one"),
        start(spark, broker, two.journal, sink, tmp_path / "two"),
    ]
    expected: list[str] = []
    try:
        for round_ in range(3):
            expected += one.add([f"one-{round_}-{i}" for i in range(20)])
            expected += two.add([f"two-{round_}-{i}" for i in range(20)])
            for query in queries:
                query.processAllAvailable()
    finally:
        for query in queries:
            query.stop()

    assert sorted(committed_texts(broker, sink)) == sorted(expected)


def test_a_query_checkpointed_by_the_session_setting(spark, broker, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """With only spark.sql.streaming.checkpointLocation set (no checkpointLocation option),
    the sink needs nothing more: the query is identified by its id, kept in the checkpoint
    Spark makes under that location (named by the query's name)."""
    source = Source(broker)
    sink = unique("spark/sink")
    create_journals(broker, [sink])
    setting = "spark.sql.streaming.checkpointLocation"
    spark.conf.set(setting, str(tmp_path / "checkpoints"))
    try:
        expected = source.add([f"r-{i}" for i in range(10)])
        for _ in range(2):  # The second run restarts from the checkpoint: nothing new.
            stream = spark.readStream.format("gazette").option("broker", broker)
            run(
                stream.option("journals", source.journal)
                .load()
                .selectExpr("content")
                .writeStream.format("gazette")
                .queryName("copy")
                .option("broker", broker)
                .option("journal", sink)
                .start()
            )
    finally:
        spark.conf.unset(setting)

    assert sorted(committed_texts(broker, sink)) == sorted(expected)
    assert (tmp_path / "checkpoints" / "copy" / "commits" / "0").exists()
