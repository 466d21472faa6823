"""Writes to protobuf journals through Spark (option protobufClass): rows become messages of
the class, committed exactly once, batch and streaming (a re-run micro-batch), read back by
the data source and by the consumer framework's protobuf framing and Sequencer; a column of a
type the message cannot take, or a value it cannot hold, is refused naming the column, with
nothing committed."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from broker.protocol import labels
from gazette_consumer.message.protobuf_framing import FixedFraming
from spark_integration.arrow_protobuf import GazetteColumnError
from tests.spark_integration.proto_testkit import PROTOBUF_CLASS, TALLY_CLASS, Event, Tally
from tests.spark_integration.spark_testkit import (
    TextSource,
    committed,
    copy_with_micro_batch_0_twice,
    create_journals,
    framed,
    read_all,
    reader,
    start_copy,
    unique,
    write_batch,
)

pytestmark = pytest.mark.spark
PROTO = labels.CONTENT_TYPE_PROTO_FIXED


def messages(broker: str, journal: str, cls: Any = Event) -> list[Any]:
    """Every message of the journal (ACKs included), by Gazette's fixed protobuf framing."""
    framing = FixedFraming()
    decoder = framing.new_decoder(cls)
    return [decoder.decode(e) for e in framed(framing, broker, journal)]


def committed_events(broker: str, journal: str) -> list[tuple[str, int]]:
    """(text, n) of the journal's committed messages, by the consumer framework's Sequencer."""
    pairs = [(uuid.UUID(m.uuid), (m.text, m.n)) for m in messages(broker, journal)]
    return committed(journal, pairs)


def read_back(spark: Any, broker: str, journal: str) -> list[tuple[str, int]]:
    df = reader(spark, broker, journals=journal, protobufClass=PROTOBUF_CLASS)
    return sorted((r.text, r.n) for r in df.schema("text STRING, n LONG").load().collect())


def test_a_batch_write_to_a_protobuf_journal_reads_back_exactly_once(
    spark: Any, broker: str
) -> None:
    journal = unique("spark/proto-write")
    create_journals(broker, [journal], content_type=PROTO)
    rows = [(f"t-{i}", i * 7 - 20) for i in range(50)] + [("", 0)]
    df = spark.createDataFrame(rows, "text STRING, n LONG")  # Two partitions (local[2]).

    write_batch(df, broker, journal, protobufClass=PROTOBUF_CLASS)

    assert sorted(committed_events(broker, journal)) == sorted(rows)
    assert read_back(spark, broker, journal) == sorted(rows)
    # Each task's messages, then the driver's ACK of each task: a message with its UUID alone.
    acks = [m for m in messages(broker, journal) if not m.text and not m.n][-2:]
    assert len(acks) == 2 and all(m.ListFields()[0][0].name == "uuid" for m in acks)


def test_a_streaming_write_to_a_protobuf_journal_commits_each_micro_batch_once(
    spark: Any, broker: str, tmp_path: Path
) -> None:
    """JSON messages copied to a protobuf journal by a streaming query whose micro-batch 0
    runs again after a restart (Spark's record of it deleted, as a driver that died after the
    sink's commit leaves it): each row is committed once."""
    source, sink = unique("spark/proto-src"), unique("spark/proto-sink")
    create_journals(broker, [source])
    create_journals(broker, [sink], content_type=PROTO)
    texts = TextSource(broker, source)

    def add(more: list[str]) -> list[tuple[str, int]]:
        return [(t, len(t)) for t in texts.add(more)]

    def start() -> Any:
        cp = tmp_path / "cp"
        return start_copy(spark, broker, source, sink, cp, protobufClass=PROTOBUF_CLASS)

    expected = add([f"a-{i}" for i in range(30)])
    more = [f"b-{i}" for i in range(20)]
    copy_with_micro_batch_0_twice(start, tmp_path / "cp", lambda: expected.extend(add(more)))

    assert len(messages(broker, sink)) > len(expected) + 30  # Micro-batch 0's rows twice.
    assert sorted(committed_events(broker, sink)) == sorted(expected)
    assert read_back(spark, broker, sink) == sorted(expected)


def test_columns_the_message_cannot_take_are_refused_before_anything_is_written(
    spark: Any, broker: str
) -> None:
    from spark_integration import GazetteDataSource

    journal = unique("spark/proto-types")
    create_journals(broker, [journal], content_type=PROTO)
    options = {"broker": broker, "journal": journal, "protobufClass": PROTOBUF_CLASS}
    # On the driver, as Spark plans the write (called directly: a failing query costs a
    # Python worker): a column of another type, a column the message does not have.
    wrong = spark.createDataFrame([], "text STRING, n STRING").schema
    with pytest.raises(GazetteColumnError, match="column 'n' is of type string") as refused:
        GazetteDataSource(options).writer(wrong, False)
    assert refused.value.column == "n"
    unknown = spark.createDataFrame([], "text STRING, size LONG").schema
    with pytest.raises(GazetteColumnError, match="has no field 'size'"):
        GazetteDataSource(options).writer(unknown, False)

    assert read_all(broker, journal) == b""


def test_a_value_the_message_cannot_hold_fails_the_write_naming_the_column(
    spark: Any, broker: str
) -> None:
    """A uint32 count of -1, in one row of one of two tasks: that task fails (each attempt)
    naming the column, and the write commits nothing, the other task's rows included."""
    tallies = unique("spark/proto-tally")
    create_journals(broker, [tallies], content_type=PROTO)
    rows = [(f"k-{i}", i) for i in range(40)] + [("bad", -1)]
    df = spark.createDataFrame(rows, "key STRING, count LONG")  # Two partitions.
    with pytest.raises(Exception, match=r"GazetteColumnError: column 'count': value -1"):
        write_batch(df, broker, tallies, protobufClass=TALLY_CLASS)

    written = [(uuid.UUID(m.uuid), m.key) for m in messages(broker, tallies, Tally)]
    assert committed(tallies, written) == []
    got = reader(spark, broker, journals=tallies, protobufClass=TALLY_CLASS).load().count()
    assert got == 0
