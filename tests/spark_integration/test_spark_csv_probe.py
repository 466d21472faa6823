"""A streaming write to a CSV journal looks up the journal's width (a read of its first record)
once per process, not in every micro-batch: Spark builds the sink's writer twice per
micro-batch (to plan it in one Python process, to commit it in another; it reuses both), and a
journal's first record does not change (csv_width.py). Micro-batch 0 finds the journal empty
(nothing to remember), its commit and micro-batch 1's planning learn the width: from then on,
no look-up.

The probe's reads are counted by the broker's own metric (`gazette_reads_total`) on a broker of
this test's own, which serves nothing else: the query reads its input from files, so every Read
RPC the broker receives is the sink's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.protocol import labels
from tests.broker.serve_testkit import free_port
from tests.spark_integration.spark_testkit import broker_process, create_journals, unique
from tests.spark_integration.test_spark_csv_write import committed_csv
from tests.spark_integration.test_spark_idle_wait import reads

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def metered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(host:port, metrics URL) of a broker process serving its HTTP gateway too."""
    http_port = free_port()
    with broker_process(
        tmp_path_factory.mktemp("probe-broker"), "--http-port", str(http_port)
    ) as port:
        yield f"127.0.0.1:{port}", f"http://127.0.0.1:{http_port}/debug/metrics"


def test_a_streaming_csv_write_probes_the_width_once(
    spark: Any, metered: tuple[str, str], tmp_path: Path
) -> None:
    broker, metrics_url = metered
    sink = unique("spark/csv-probe")
    create_journals(broker, [sink], content_type=labels.CONTENT_TYPE_CSV)
    inbox = tmp_path / "in"
    inbox.mkdir()

    def add(batch: int) -> list[list[str]]:
        rows = [{"text": f"b{batch}-{i}", "n": i} for i in range(3)]
        (inbox / f"{batch}.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return [[r["text"], str(r["n"])] for r in rows]

    query = (
        spark.readStream.schema("text STRING, n LONG")
        .option("maxFilesPerTrigger", 1)
        .json(str(inbox))
        .writeStream.format("gazette")
        .option("broker", broker)
        .option("journal", sink)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .start()
    )
    try:
        expected = []
        for batch in (0, 1):  # The journal's width is fixed, and known to both processes.
            expected += add(batch)
            query.processAllAvailable()
        known = reads(metrics_url)
        for batch in (2, 3, 4):
            expected += add(batch)
            query.processAllAvailable()
        later = reads(metrics_url) - known
        batches = {p["batchId"] for p in query.recentProgress if p["numInputRows"]}
    finally:
        query.stop()

    assert batches == {0, 1, 2, 3, 4}
    assert later == 0, f"{later} Read RPCs in micro-batches 2-4: the width was looked up again"
    assert sorted(committed_csv(broker, sink)) == sorted(expected)
