"""A streaming read from a fragment store alone (option `store`, no broker) reads a fragment
persisted after the fragments following it: planning stops at a gap followed by a fragment
persisted less than storeGapGraceSeconds ago (an upload still being retried), and reads past
an older gap as lost content.

Found by review (2026-11-28): the head was the end of the last persisted fragment, so a
micro-batch planned while fragment k was not yet in the store but k+1 was walked over the gap:
with failOnDataLoss=false fragment k was skipped for good, and with the default the query failed
with GazetteDataLossError although nothing was lost. Brokers do not persist strictly in order
(broker/fragment/persister.py retries a failed round after the ones behind it).

The reader is driven as Spark drives it (initialOffset, latestOffset, partitions, read), in this
process; the store is the one test_spark_store_read.py's fixture fills with a real broker.
A middle fragment file is moved out of the store and back, as a late upload would.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_integration.offsets import from_json
from spark_integration.read_options import parse_read_options
from spark_integration.source import default_schema
from spark_integration.sources import GazetteDataLossError
from spark_integration.stream_read import GazetteStreamReader
from tests.spark_integration.spark_testkit import micro_batch_texts
from tests.spark_integration.test_spark_store_read import _persisted, stopped_store  # noqa: F401


def test_a_fragment_persisted_late_is_read_by_a_store_stream(
    stopped_store: tuple[Path, str, list[str], list[tuple[int, int]]],  # noqa: F811
) -> None:
    root, journal, texts, _spans = stopped_store
    files = _persisted(root, journal)
    assert len(files) >= 4
    late_begin, late_end, late = files[len(files) // 2]  # Not yet uploaded when planned.
    hidden = root / "late-upload"
    late.rename(hidden)

    opts = parse_read_options(
        {"store": f"file://{root}/frag/", "journals": journal, "failOnDataLoss": "false"},
        "stream",
    )
    reader = GazetteStreamReader(opts, default_schema(opts))
    start = reader.initialOffset()
    first, end = micro_batch_texts(reader, start)

    hidden.rename(late)  # The upload lands.
    second, _ = micro_batch_texts(reader, end)

    persisted_end = max(e for _, e, _ in files)
    expected = sorted(t for t, (b, _e) in zip(texts, _spans, strict=True) if b < persisted_end)
    got = sorted(first + second)
    missing = sorted(set(expected) - set(got))
    assert not missing, (
        f"fragment [{late_begin}, {late_end}) was persisted after the fragments behind it:"
        f" {len(missing)} of its rows were never delivered, e.g. {missing[:3]}"
    )


def test_a_fragment_not_yet_persisted_is_no_data_loss(
    stopped_store: tuple[Path, str, list[str], list[tuple[int, int]]],  # noqa: F811
) -> None:
    root, journal, _texts, _spans = stopped_store
    files = _persisted(root, journal)
    gap_begin, _e, late = files[len(files) // 2]
    late.rename(root / "late-upload")
    opts = parse_read_options({"store": f"file://{root}/frag/", "journals": journal}, "stream")
    reader = GazetteStreamReader(opts, default_schema(opts))
    start = reader.initialOffset()
    end = reader.latestOffset(start, None)  # Stops before the gap: no data loss.
    assert from_json(end)[journal].offset(journal) <= gap_begin


def test_a_gap_older_than_the_grace_is_lost_content(
    stopped_store: tuple[Path, str, list[str], list[tuple[int, int]]],  # noqa: F811
) -> None:
    """A gap whose next fragment was persisted longer ago than storeGapGraceSeconds (0 here)
    is a loss (a fragment that will not come): reported, not waited on forever."""
    root, journal, _texts, _spans = stopped_store
    files = _persisted(root, journal)
    _b, _e, late = files[len(files) // 2]
    late.rename(root / "late-upload")
    options = {"store": f"file://{root}/frag/", "journals": journal, "storeGapGraceSeconds": "0"}
    opts = parse_read_options(options, "stream")
    reader = GazetteStreamReader(opts, default_schema(opts))
    with pytest.raises(GazetteDataLossError, match="no fragment holds it"):
        micro_batch_texts(reader, reader.initialOffset())
