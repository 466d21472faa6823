"""Streaming: micro-batches deliver each committed message once, across batch boundaries and a
restart from the checkpoint (the sink's own guarantees: test_spark_sink.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gazette_consumer.message.clock import clock_from_unix_nanos
from tests.spark_integration.spark_testkit import (
    ACK,
    CONTINUE,
    OUTSIDE,
    Msg,
    append_messages,
    create_journals,
    producer,
    read_all,
    reader,
    unique,
    uuid_flags,
)

pytestmark = pytest.mark.spark


def _stream(spark, broker: str, journal: str):  # type: ignore[no-untyped-def]
    return spark.readStream.format("gazette").option("broker", broker).option("journals", journal)


def test_stream_exactly_once_across_batches_and_restart(spark, broker, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A query reads a journal as a stream and writes what it reads to another journal with the
    gazette sink; read back (batch, read-committed), the sink holds each committed message of
    the source once, across micro-batches and a restart from the checkpoint."""
    source, sink = unique("spark/stream"), unique("spark/sink")
    create_journals(broker, [source, sink])
    a, b = producer(), producer()
    base = clock_from_unix_nanos(time.time_ns())
    append_messages(
        broker,
        source,
        [
            Msg(a, base + 1, OUTSIDE, {"text": "a1"}),
            Msg(b, base + 10, CONTINUE, {"text": "b1"}),  # b's transaction is still open
            Msg(b, base + 11, CONTINUE, {"text": "b2"}),  # when the first batch is planned.
        ],
    )

    def start(**trigger: bool):  # type: ignore[no-untyped-def]
        writer = (
            _stream(spark, broker, source)
            .load()
            .selectExpr("content")
            .writeStream.format("gazette")
            .option("broker", broker)
            .option("journal", sink)
            .option("checkpointLocation", str(tmp_path / "cp"))
        )
        return (writer.trigger(**trigger) if trigger else writer).start()

    def written() -> list[str]:
        rows = reader(spark, broker, journals=sink).load().orderBy("offset").collect()
        return [json.loads(r.content)["text"] for r in rows]

    query = start()
    try:
        query.processAllAvailable()
        assert written() == ["a1"]

        # Between batches: b's ACK (committing messages of the previous batch's range), a
        # duplicate of a1, and a new message.
        append_messages(
            broker,
            source,
            [
                Msg(b, base + 12, ACK),
                Msg(a, base + 1, OUTSIDE, {"text": "a1"}),
                Msg(a, base + 2, OUTSIDE, {"text": "a2"}),
            ],
            together=True,  # So that one micro-batch reads them (for the count of ACKs).
        )
        query.processAllAvailable()
        assert written() == ["a1", "b1", "b2", "a2"]
    finally:
        query.stop()

    # Restart from the checkpoint with Trigger.AvailableNow: only what came since is read, and
    # producer states survive the restart (a's duplicate is dropped again).
    append_messages(
        broker,
        source,
        [Msg(a, base + 2, OUTSIDE, {"text": "a2"}), Msg(a, base + 3, OUTSIDE, {"text": "a3"})],
    )
    restarted = start(availableNow=True)
    assert restarted.awaitTermination(60)
    assert written() == ["a1", "b1", "b2", "a2", "a3"]
    # Three micro-batches read messages; each wrote its rows and one ACK, once. The first run
    # left nothing open (no claim in the sink), so the restarted run's commit closes nothing.
    assert uuid_flags(read_all(broker, sink)).count(2) == 3


def test_restart_before_micro_batch_0_commits_keeps_its_rows(spark, broker, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A query starting at `latest` that dies after Spark logged a micro-batch 0 of rows but
    before the batch committed runs micro-batch 0 again when restarted, its end from the
    offset log and its start asked of the source afresh (at the new write head): the restarted
    query must deliver micro-batch 0's rows, then what came after. Before, micro-batch 0 came
    out empty, without an error. (Such a checkpoint is made from a real run's: the offset log
    entry of its batch of rows becomes micro-batch 0's, and Spark's commit records go.)"""
    journal = unique("spark/stream-latest")
    create_journals(broker, [journal])
    p = producer()
    clock = clock_from_unix_nanos(time.time_ns())

    def add(*texts: str) -> None:
        nonlocal clock
        messages = []
        for text in texts:
            clock += 1
            messages.append(Msg(p, clock, OUTSIDE, {"text": text}))
        # In one append: the running query's next micro-batch holds all of them or none.
        append_messages(broker, journal, messages, together=True)

    add("before-start")
    checkpoint = tmp_path / "cp"
    delivered: list[tuple[int, str]] = []  # (micro-batch, text), as the sink saw them

    def collect(frame, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        delivered.extend((batch_id, json.loads(r.content)["text"]) for r in frame.collect())

    def start():  # type: ignore[no-untyped-def]
        return (
            _stream(spark, broker, journal)
            .option("startingOffsets", "latest")
            .load()
            .selectExpr("content")
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(checkpoint))
            .start()
        )

    query = start()
    try:
        query.processAllAvailable()  # Started at the head: nothing yet.
        add("a1", "a2")
        query.processAllAvailable()
    finally:
        query.stop()
    assert [text for _, text in delivered] == ["a1", "a2"]
    (batch,) = {batch for batch, _ in delivered}
    # The checkpoint of a query that died after logging a micro-batch 0 holding a1, a2.
    offsets, commits = checkpoint / "offsets", checkpoint / "commits"
    (offsets / "0").write_text((offsets / str(batch)).read_text())
    for log in (offsets, commits):
        for record in log.iterdir():
            if record.name != "0" or log == commits:
                record.unlink()  # Other entries, Spark's checksums (of the old 0 too).
    add("b1")  # The journal's head moves on before the restart.
    delivered.clear()
    query = start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert delivered == [(0, "a1"), (0, "a2"), (1, "b1")]


def test_scheduled_available_now_runs_from_latest_miss_nothing(
    spark, broker, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """A scheduled Trigger.AvailableNow job starting at `latest`, whose first run finds
    nothing: what is appended before its next run is read by it. A review (2026-11-29) feared
    that the start, asked of the source afresh by each run until Spark logs a micro-batch,
    would move to each run's head; Spark logs a query's first micro-batch (of no rows here)
    whatever the source answers, which fixes the start. Held here so that it stays so."""
    journal = unique("spark/stream-scheduled")
    create_journals(broker, [journal])
    p = producer()
    clock = clock_from_unix_nanos(time.time_ns())

    def add(text: str) -> None:
        nonlocal clock
        clock += 1
        append_messages(broker, journal, [Msg(p, clock, OUTSIDE, {"text": text})])

    delivered: list[str] = []

    def collect(frame, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        delivered.extend(json.loads(r.content)["text"] for r in frame.collect())

    def run() -> None:
        query = (
            _stream(spark, broker, journal)
            .option("startingOffsets", "latest")
            .load()
            .selectExpr("content")
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(tmp_path / "cp"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(120)

    add("before-the-first-run")
    run()  # Finds nothing new.
    assert delivered == []
    add("between-runs")
    run()
    assert delivered == ["between-runs"]
