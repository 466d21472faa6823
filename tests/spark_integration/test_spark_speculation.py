"""The exactly-once sink with speculative execution, on a real standalone cluster (a master and
two workers on different loopback hosts, separate JVMs: speculation_job.py).

The first attempt of a write task appends part of its rows and stalls; Spark copies the task to
the other host (a speculative attempt, under a producer of its own), takes the copy's result and
kills the stalled attempt. Read back by an independent read-committed reader (the whole sink
journal through a Sequencer, not through Spark), the sink holds every source message exactly
once; the stalled attempt's appends are in the journal, rolled back by the commit that removed
its claim.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.spark_integration.spark_testkit import (
    append_texts,
    committed_texts,
    create_journals,
    read_all,
    run_job,
    unique,
)

pytestmark = [pytest.mark.serial, pytest.mark.spark, pytest.mark.timeout(480)]

# Source messages (~1 KiB each), all in the first micro-batch: ~6 MiB per write task, appended
# a MiB at a time, so that the stalled attempt appended some and had more to go.
messages_n = 12000
padding = "x" * 1000
job_timeout_s = 360.0


def test_a_speculative_copy_of_a_write_task_commits_once(broker: str, tmp_path: Path) -> None:
    source, sink = unique("spark/spec-src"), unique("spark/spec-sink")
    create_journals(broker, [source, sink])
    texts = [f"m{i}" for i in range(messages_n)]
    append_texts(broker, source, texts, padding)
    marker, log = tmp_path / "stalled", tmp_path / "job.log"
    args = [
        broker,
        source,
        sink,
        str(tmp_path / "checkpoint"),
        str(marker),
        str(tmp_path / "cluster"),
    ]
    output = run_job("speculation_job", args, log, job_timeout_s)
    assert marker.exists(), "no write task stalled"
    stalled = marker.read_text()
    assert "appended" in stalled, f"the stalled attempt appended nothing: {stalled!r}"
    # Spark's scheduler copied the stalled task to the other host and, once the copy succeeded,
    # killed the stalled attempt.
    assert re.search(r"as speculatable because it ran more than", output), output[-6000:]
    assert re.search(
        r"Killing attempt 0 for task 0\.0 in stage \S+ \(TID \d+\) on 127\.0\.0\.\d", output
    ), output[-6000:]

    written = committed_texts(broker, sink)
    assert len(written) == len(set(written)), "a message was committed twice"
    assert sorted(written) == sorted(texts)
    # The stalled attempt's appends are there, rolled back (not only never made).
    lines = read_all(broker, sink).count(b'"text"')
    assert lines > messages_n, f"{lines} messages in the sink: the stalled attempt appended none"
