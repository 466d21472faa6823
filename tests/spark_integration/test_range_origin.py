"""A batch read from an offset inside a long transaction, split into partitions: the
transaction began before the read's start, so no partition delivers any of it, even those
starting far more than `lookbackBytes` after the start (origin_open.py). Driven as Spark drives
the data source (partitions planned, each read on its own), against a broker process."""

from __future__ import annotations

import json

import pytest

from tests.spark_integration.spark_testkit import committed_texts, unique
from tests.spark_integration.test_range_split import (
    SPLIT_OPTIONS,
    append_in_groups,
    create_small_fragment_journal,
    long_transaction_history,
    partition_texts,
)

pytestmark = pytest.mark.spark


def whole_read_texts(options: dict[str, str]) -> list[str]:
    """The texts of the same read as one partition: one walk, the documented semantics."""
    from spark_integration import GazetteDataSource
    from spark_integration.rows import META_SCHEMA

    reader = GazetteDataSource({**options, "maxPartitionBytes": str(1 << 30)}).reader(META_SCHEMA)
    [part] = reader.partitions()
    return [
        json.loads(content)["text"]
        for batch in reader.read(part)
        for content in batch.column("content").to_pylist()
    ]


def test_partitions_far_from_the_origin_skip_a_transaction_begun_before_it(broker: str) -> None:
    journal = unique("spark/origin")
    create_small_fragment_journal(broker, journal, 16 << 10)
    history = long_transaction_history()
    spans = append_in_groups(broker, journal, history)
    # Start a third of the way in: inside the long transaction (and the never-acknowledged
    # one), which then go on for some 200 KB, many times the look-back.
    index = len(history) // 3
    origin = spans[index][0]
    options = {"broker": broker, "journals": journal, "begin": json.dumps({journal: origin})}

    whole = whole_read_texts(options)
    split = partition_texts({**options, **SPLIT_OPTIONS})

    # One walk skips the long transaction whole, and reads what commits after the origin.
    assert not any(t.startswith(("long", "open")) for t in whole)
    after = {(m.fields or {}).get("text") for m in history[index:]}
    assert set(whole) == {t for t in committed_texts(broker, journal) if t in after} - {
        t for t in after if t and t.startswith("long")
    }
    assert sorted(split) == sorted(whole)
