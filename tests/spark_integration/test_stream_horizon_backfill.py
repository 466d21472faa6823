"""A streaming query catching up on history older than producerHorizonSeconds remembers its
producers: a re-appended duplicate that lands in a later micro-batch (or a later partition of
one micro-batch) than its original is dropped.

Found by review (2026-11-28): stream_read.latestOffset computed the horizon from the driver's
wall clock, so every checkpoint of a backfill forgot every producer. Gazette's
Sequencer.Checkpoint(pruneHorizon) prunes producers relative to the newest producer state of
their journal, and so does ours now (`Sequencer.checkpoint`, a span of clock units).

Driven as Spark drives the source (latestOffset, partitions, read), in this process.
"""

from __future__ import annotations

import json
import time

from gazette_consumer.message.clock import clock_from_unix_nanos
from spark_integration.read_options import parse_read_options
from spark_integration.source import default_schema
from spark_integration.stream_read import GazetteStreamReader
from tests.spark_integration.spark_testkit import (
    OUTSIDE,
    Msg,
    append_messages,
    create_journals,
    micro_batch_texts,
    producer,
    unique,
)


def test_a_duplicate_in_a_later_micro_batch_of_a_backfill_is_dropped(broker: str) -> None:
    journal = unique("review/backfill")
    create_journals(broker, [journal])
    p = producer()
    three_days_ago = clock_from_unix_nanos(time.time_ns() - 3 * 86_400 * 10**9)
    original = Msg(p, three_days_ago + 1, OUTSIDE, {"text": "m1"})
    append_messages(
        broker, journal, [original, Msg(p, three_days_ago + 2, OUTSIDE, {"text": "m2"})]
    )

    opts = parse_read_options({"broker": broker, "journals": journal, "idleWaitMs": "0"}, "stream")
    reader = GazetteStreamReader(opts, default_schema(opts))
    first, end = micro_batch_texts(reader, reader.initialOffset())
    assert first == ["m1", "m2"]

    # m1's append is re-appended (an append retried after its answer was lost), and lands after
    # the first micro-batch was planned: a duplicate, by its producer and clock.
    append_messages(broker, journal, [original])
    second, _ = micro_batch_texts(reader, end)
    assert second == [], f"the duplicate of m1 was delivered again: {second}"


def test_a_duplicate_in_a_later_partition_of_one_backfill_micro_batch_is_dropped(
    broker: str,
) -> None:
    """The same within ONE micro-batch: its split checkpoints are taken with the same
    wall-clock horizon, so the partition after the split has forgotten the producer."""
    journal = unique("review/backfill-split")
    create_journals(broker, [journal])  # Fragments of 1 MiB: the next append rolls one.
    p = producer()
    clock = clock_from_unix_nanos(time.time_ns() - 3 * 86_400 * 10**9)
    original = Msg(p, clock + 1, OUTSIDE, {"text": "m1"})
    pad = [
        Msg(p, clock + 2 + i, OUTSIDE, {"text": f"pad-{i}", "x": "x" * 1000}) for i in range(1100)
    ]
    append_messages(broker, journal, [original, *pad], together=True)  # > 1 MiB: rolls next.
    append_messages(broker, journal, [original])  # A re-appended copy of m1, in a new fragment.

    opts = parse_read_options(
        {"broker": broker, "journals": journal, "idleWaitMs": "0", "minPartitions": "2"}, "stream"
    )
    reader = GazetteStreamReader(opts, default_schema(opts))
    start = reader.initialOffset()
    end = reader.latestOffset(start, None)
    parts = reader.partitions(start, end)
    assert len(parts) == 2, parts
    got = [
        json.loads(c)["text"]
        for part in parts
        for batch in reader.read(part)
        for c in batch.column("content").to_pylist()
    ]
    assert got.count("m1") == 1, f"m1 delivered {got.count('m1')} times in one micro-batch"
