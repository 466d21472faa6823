"""Writers of different widths racing to an empty CSV journal: each finds it empty on the
driver, so each passes the width check there; the first append fixes the journal's width (its
width register, csv_width.py), and the other writer's append is refused by the broker with
nothing appended, then fails with GazetteCSVWidthError naming both widths. A writer of the
winner's width that also found the journal empty proceeds. The journal keeps one width, and
reads back. Deterministic: the writers' tasks are called directly, one after the other, in
this process (as Spark's tasks would call them), against the real broker."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from broker.protocol import labels
from spark_integration.csv_width import WIDTH_REGISTER, GazetteCSVWidthError
from tests.spark_integration.spark_testkit import create_journals, reader, unique
from tests.spark_integration.test_spark_csv_write import committed_csv, csv_records

pytestmark = pytest.mark.spark
CSV = labels.CONTENT_TYPE_CSV


def test_the_second_width_to_reach_an_empty_journal_is_refused(spark: Any, broker: str) -> None:
    from spark_integration import GazetteDataSource
    from spark_integration.journal_io import run_with_client
    from spark_integration.publish import read_registers

    journal = unique("spark/csv-race")
    create_journals(broker, [journal], content_type=CSV)
    two = spark.createDataFrame([], "key STRING, n LONG").schema
    three = spark.createDataFrame([], "key STRING, n LONG, ok BOOLEAN").schema
    source = GazetteDataSource({"broker": broker, "journal": journal})
    # Every writer plans (on its driver) while the journal is empty: none is refused there.
    first, second, third = (source.writer(s, False) for s in (two, three, two))

    rows_a = pa.RecordBatch.from_pylist([{"key": "a", "n": 1}, {"key": "b", "n": 2}])
    rows_b = pa.RecordBatch.from_pylist([{"key": "c", "n": 3, "ok": True}])
    rows_c = pa.RecordBatch.from_pylist([{"key": "d", "n": 4}])
    won = first.write(iter([rows_a]))
    with pytest.raises(GazetteCSVWidthError) as refused:
        second.write(iter([rows_b]))
    assert (refused.value.journal, refused.value.expected, refused.value.given) == (journal, 2, 3)
    assert "have 2 columns" in str(refused.value) and "have 3" in str(refused.value)
    also = third.write(iter([rows_c]))  # The winner's width: it looks again, and appends.
    first.commit([won])
    third.commit([also])

    records = csv_records(broker, journal)
    assert {len(r) for r in records} == {3}, records  # UUID, key, n: one width only.
    assert sorted(committed_csv(broker, journal)) == [["a", "1"], ["b", "2"], ["d", "4"]]
    registers = run_with_client(broker, lambda client: read_registers(client, journal))
    assert labels.value_of(registers, WIDTH_REGISTER) == "3"
    got = reader(spark, broker, journals=journal).schema("key STRING, n LONG").load().collect()
    assert sorted((r.key, r.n) for r in got) == [("a", 1), ("b", 2), ("d", 4)]
