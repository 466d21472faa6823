"""Rate limits of streaming reads: maxMessagesPerTrigger and maxBytesPerTrigger bound each
micro-batch, and the micro-batches together deliver every committed message once."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from gazette_consumer.message.clock import clock_from_unix_nanos
from tests.spark_integration.spark_testkit import (
    OUTSIDE,
    Msg,
    append_messages,
    create_journals,
    producer,
    unique,
)

pytestmark = pytest.mark.spark


def thirty_messages(broker: str, journal: str) -> tuple[list[str], int]:
    """Thirty OUTSIDE_TXN messages of equal length; their texts and that length."""
    writer, clock = producer(), clock_from_unix_nanos(time.time_ns())
    messages = [Msg(writer, clock + i, OUTSIDE, {"text": f"m{i:02d}"}) for i in range(30)]
    spans = append_messages(broker, journal, messages, together=True)
    lengths = {end - begin for begin, end in spans}
    assert len(lengths) == 1
    return [f"m{i:02d}" for i in range(30)], lengths.pop()


def run_limited(spark: Any, broker: str, journal: str, cp: Path, **options: str) -> list[list[str]]:
    """The texts of each non-empty micro-batch of a query reading `journal` to its end."""
    batches: list[list[str]] = []

    def collect(frame: Any, batch_id: int) -> None:
        got = [json.loads(r.content)["text"] for r in frame.orderBy("offset").collect()]
        if got:
            batches.append(got)

    stream = spark.readStream.format("gazette").option("broker", broker)
    for name, value in {"journals": journal, "idleWaitMs": "0", **options}.items():
        stream = stream.option(name, value)
    query = (
        stream.load().writeStream.foreachBatch(collect).option("checkpointLocation", str(cp))
    ).start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    return batches


def test_max_messages_per_trigger(spark, broker, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    journal = unique("spark/rate")
    create_journals(broker, [journal])
    expected, _length = thirty_messages(broker, journal)

    batches = run_limited(spark, broker, journal, tmp_path / "cp", maxMessagesPerTrigger="8")

    assert [len(b) for b in batches] == [8, 8, 8, 6]
    assert [t for b in batches for t in b] == expected


def test_max_bytes_per_trigger(spark, broker, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    journal = unique("spark/rate")
    create_journals(broker, [journal])
    expected, length = thirty_messages(broker, journal)

    # Room for 7 messages and a half: a micro-batch takes the 7 that fit whole.
    limit = str(7 * length + length // 2)
    batches = run_limited(spark, broker, journal, tmp_path / "cp", maxBytesPerTrigger=limit)

    assert [len(b) for b in batches] == [7, 7, 7, 7, 2]
    assert [t for b in batches for t in b] == expected
