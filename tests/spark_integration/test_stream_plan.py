"""Planning streaming micro-batches on the driver: what `latestOffset` answers, and that the
partitions of a micro-batch, read as Spark reads them, deliver each committed message once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from spark_integration import offsets
from spark_integration.read_options import parse_read_options
from spark_integration.rows import META_SCHEMA
from spark_integration.stream_read import GazetteStreamReader
from tests.spark_integration.spark_testkit import unique
from tests.spark_integration.test_range_split import (
    SPLIT_OPTIONS,
    append_in_groups,
    create_small_fragment_journal,
    long_transaction_history,
)

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]


def stream_reader(broker: str, journal: str) -> GazetteStreamReader:
    """The stream reader Spark builds for these options, its micro-batches split in several
    partitions."""
    options = {"broker": broker, "journals": journal, **SPLIT_OPTIONS}
    return GazetteStreamReader(parse_read_options(options, "stream"), META_SCHEMA)


def test_nothing_new_answers_the_start_offset_as_it_is(broker: str) -> None:
    """With nothing new, latestOffset answers its start offset unchanged (its split checkpoints
    included): an answer that differs in any way makes Spark run a micro-batch of no rows
    (its offset log written, its partitions planned) after every micro-batch of data."""
    journal = unique("spark/stream-plan")
    create_small_fragment_journal(broker, journal, 16 << 10)
    append_in_groups(broker, journal, long_transaction_history())
    reader = stream_reader(broker, journal)
    reader.prepareForTriggerAvailableNow()
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    assert offsets.from_json(end)[journal].splits, "the micro-batch is not split: no test"
    assert reader.latestOffset(end, ReadAllAvailable()) == end


def test_the_planning_walk_imports_no_pandas(broker: str) -> None:
    """The driver's process of a streaming query (Spark starts one per query) plans its first
    micro-batch without importing pandas (~0.4 s, once per query): pyarrow imports it on the
    first `pa.array` of a process, so the scan builds its columns from buffers."""
    journal = unique("spark/stream-plan")
    create_small_fragment_journal(broker, journal, 16 << 10)
    append_in_groups(broker, journal, long_transaction_history())
    code = (
        "import sys\n"
        "from pyspark.sql.streaming.datasource import ReadAllAvailable\n"
        "from spark_integration import offsets\n"
        "from tests.spark_integration.test_stream_plan import stream_reader\n"
        "assert 'pandas' not in sys.modules\n"
        f"reader = stream_reader({broker!r}, {journal!r})\n"
        "reader.prepareForTriggerAvailableNow()\n"
        "start = reader.initialOffset()\n"
        "end = reader.latestOffset(start, ReadAllAvailable())\n"
        f"assert offsets.read_through(end)[{journal!r}] > 0\n"
        "print('pandas' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", "planning imported pandas"
