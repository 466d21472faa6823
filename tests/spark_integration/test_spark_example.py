"""The example pipeline (examples/spark_pipeline) on the shared session: committed input only,
totals written once."""

from __future__ import annotations

import json
import time

import pytest

from examples.spark_pipeline.pipeline import run_pipeline
from gazette_consumer.message.clock import clock_from_unix_nanos
from tests.spark_integration.spark_testkit import (
    ACK,
    CONTINUE,
    OUTSIDE,
    Msg,
    append_messages,
    create_journals,
    producer,
    reader,
    unique,
)

pytestmark = pytest.mark.spark


def test_pipeline_aggregates_committed_input_once(spark, broker) -> None:  # type: ignore[no-untyped-def]
    source, sink = unique("spark/orders"), unique("spark/totals")
    create_journals(broker, [source, sink])
    p, txn, dropped = producer(), producer(), producer()
    base = clock_from_unix_nanos(time.time_ns())
    append_messages(
        broker,
        source,
        [
            Msg(p, base + 1, OUTSIDE, {"key": "apples", "n": 3}),
            Msg(p, base + 1, OUTSIDE, {"key": "apples", "n": 3}),  # Duplicate.
            Msg(p, base + 2, OUTSIDE, {"key": "pears"}),  # n defaults to 1.
            Msg(txn, base + 10, CONTINUE, {"key": "apples", "n": 4}),
            Msg(txn, base + 11, ACK),
            Msg(dropped, base + 20, CONTINUE, {"key": "pears", "n": 100}),  # Never acknowledged.
        ],
    )

    run_pipeline(spark, broker, source, sink)

    written = reader(spark, broker, journals=sink).load().collect()
    totals = sorted(
        (m["key"], m["total"], m["messages"]) for m in (json.loads(r.content) for r in written)
    )
    assert totals == [("apples", 7, 2), ("pears", 1, 1)]


def test_stream_example_copies_each_message_once(spark, broker, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The streaming example run twice on one checkpoint: the second run copies only what
    came since, and nothing is copied twice."""
    from examples.spark_pipeline.stream import run_stream

    source, sink = unique("spark/orders"), unique("spark/big")
    create_journals(broker, [source, sink])
    p = producer()
    base = clock_from_unix_nanos(time.time_ns())
    checkpoint = str(tmp_path / "cp")

    def big(n: int) -> Msg:
        return Msg(p, base + n, OUTSIDE, {"key": f"k{n}", "n": n})

    append_messages(broker, source, [big(1), big(2), big(3), big(2)])  # big(2) twice.
    run_stream(spark, broker, source, sink, checkpoint)
    append_messages(broker, source, [big(4), big(3)])  # big(3) again.
    run_stream(spark, broker, source, sink, checkpoint)

    copied = reader(spark, broker, journals=sink).load().collect()
    assert sorted(json.loads(r.content)["n"] for r in copied) == [2, 3, 4]
