"""A journal deleted and created again while a streaming query is down, and written past the
query's old offset before it restarts: the query's offset carries the journal's etcd create
revision, so the restarted query tells the new journal from the old one: data loss (the
default), or with failOnDataLoss false a warning and the new journal read from its first
offset; never read on from the old offset.

Found by review (2026-11-28): re-creation was told only by a write head below the query's
offset, so once the new journal's head had passed it, the restarted query skipped every message
of the new journal before it, silently. The reader is driven as Spark drives a restart (a new
reader; start = the last committed end offset), in this process, against the Spark tests'
broker process.
"""

from __future__ import annotations

from typing import Any

import pytest

from spark_integration.offsets import from_json, to_json
from spark_integration.read_options import parse_read_options
from spark_integration.source import default_schema
from spark_integration.sources import GazetteDataLossError
from spark_integration.stream_read import GazetteStreamReader
from tests.spark_integration.spark_testkit import (
    OUTSIDE,
    create_journals,
    micro_batch_texts,
    producer,
    unique,
)
from tests.spark_integration.test_spark_stream_restarts import Journal, delete_journal


def _recreated_while_down(
    broker: str, fail_on_data_loss: bool
) -> tuple[GazetteStreamReader, dict[str, Any]]:
    journal = unique("stream/recreated")
    create_journals(broker, [journal])
    j, p = Journal(broker, journal), producer()
    for i in range(3):
        j.add(p, OUTSIDE, f"old-{i}")
    options = {"broker": broker, "journals": journal, "idleWaitMs": "0"}
    options["failOnDataLoss"] = str(fail_on_data_loss).lower()

    opts = parse_read_options(options, "stream")
    reader = GazetteStreamReader(opts, default_schema(opts))
    first, end = micro_batch_texts(reader, reader.initialOffset())
    assert first == ["old-0", "old-1", "old-2"]
    assert from_json(end)[journal].created > 0  # The journal's create revision, kept.

    # The query is down: the journal is deleted, created again, and written (same-sized
    # messages, so the old offset falls on a message boundary of the new journal).
    delete_journal(broker, journal)
    create_journals(broker, [journal])
    p2 = producer()
    for i in range(5):
        j.add(p2, OUTSIDE, f"new-{i}")
    return GazetteStreamReader(opts, default_schema(opts)), end


def test_a_journal_recreated_and_refilled_while_down_is_data_loss(broker: str) -> None:
    restarted, end = _recreated_while_down(broker, fail_on_data_loss=True)
    with pytest.raises(GazetteDataLossError, match="deleted and created again since the query"):
        micro_batch_texts(restarted, end)


def test_without_fail_on_data_loss_the_new_journal_is_read_from_its_first_offset(
    broker: str,
) -> None:
    restarted, end = _recreated_while_down(broker, fail_on_data_loss=False)
    second, _ = micro_batch_texts(restarted, end)
    assert second == [f"new-{i}" for i in range(5)]


def test_offsets_without_a_create_revision_are_still_read() -> None:
    """Offsets written before the revision was kept (and of store-mode reads) carry none: they
    are read, and checked against nothing."""
    parsed = from_json({"j/a": {"offset": 10, "producers": ""}})["j/a"]
    assert parsed.created == 0 and "created" not in to_json({"j/a": parsed})["j/a"]
    with pytest.raises(ValueError, match="created must be an integer"):
        from_json({"j/a": {"offset": 10, "created": -1}})


def test_a_journal_idle_since_the_start_recreated_while_down_is_data_loss(broker: str) -> None:
    """Found by review (2026-11-29): the create revision was kept only once a micro-batch read
    the journal, so one idle since the query's start (at its write head) carried none: deleted,
    created again and written past its old offset while the query was down, it was read on
    from there, its first messages skipped without an error."""
    busy, idle = unique("stream/busy"), unique("stream/idle")
    create_journals(broker, [busy, idle])
    b, i, p = Journal(broker, busy), Journal(broker, idle), producer()
    for n in range(3):
        i.add(p, OUTSIDE, f"old-{n}")
    options = {
        "broker": broker,
        "journals": f"{busy},{idle}",
        "startingOffsets": "latest",
        "idleWaitMs": "0",
    }
    opts = parse_read_options(options, "stream")
    reader = GazetteStreamReader(opts, default_schema(opts))
    start = reader.initialOffset()
    assert from_json(start)[idle].created > 0  # Kept from the start.
    b.add(p, OUTSIDE, "busy-0")
    first, end = micro_batch_texts(reader, start)
    assert first == ["busy-0"]  # The idle journal read nothing.

    delete_journal(broker, idle)
    create_journals(broker, [idle])
    p2 = producer()
    for n in range(5):
        i.add(p2, OUTSIDE, f"new-{n}")
    restarted = GazetteStreamReader(opts, default_schema(opts))
    with pytest.raises(GazetteDataLossError, match="deleted and created again since the query"):
        micro_batch_texts(restarted, end)
