"""Review reproducer: a journal deleted and created again while a streaming query is down, and
written past the query's old offset before it restarts, is read on from the old offset: every
message of the new journal before that offset is skipped, silently (failOnDataLoss true).

stream_read.latestOffset detects a re-created journal only by its write head being below the
query's offset (`_behind`), and `_not_read` only when the journal is missing at a planning. Once
the new journal's head has passed the old offset, the restarted query walks [old offset, head)
of the new journal. docs/spark.md: "A journal whose write head is below the query's offset in it
(deleted and created again ...) is data loss too"; the same journal re-created with more content
is not told apart (its etcd create revision would tell).

The reader is driven as Spark drives a restart (a new reader; start = the last committed end
offset), in this process, against the Spark tests' broker process.
"""

from __future__ import annotations

import pytest

from spark_integration.read_options import parse_read_options
from spark_integration.source import default_schema
from spark_integration.stream_read import GazetteStreamReader
from tests.spark_integration.spark_testkit import (
    OUTSIDE,
    create_journals,
    micro_batch_texts,
    producer,
    unique,
)
from tests.spark_integration.test_spark_stream_restarts import Journal, delete_journal

# An open defect, found by review on 2026-11-28 (docs/spark.md, "Open defects"): this test
# reproduces it and fails today. Strict: once fixed it passes, and the mark must go.
pytestmark = pytest.mark.xfail(
    strict=True,
    reason="open defect: a journal deleted and recreated past the query's offset is read on from the old offset",
)


def test_a_journal_recreated_and_refilled_while_down_is_not_skipped(broker: str) -> None:
    journal = unique("review/recreated")
    create_journals(broker, [journal])
    j, p = Journal(broker, journal), producer()
    for i in range(3):
        j.add(p, OUTSIDE, f"old-{i}")
    options = {"broker": broker, "journals": journal, "idleWaitMs": "0"}

    opts = parse_read_options(options, "stream")
    reader = GazetteStreamReader(opts, default_schema(opts))
    first, end = micro_batch_texts(reader, reader.initialOffset())
    assert first == ["old-0", "old-1", "old-2"]

    # The query is down: the journal is deleted, created again, and written (same-sized
    # messages, so the old offset falls on a message boundary of the new journal).
    delete_journal(broker, journal)
    create_journals(broker, [journal])
    p2 = producer()
    for i in range(5):
        j.add(p2, OUTSIDE, f"new-{i}")

    restarted = GazetteStreamReader(opts, default_schema(opts))
    try:
        second, _ = micro_batch_texts(restarted, end)
    except Exception as err:  # A typed data-loss error would be an acceptable answer.
        assert "DataLoss" in type(err).__name__, repr(err)
        return
    assert second == [f"new-{i}" for i in range(5)], (
        f"the restarted query delivered {second}: the new journal's first messages were skipped"
        " without an error"
    )
