"""A write to a CSV journal whose rows have another column count than the journal's records is
refused before anything is appended (readers would fail on every later read), whichever way
rows are routed; rows of the journal's width still go in."""

from __future__ import annotations

from typing import Any

import pytest

from broker.protocol import labels
from spark_integration.csv_width import GazetteCSVWidthError
from tests.spark_integration.spark_testkit import create_journals, read_all, reader, unique

pytestmark = pytest.mark.spark
CSV = labels.CONTENT_TYPE_CSV


def _write(df: Any, broker: str, **options: str) -> None:
    w = df.write.format("gazette").mode("append").option("broker", broker)
    for k, v in options.items():
        w = w.option(k, v)
    w.save()


def test_a_write_of_another_width_is_refused_with_nothing_appended(spark: Any, broker: str) -> None:
    from spark_integration import GazetteDataSource

    journal, by_key = unique("spark/csv-width"), unique("spark/csv-width-key")
    create_journals(broker, [journal, by_key], content_type=CSV)
    two = spark.createDataFrame([("a", 1), ("b", 2)], "key STRING, n LONG").coalesce(1)
    _write(two, broker, journal=journal)
    _write(two, broker, journal=by_key)
    before = read_all(broker, journal)

    three = spark.createDataFrame([("c", 3, True)], "key STRING, n LONG, ok BOOLEAN")
    # On the driver, as Spark plans the write (called directly: a failing query costs a
    # Python worker): option journal, and keyColumn routing.
    with pytest.raises(GazetteCSVWidthError) as refused:
        GazetteDataSource({"broker": broker, "journal": journal}).writer(three.schema, False)
    assert (refused.value.journal, refused.value.expected, refused.value.given) == (journal, 2, 3)
    assert f"journal {journal!r}" in str(refused.value) and "key, n, ok" in str(refused.value)
    selector = f"test={by_key.split('/')[-1]}"
    with pytest.raises(GazetteCSVWidthError, match=r"have 2 columns after the UUID.* have 1"):
        GazetteDataSource({"broker": broker, "selector": selector, "keyColumn": "key"}).writer(
            three.select("key").schema, False
        )
    # Named by a journal column: the task refuses it before its first append there.
    routed = three.selectExpr(f"'{journal}' AS journal", "key", "n", "ok")
    with pytest.raises(Exception, match=r"GazetteCSVWidthError.*have 2 columns.*have 3"):
        _write(routed, broker)

    assert read_all(broker, journal) == before
    # Rows of the journal's width are written, routed either way, and read back.
    _write(spark.createDataFrame([("c", 3)], "key STRING, n LONG"), broker, journal=journal)
    _write(spark.createDataFrame([(journal, "d", 4)], "journal STRING, key STRING, n LONG"), broker)
    got = reader(spark, broker, journals=journal).schema("key STRING, n LONG").load().collect()
    assert sorted((r.key, r.n) for r in got) == [("a", 1), ("b", 2), ("c", 3), ("d", 4)]
