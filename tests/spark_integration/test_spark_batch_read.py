"""Batch reads through Spark: read-committed drops duplicates, rolled-back and pending messages;
read-uncommitted returns every message; user schemas and format json parse the fields."""

from __future__ import annotations

import json
import time

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
    reader,
    unique,
)

pytestmark = pytest.mark.spark


def _layout() -> tuple[list[Msg], list[str]]:
    """Messages of four producers, and the texts a read-committed reader must return."""
    base = clock_from_unix_nanos(time.time_ns())
    a, b, c, d = producer(), producer(), producer(), producer()
    messages = [
        Msg(a, base + 1, OUTSIDE, {"text": "a1", "n": 1}),
        Msg(b, base + 10, CONTINUE, {"text": "b1", "n": 2}),
        Msg(a, base + 1, OUTSIDE, {"text": "a1", "n": 1}),  # A re-appended duplicate.
        Msg(c, base + 20, CONTINUE, {"text": "c1-rolled-back", "n": 3}),
        Msg(b, base + 11, CONTINUE, {"text": "b2", "n": 4}),
        Msg(a, base + 2, OUTSIDE, {"text": "a2", "n": 5}),
        Msg(b, base + 12, ACK),  # Commits b1, b2.
        Msg(c, base + 21, CONTINUE, {"text": "c2-rolled-back", "n": 6}),
        Msg(c, base + 19, ACK),  # The clock c started from: rolls c1, c2 back.
        Msg(b, base + 10, CONTINUE, {"text": "b1", "n": 2}),  # Duplicate after the commit.
        Msg(d, base + 30, CONTINUE, {"text": "d1-pending", "n": 7}),  # Never acknowledged.
    ]
    return messages, ["a1", "b1", "b2", "a2"]


def test_read_committed_drops_duplicates_rollbacks_and_pending(spark, broker) -> None:  # type: ignore[no-untyped-def]
    journal = unique("spark/read")
    create_journals(broker, [journal])
    messages, committed = _layout()
    spans = append_messages(broker, journal, messages)

    rows = reader(spark, broker, journals=journal).load().orderBy("offset").collect()

    assert [json.loads(r.content)["text"] for r in rows] == committed
    by_offset = {begin: m for (begin, _), m in zip(spans, messages, strict=True)}
    for row in rows:
        sent = by_offset[row.offset]  # Each row is the message at its offset.
        assert row.journal == journal
        assert row.producer == sent.producer.hex()
        assert row.clock == sent.clock
        assert json.loads(row.content)["UUID"] == row.uuid
    # Per-producer order and offsets: the first copies of a1 and b1 are the ones returned.
    assert [r.offset for r in rows] == sorted(
        by_offset_first(spans, messages, text) for text in committed
    )


def by_offset_first(spans: list[tuple[int, int]], messages: list[Msg], text: str) -> int:
    return next(
        begin
        for (begin, _), m in zip(spans, messages, strict=True)
        if m.fields and m.fields["text"] == text
    )


def test_read_uncommitted_returns_every_message(spark, broker) -> None:  # type: ignore[no-untyped-def]
    journal = unique("spark/read")
    create_journals(broker, [journal])
    messages, _ = _layout()
    spans = append_messages(broker, journal, messages)

    df = reader(spark, broker, journals=journal, isolation="read_uncommitted").load()
    rows = df.orderBy("offset").collect()

    assert [r.offset for r in rows] == [begin for begin, _ in spans]
    texts = [json.loads(r.content).get("text") for r in rows]
    assert texts == [m.fields["text"] if m.fields else None for m in messages]


def test_offset_range_and_selector(spark, broker) -> None:  # type: ignore[no-untyped-def]
    one, two = unique("spark/sel"), unique("spark/sel")
    create_journals(broker, [one, two])
    p = producer()
    base = clock_from_unix_nanos(time.time_ns())
    spans = append_messages(
        broker, one, [Msg(p, base + i, OUTSIDE, {"text": f"one-{i}"}) for i in range(4)]
    )
    append_messages(broker, two, [Msg(p, base + 9, OUTSIDE, {"text": "two"})])

    # Offsets [begin, end) of `one`: the middle two messages.
    ranged = reader(
        spark,
        broker,
        journals=one,
        begin=json.dumps({one: spans[1][0]}),
        end=json.dumps({one: spans[3][0]}),
    ).load()
    assert sorted(json.loads(r.content)["text"] for r in ranged.collect()) == ["one-1", "one-2"]

    # Both journals by label (each has a "test" label of its own; "app" is shared by all tests).
    selected = reader(
        spark, broker, selector=f"test in ({one.split('/')[-1]}, {two.split('/')[-1]})"
    ).load()
    assert selected.rdd.getNumPartitions() == 2  # One partition per journal.
    got = sorted((r.journal, json.loads(r.content)["text"]) for r in selected.collect())
    assert got == sorted([(one, f"one-{i}") for i in range(4)] + [(two, "two")])


def test_user_schema_and_json_format_parse_fields(spark, broker) -> None:  # type: ignore[no-untyped-def]
    journal = unique("spark/json")
    create_journals(broker, [journal])
    p = producer()
    base = clock_from_unix_nanos(time.time_ns())
    append_messages(
        broker,
        journal,
        [
            Msg(p, base + 1, OUTSIDE, {"user": "ann", "amount": 3, "tags": ["x"]}),
            Msg(p, base + 2, OUTSIDE, {"user": "bob", "amount": 2.5, "tags": []}),
            Msg(p, base + 3, OUTSIDE, {"user": "cid", "amount": "n/a"}),
        ],
    )

    schema = "offset LONG, user STRING, amount DOUBLE, tags ARRAY<STRING>"
    typed = reader(spark, broker, journals=journal).schema(schema).load().orderBy("offset")
    assert [tuple(r)[1:] for r in typed.collect()] == [
        ("ann", 3.0, ["x"]),
        ("bob", 2.5, []),
        ("cid", None, None),  # Values that do not fit the schema read as null.
    ]

    inferred = reader(spark, broker, journals=journal, format="json").load()
    fields = {f.name: f.dataType.simpleString() for f in inferred.schema.fields}
    assert fields["user"] == "string" and fields["tags"] == "string"
    assert fields["amount"] == "string"  # Numbers and text mixed.
    assert "content" in fields and "UUID" not in fields
    users = [r.user for r in inferred.orderBy("offset").collect()]
    assert users == ["ann", "bob", "cid"]
