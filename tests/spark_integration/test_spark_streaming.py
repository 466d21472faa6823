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
    # Three micro-batches read messages; each wrote its rows and one ACK, once. The restarted
    # run's commit also closed what the first run's producer might have left open: one more.
    assert uuid_flags(read_all(broker, sink)).count(2) == 4
