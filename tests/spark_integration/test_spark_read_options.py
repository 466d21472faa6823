"""Read options through Spark, each checked against the exact rows it must give: starting and
ending offsets (earliest, latest, JSON per journal, timestamps of the UUID clock), the label and
timestamp columns, filter pushdown that prunes journals (one that fails if read proves it), and
CSV and protobuf payloads. Rate limits of streaming reads: test_spark_rate_limits.py."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from broker.protocol import labels
from gazette_consumer.message.clock import clock_from_unix_nanos
from gazette_consumer.message.csv_framing import encode_record
from gazette_consumer.message.protobuf_framing import FixedFraming
from gazette_consumer.message.uuid import build_uuid
from gazette_consumer.message.uuid import producer_id as as_producer_id
from tests.spark_integration.proto_testkit import PROTOBUF_CLASS, Event
from tests.spark_integration.spark_testkit import (
    ACK,
    CONTINUE,
    OUTSIDE,
    Msg,
    append_messages,
    append_raw,
    create_journals,
    producer,
    reader,
    unique,
)

pytestmark = pytest.mark.spark


def texts(rows: list[Any]) -> list[str]:
    return [json.loads(r.content)["text"] for r in rows]


def ten_messages(broker: str, journal: str, clocks: list[int]) -> list[int]:
    """OUTSIDE_TXN messages t0..t9 of one producer, at `clocks`; their offsets."""
    writer = producer()
    messages = [Msg(writer, clock, OUTSIDE, {"text": f"t{i}"}) for i, clock in enumerate(clocks)]
    return [begin for begin, _ in append_messages(broker, journal, messages)]


def clocks_now() -> list[int]:
    first = clock_from_unix_nanos(time.time_ns())
    return [first + i for i in range(10)]


@dataclass(frozen=True)
class TwoJournals:
    left: str
    right: str
    offsets: dict[str, list[int]]  # Where each of t0..t9 begins.


@pytest.fixture(scope="module")
def two_journals(broker: str) -> TwoJournals:
    left, right = unique("spark/offsets"), unique("spark/offsets")
    create_journals(broker, [left, right])
    return TwoJournals(
        left,
        right,
        {j: ten_messages(broker, j, clocks_now()) for j in (left, right)},
    )


EVERY = [f"t{i}" for i in range(10)]


@pytest.mark.parametrize(
    ("options", "left_texts", "right_texts"),
    [
        ({}, EVERY, EVERY),  # earliest to latest, the defaults.
        ({"startingOffsets": "earliest", "endingOffsets": "latest"}, EVERY, EVERY),
        (
            {"startingOffsets": {"left": 3, "right": -2}, "endingOffsets": {"left": 7, "right": 2}},
            ["t3", "t4", "t5", "t6"],
            ["t0", "t1"],
        ),
        # -1: the write head; a journal the JSON does not name reads from its start / to its head.
        ({"startingOffsets": {"right": 8}, "endingOffsets": {"left": -1}}, EVERY, ["t8", "t9"]),
    ],
)
def test_starting_and_ending_offsets(
    spark: Any,
    broker: str,
    two_journals: TwoJournals,
    options: dict[str, Any],
    left_texts: list[str],
    right_texts: list[str],
) -> None:
    """Offsets as JSON per journal: message i's offset for i >= 0 (t3 is where message 3
    begins), -2 earliest and -1 latest as they are."""
    names = {"left": two_journals.left, "right": two_journals.right}

    def offsets(given: Any) -> str:
        if isinstance(given, str):
            return given
        return json.dumps(
            {
                names[side]: (i if i < 0 else two_journals.offsets[names[side]][i])
                for side, i in given.items()
            }
        )

    both = f"{two_journals.left},{two_journals.right}"
    text_options = {name: offsets(value) for name, value in options.items()}
    rows = sorted(reader(spark, broker, journals=both, **text_options).load().collect())
    assert {j: texts([r for r in rows if r.journal == j]) for j in names.values()} == {
        two_journals.left: left_texts,
        two_journals.right: right_texts,
    }


@pytest.fixture(scope="module")
def timed_journal(broker: str) -> tuple[str, int]:
    """A journal of t0..t9 one second apart (by their UUID clocks) from T, an hour ago."""
    journal = unique("spark/times")
    create_journals(broker, [journal])
    t_s = int(time.time()) - 3600
    ten_messages(broker, journal, [clock_from_unix_nanos((t_s + i) * 10**9) for i in range(10)])
    return journal, t_s


@pytest.mark.parametrize(
    ("start_ms", "end_ms", "expected"),
    [
        (None, None, EVERY),
        (3000, None, EVERY[3:]),  # From the first message at or after the time.
        (2500, 7000, EVERY[3:7]),  # Up to it, not included.
        (60_000, None, []),  # After every message.
    ],
)
def test_starting_and_ending_timestamps_and_the_timestamp_column(
    spark: Any,
    broker: str,
    timed_journal: tuple[str, int],
    start_ms: int | None,
    end_ms: int | None,
    expected: list[str],
) -> None:
    journal, t_s = timed_journal
    options = {}
    if start_ms is not None:
        options["startingTimestamp"] = str(t_s * 1000 + start_ms)
    if end_ms is not None:
        options["endingTimestamp"] = str(t_s * 1000 + end_ms)
    df = reader(spark, broker, journals=journal, **options).load()
    rows = sorted(df.selectExpr("offset", "content", "unix_micros(timestamp) AS micros").collect())
    assert [json.loads(r.content)["text"] for r in rows] == expected
    # The timestamp column is the time of the message's clock.
    assert [r.micros for r in rows] == [(t_s + int(t[1:])) * 1_000_000 for t in expected]


def test_label_columns(spark, broker) -> None:  # type: ignore[no-untyped-def]
    journal = unique("spark/labels")
    create_journals(broker, [journal])
    ten_messages(broker, journal, clocks_now())

    rows = reader(spark, broker, journals=journal, includeLabels="true").load().collect()
    assert len(rows) == 10
    assert {dict(r.labels)["test"] for r in rows} == {journal.split("/")[-1]}
    assert dict(rows[0].labels) == {
        "app": "spark-test",
        labels.CONTENT_TYPE: labels.CONTENT_TYPE_JSON_LINES,
        "test": journal.split("/")[-1],
    }
    picked = (
        reader(spark, broker, journals=journal)
        .schema("offset LONG, labels STRUCT<test: STRING, app: STRING, absent: STRING>")
        .load()
        .collect()
    )
    assert {tuple(r.labels) for r in picked} == {(journal.split("/")[-1], "spark-test", None)}


@pytest.fixture(scope="module")
def pushdown_journals(broker: str) -> tuple[str, str, str]:
    """(base, good, other): three journals under base/, "poison" among them, which is not JSON
    lines and fails any read of it."""
    base = unique("spark/pushdown")
    good, other, poison = f"{base}/good", f"{base}/other", f"{base}/poison"
    create_journals(broker, [good, other, poison])
    ten_messages(broker, good, clocks_now())
    ten_messages(broker, other, clocks_now())
    append_raw(broker, poison, b"this is not JSON\n")
    return base, good, other


@pytest.fixture
def pushdown_enabled(spark: Any) -> Iterator[None]:
    previous = spark.conf.get("spark.sql.python.filterPushdown.enabled", "false")
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    try:
        yield
    finally:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", previous)


def read_where(spark: Any, broker: str, base: str, where: str, pushdown: str = "true") -> list[Any]:
    schema = "journal STRING, content STRING, labels STRUCT<test: STRING>"
    df = reader(spark, broker, selector=f"prefix={base}/", filterPushdown=pushdown).schema(schema)
    return df.load().where(where).collect()


def test_the_poison_journal_fails_a_read_without_pushdown(
    spark: Any, broker: str, pushdown_journals: tuple[str, str, str], pushdown_enabled: None
) -> None:
    base, good, _other = pushdown_journals
    with pytest.raises(Exception, match="poison"):
        read_where(spark, broker, base, f"journal = '{good}'", pushdown="false")


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ("journal = '{good}'", ["good"]),
        ("journal IN ('{good}', '{other}')", ["good", "other"]),
        ("journal LIKE '{base}/o%'", ["other"]),
        ("journal NOT LIKE '%/poison'", ["good", "other"]),
        ("labels.test = 'other'", ["other"]),  # A label: journals it cannot match are pruned.
    ],
)
def test_filter_pushdown_prunes_journals(
    spark: Any,
    broker: str,
    pushdown_journals: tuple[str, str, str],
    pushdown_enabled: None,
    where: str,
    expected: list[str],
) -> None:
    """Filters on the journal name and on a label skip the poison journal, and the rows of the
    journals they keep are exact."""
    base, good, other = pushdown_journals
    rows = read_where(spark, broker, base, where.format(base=base, good=good, other=other))
    got = sorted((r.journal, json.loads(r.content)["text"]) for r in rows)
    assert got == sorted((f"{base}/{name}", t) for name in expected for t in EVERY)


def test_csv_payloads(spark, broker) -> None:  # type: ignore[no-untyped-def]
    """A CSV journal (records whose first field is the UUID): read-committed drops the
    rolled-back transaction, and a schema reads the fields after the UUID, in order."""
    journal = unique("spark/csv")
    create_journals(broker, [journal], content_type=labels.CONTENT_TYPE_CSV)
    a, b = producer(), producer()
    clock = clock_from_unix_nanos(time.time_ns())

    def record(who: bytes, at: int, flags: Any, *fields: str) -> bytes:
        return encode_record([str(build_uuid(as_producer_id(who), at, flags)), *fields])

    append_raw(
        broker,
        journal,
        record(a, clock + 1, OUTSIDE, "apple", "1", "x")
        + record(b, clock + 10, CONTINUE, "rolled back", "2", "y")
        + record(a, clock + 2, OUTSIDE, 'quoted, "text"', "3", "z")
        + record(b, clock + 9, ACK, "", "", "")  # As wide as the others, as CSV requires.
        + record(a, clock + 3, OUTSIDE, "cherry", "4", ""),
    )

    rows = sorted(reader(spark, broker, journals=journal).load().collect())
    assert [r.content.split(",", 1)[1] for r in rows] == [
        "apple,1,x",
        '"quoted, ""text""",3,z',
        "cherry,4,",
    ]
    typed = sorted(
        reader(spark, broker, journals=journal)
        .schema("offset LONG, name STRING, n LONG, tag STRING")
        .load()
        .collect()
    )
    assert [(r.name, r.n, r.tag) for r in typed] == [
        ("apple", 1, "x"),
        ('quoted, "text"', 3, "z"),
        ("cherry", 4, ""),
    ]


def test_protobuf_payloads(spark, broker) -> None:  # type: ignore[no-untyped-def]
    """A fixed-framed protobuf journal: content is the payload, the UUID is the message's
    `uuid` field, schema fields are the message's fields by name."""
    journal = unique("spark/proto")
    create_journals(broker, [journal], content_type=labels.CONTENT_TYPE_PROTO_FIXED)
    a, b = producer(), producer()
    clock = clock_from_unix_nanos(time.time_ns())
    framing = FixedFraming()

    def event(who: bytes, at: int, flags: Any, text: str = "", n: int = 0) -> bytes:
        uuid = str(build_uuid(as_producer_id(who), at, flags))
        return framing.marshal(Event(uuid=uuid, text=text, n=n))

    append_raw(
        broker,
        journal,
        event(a, clock + 1, OUTSIDE, "one", 1)
        + event(b, clock + 10, CONTINUE, "two", 2)
        + event(a, clock + 1, OUTSIDE, "one", 1)  # A duplicate.
        + event(b, clock + 11, ACK)
        + event(a, clock + 2, OUTSIDE, "three", 3)
        + event(a, clock + 3, OUTSIDE, "zero", 0),  # proto3 does not encode a 0: still 0.
    )

    rows = sorted(
        reader(spark, broker, journals=journal, protobufClass=PROTOBUF_CLASS).load().collect()
    )
    assert [Event.FromString(bytes(r.content)).text for r in rows] == [
        "one",
        "two",
        "three",
        "zero",
    ]
    assert rows[0].producer == a.hex()
    typed = sorted(
        reader(spark, broker, journals=journal, protobufClass=PROTOBUF_CLASS)
        .schema("offset LONG, text STRING, n LONG")
        .load()
        .collect()
    )
    assert [(r.text, r.n) for r in typed] == [("one", 1), ("two", 2), ("three", 3), ("zero", 0)]


def test_a_split_read_returns_transactions_longer_than_the_lookback(spark, broker) -> None:  # type: ignore[no-untyped-def]
    """Two write tasks publish one transaction each, over several fragments; the driver's ACKs
    come last. Read in partitions of a fragment each, with a look-back shorter than a
    transaction, every committed row must still be returned (as a one-partition read does)."""
    journal = unique("spark/split")
    create_journals(broker, [journal])
    rows = spark.range(8000).selectExpr("id", "repeat('x', 200) AS pad").repartition(2)
    rows.write.format("gazette").mode("append").option("broker", broker).option(
        "journal", journal
    ).save()

    split = reader(
        spark, broker, journals=journal, maxPartitionBytes="1024", lookbackBytes="1024"
    ).load()
    assert split.rdd.getNumPartitions() > 1
    assert split.count() == 8000
