"""Writes routed by a key column over the journals a selector matches: rows spread over the
journals, each key always in the same journal (the one Gazette's mappings choose), and every
row committed exactly once per journal, batch and streaming (with a re-run micro-batch).
Counts are taken by Gazette's consumer reader (committed_texts), apart from the data source."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from gazette_consumer.message.clock import clock_from_unix_nanos
from gazette_consumer.message.mapping import Partitions, modulo_mapping, rendezvous_choice
from tests.spark_integration.spark_testkit import (
    OUTSIDE,
    Msg,
    append_messages,
    committed_texts,
    create_journals,
    producer,
    unique,
)

pytestmark = pytest.mark.spark


def keyed_journals(broker: str, count: int) -> tuple[str, list[str]]:
    """A selector and the `count` journals it matches (sorted)."""
    base = unique("spark/keyed")
    journals = [f"{base}/part-{i}" for i in range(count)]
    create_journals(broker, journals)
    return f"prefix={base}/", journals


def by_journal(broker: str, journals: list[str]) -> dict[str, list[str]]:
    return {j: committed_texts(broker, j) for j in journals}


def test_batch_write_routes_each_key_to_its_journal(spark, broker) -> None:  # type: ignore[no-untyped-def]
    selector, journals = keyed_journals(broker, 3)
    rows = [(f"customer-{i % 40}", f"customer-{i % 40}:{i}") for i in range(300)]
    df = spark.createDataFrame(rows, "key STRING, text STRING").repartition(2)

    (
        df.write.format("gazette")
        .mode("append")
        .option("broker", broker)
        .option("selector", selector)
        .option("keyColumn", "key")
        .save()
    )

    got = by_journal(broker, journals)
    assert sorted(t for texts in got.values() for t in texts) == sorted(t for _, t in rows)
    assert all(got[j] for j in journals)  # Spread over all three.
    choose = modulo_mapping(lambda key: key, Partitions.of_journals(journals, ""))
    for journal, texts in got.items():
        for text in texts:
            assert choose(text.split(":")[0]).journal == journal  # Each key in one journal.


def test_streaming_write_by_key_commits_each_row_once_per_journal(
    spark: Any, broker: str, tmp_path: Path
) -> None:
    """A query copies a source to four journals by rendezvous on a key field; its micro-batch 0
    is re-run after a restart (Spark's record of it deleted, as when the driver dies after the
    sink committed): each row is committed once, in its key's journal."""
    selector, journals = keyed_journals(broker, 4)
    source = unique("spark/keyed-src")
    create_journals(broker, [source])
    writer, clock = producer(), clock_from_unix_nanos(time.time_ns())

    def add(texts: list[str]) -> list[str]:
        nonlocal clock
        messages = []
        for text in texts:
            clock += 1
            fields = {"text": text, "key": text.split(":")[0]}
            messages.append(Msg(writer, clock, OUTSIDE, fields))
        append_messages(broker, source, messages, together=True)
        return texts

    def start() -> Any:
        return (
            spark.readStream.format("gazette")
            .option("broker", broker)
            .option("journals", source)
            .load()
            .selectExpr("content", "get_json_object(content, '$.key') AS key")
            .writeStream.format("gazette")
            .option("broker", broker)
            .option("selector", selector)
            .option("keyColumn", "key")
            .option("mapping", "rendezvous")
            .option("checkpointLocation", str(tmp_path / "cp"))
            .start()
        )

    first = add([f"k{i % 17}:a{i}" for i in range(120)])
    query = start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    for record in ("0", ".0.crc"):
        (tmp_path / "cp" / "commits" / record).unlink()
    query = start()
    try:
        query.processAllAvailable()  # Micro-batch 0 again: rolled back, not committed twice.
        second = add([f"k{i % 17}:b{i}" for i in range(80)])
        query.processAllAvailable()
    finally:
        query.stop()

    got = by_journal(broker, journals)
    assert sorted(t for texts in got.values() for t in texts) == sorted(first + second)
    partitions = Partitions.of_journals(journals, "")
    for journal, texts in got.items():
        for text in texts:
            assert rendezvous_choice(text.split(":")[0].encode(), partitions).journal == journal
    assert sum(1 for texts in got.values() if texts) >= 3  # 17 keys over four journals.
    # The message is the content as read, without the routing column added.
    assert set(json.loads(read_first(spark, broker, journals))) == {"text", "key", "UUID"}


def read_first(spark: Any, broker: str, journals: list[str]) -> str:
    rows = (
        spark.read.format("gazette")
        .option("broker", broker)
        .option("journals", ",".join(journals))
        .load()
        .limit(1)
        .collect()
    )
    return str(rows[0].content)


def test_key_routing_options_are_checked_before_anything_is_written(spark, broker) -> None:  # type: ignore[no-untyped-def]
    from spark_integration.options import GazetteOptionError

    selector, journals = keyed_journals(broker, 2)
    df = spark.createDataFrame([("a", 1)], "key STRING, v LONG")

    def write(**options: str) -> None:
        w = df.write.format("gazette").mode("append").option("broker", broker)
        for name, value in options.items():
            w = w.option(name, value)
        w.save()

    cases = [
        ({"selector": "prefix=spark/no-such-prefix/", "keyColumn": "key"}, "matches no journal"),
        ({"selector": selector, "keyColumn": "nope"}, "has no column 'nope'"),
        ({"selector": selector}, "option 'keyColumn'"),
        ({"selector": selector, "keyColumn": "key", "mapping": "hash"}, "option 'mapping'"),
    ]
    for options, error in cases:
        with pytest.raises(Exception, match=error):
            write(**options)
    with pytest.raises(GazetteOptionError, match="keys must be strings, binary or integers"):
        from spark_integration.source import GazetteDataSource

        schema = spark.createDataFrame([], "key DOUBLE").schema
        GazetteDataSource({"broker": broker, "selector": selector, "keyColumn": "key"}).writer(
            schema, False
        )
    assert by_journal(broker, journals) == {j: [] for j in journals}
