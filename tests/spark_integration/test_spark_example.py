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
