"""Reads that start at an offset other than 0: a transaction open there is skipped whole, never
delivered in part; offsets inside a message are refused; content that does not frame fails the
read. Driven as Spark drives the data source, against the session's broker (no SparkSession)."""

from __future__ import annotations

import json
import time

import pytest
import structlog

from gazette_consumer.message.clock import clock_from_unix_nanos
from spark_integration import GazetteDataSource, GazetteJournalError, GazetteOptionError
from spark_integration.rows import META_SCHEMA
from tests.spark_integration.spark_testkit import (
    ACK,
    CONTINUE,
    OUTSIDE,
    Msg,
    append_messages,
    append_raw,
    create_journals,
    producer,
    unique,
)

pytestmark = pytest.mark.spark


def batch_texts(broker: str, journal: str, **options: str) -> list[str]:
    source = GazetteDataSource({"broker": broker, "journals": journal, **options})
    reader = source.reader(META_SCHEMA)
    return [
        json.loads(content)["text"]
        for part in reader.partitions()
        for batch in reader.read(part)
        for content in batch.column("content").to_pylist()
    ]


def txn(p: bytes, clock: int, texts: list[str]) -> list[Msg]:
    """A transaction of `p`: its messages from clock+1 on, then the ACK."""
    msgs = [Msg(p, clock + 1 + i, CONTINUE, {"text": t}) for i, t in enumerate(texts)]
    return [*msgs, Msg(p, clock + 1 + len(texts), ACK)]


def test_a_batch_read_skips_the_transaction_open_at_begin(broker: str) -> None:
    """Reading [0, H) then [H, head) with H inside a 20-message transaction: the transaction is
    in neither (its ACK lies beyond H, its start before it), while transactions that begin at
    or after H are read whole, of producers seen before H and of new ones alike."""
    journal = unique("spark/begin")
    create_journals(broker, [journal])
    a, b, c = producer(), producer(), producer()
    base = clock_from_unix_nanos(time.time_ns())
    long_txn = txn(a, base, [f"t{i}" for i in range(20)])
    spans = append_messages(
        broker,
        journal,
        [
            Msg(a, base, OUTSIDE, {"text": "a0"}),
            Msg(b, base, OUTSIDE, {"text": "b0"}),
            *long_txn[:10],
            # H: the first ten messages of the transaction lie before it.
            *long_txn[10:15],
            *txn(b, base + 1, ["b1", "b2"]),  # Begins after H: read whole.
            *long_txn[15:],
            *txn(c, base, ["c1"]),  # A producer never seen before H.
            *txn(a, base + 30, ["a1"]),  # a's next transaction.
        ],
    )
    h = spans[12][0]

    assert batch_texts(broker, journal, end=json.dumps({journal: h})) == ["a0", "b0"]
    with structlog.testing.capture_logs() as logs:
        tail = batch_texts(broker, journal, begin=json.dumps({journal: h}))
    assert tail == ["b1", "b2", "c1", "a1"]
    assert [entry for entry in logs if entry["log_level"] == "error"] == []


def test_a_stream_started_inside_a_transaction_skips_it(broker: str) -> None:
    """startingOffsets "latest" while a transaction is open: the stream delivers the
    transactions that begin after its start, not the tail of the open one."""
    journal = unique("spark/latest")
    create_journals(broker, [journal])
    a, b = producer(), producer()
    base = clock_from_unix_nanos(time.time_ns())
    open_txn = txn(a, base, ["t0", "t1", "t2", "t3"])
    append_messages(broker, journal, open_txn[:2])

    source = GazetteDataSource(
        {"broker": broker, "journals": journal, "startingOffsets": "latest", "idleWaitMs": "0"}
    )
    stream = source.streamReader(META_SCHEMA)
    start = stream.initialOffset()
    append_messages(
        broker, journal, [*open_txn[2:], *txn(b, base, ["b1"]), *txn(a, base + 9, ["a1"])]
    )
    end = stream.latestOffset(start, None)
    texts = [
        json.loads(content)["text"]
        for part in stream.partitions(start, end)
        for batch in stream.read(part)
        for content in batch.column("content").to_pylist()
    ]
    assert texts == ["b1", "a1"]


def test_offsets_inside_a_message_are_refused(broker: str) -> None:
    journal = unique("spark/boundary")
    create_journals(broker, [journal])
    p = producer()
    base = clock_from_unix_nanos(time.time_ns())
    spans = append_messages(
        broker, journal, [Msg(p, base + i, OUTSIDE, {"text": f"m{i}"}) for i in range(3)]
    )
    inside = spans[1][0] + 3

    for option in ("begin", "end"):
        with pytest.raises(GazetteOptionError, match=f"option '{option}': offset {inside} of"):
            batch_texts(broker, journal, **{option: json.dumps({journal: inside})})
    stream = GazetteDataSource(
        {"broker": broker, "journals": journal, "startingOffsets": json.dumps({journal: inside})}
    ).streamReader(META_SCHEMA)
    with pytest.raises(GazetteOptionError, match=r"option 'startingOffsets': offset .* inside a"):
        stream.initialOffset()
    # Boundaries are fine: a message's offset, and the write head.
    assert batch_texts(broker, journal, begin=json.dumps({journal: spans[1][0]})) == ["m1", "m2"]
    assert batch_texts(broker, journal, end=json.dumps({journal: spans[2][1]})) == [
        "m0",
        "m1",
        "m2",
    ]


def test_content_cut_short_fails_the_read(broker: str) -> None:
    """A journal whose head is inside a line (a writer appended half a message): reading to
    the head fails, naming where, rather than dropping the half message with a log line."""
    journal = unique("spark/cut")
    create_journals(broker, [journal])
    p = producer()
    append_messages(broker, journal, [Msg(p, 5, OUTSIDE, {"text": "whole"})])
    append_raw(broker, journal, b'{"text": "cut sh')

    with pytest.raises(GazetteJournalError, match="not whole JSON lines"):
        batch_texts(broker, journal)
    with pytest.raises(GazetteJournalError, match="not whole JSON lines"):
        batch_texts(broker, journal, isolation="read_uncommitted")
