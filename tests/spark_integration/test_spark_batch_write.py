"""Batch writes: rows land exactly once, as uncommitted messages acknowledged by the driver; an
aborted write leaves nothing a read-committed reader sees."""

from __future__ import annotations

import json

import pytest

from tests.spark_integration.spark_testkit import (
    create_journals,
    read_all,
    reader,
    unique,
    uuid_flags,
)

pytestmark = pytest.mark.spark


def test_write_content_column_then_read_back_exactly_once(spark, broker) -> None:  # type: ignore[no-untyped-def]
    journal = unique("spark/write")
    create_journals(broker, [journal])
    rows = [(json.dumps({"k": i, "v": f"value-{i}"}),) for i in range(40)]
    df = spark.createDataFrame(rows, "content STRING").repartition(2)

    df.write.format("gazette").mode("append").option("broker", broker).option(
        "journal", journal
    ).save()

    back = reader(spark, broker, journals=journal).load().collect()
    assert sorted(json.loads(r.content)["k"] for r in back) == list(range(40))
    # On the wire: each task's rows as one transaction, then the driver's ACK per task.
    flags = uuid_flags(read_all(broker, journal))
    assert flags.count(1) == 40
    assert flags.count(2) == 2
    assert flags[-2:] == [2, 2]  # ACKs come after every task's messages: the driver commits.


def test_write_all_columns_routed_by_journal_column(spark, broker) -> None:  # type: ignore[no-untyped-def]
    left, right = unique("spark/route"), unique("spark/route")
    create_journals(broker, [left, right])
    df = spark.createDataFrame(
        [(left if i % 3 else right, i, f"n{i}") for i in range(30)],
        "journal STRING, n LONG, s STRING",
    )

    df.write.format("gazette").mode("append").option("broker", broker).save()

    for journal, expected in (
        (left, [i for i in range(30) if i % 3]),
        (right, list(range(0, 30, 3))),
    ):
        got = reader(spark, broker, journals=journal).schema("n LONG, s STRING").load().collect()
        assert sorted((r.n, r.s) for r in got) == [(i, f"n{i}") for i in expected]
        # The routing column is not part of the message.
        raw = reader(spark, broker, journals=journal).load().first().content
        assert "journal" not in json.loads(raw)


def test_failed_write_leaves_nothing_visible(spark, broker) -> None:  # type: ignore[no-untyped-def]
    journal = unique("spark/abort")
    create_journals(broker, [journal])
    good = [(json.dumps({"k": i}),) for i in range(20)]
    # The last row is not a JSON object: its task fails, and the job aborts.
    df = spark.createDataFrame([*good, ("[1, 2]",)], "content STRING").coalesce(2)

    with pytest.raises(Exception, match="'content' is not a JSON object"):
        df.write.format("gazette").mode("append").option("broker", broker).option(
            "journal", journal
        ).save()

    assert reader(spark, broker, journals=journal).load().count() == 0
    # Whatever was appended (how much depends on how far the tasks got) is uncommitted.
    assert all(flag != 0 for flag in uuid_flags(read_all(broker, journal)))


def test_aborted_write_is_rolled_back(spark, broker) -> None:  # type: ignore[no-untyped-def]
    """The driver's half of an abort: a task published its rows (all appended, pending), and
    abort() appends its rollback. Spark calls write() and abort() as done here."""
    from pyspark.sql import Row

    from spark_integration.source import GazetteDataSource

    journal = unique("spark/abort")
    create_journals(broker, [journal])
    source = GazetteDataSource({"broker": broker, "journal": journal})
    schema = spark.createDataFrame([], "content STRING").schema
    writer = source.writer(schema, False)
    committed_task = writer.write(iter([Row(content=json.dumps({"k": i})) for i in range(5)]))
    aborted_task = writer.write(iter([Row(content=json.dumps({"k": i})) for i in range(5, 9)]))

    writer.abort([aborted_task, None])  # None: a task that failed and sent no message.
    assert uuid_flags(read_all(broker, journal)) == [1] * 9 + [2]
    assert reader(spark, broker, journals=journal).load().count() == 0

    # A later commit of the other task (a separate job in real life) still works, and the
    # rolled-back rows stay invisible.
    writer.commit([committed_task])
    got = reader(spark, broker, journals=journal).load().collect()
    assert sorted(json.loads(r.content)["k"] for r in got) == list(range(5))
