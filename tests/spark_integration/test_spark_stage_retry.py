"""The exactly-once sink across a lost executor and a resubmitted write stage, on a real local
cluster (a standalone master and worker, two executor JVMs: stage_retry_job.py).

A write task that appended part of its rows dies with its executor (SIGKILL of the JVM). Its
executor's shuffle outputs die with it, so Spark reruns the map stage and resubmits the write
stage: the partition is written again by attempt 0 of a new stage attempt, under the producer
the dead attempt had claimed. Read back by an independent read-committed reader (the whole sink
journal through a Sequencer, not through Spark), the sink holds every source message exactly
once, and the dead attempt's appends are in the journal, rolled back; the resubmitted
attempt 0 found the producer claimed and failed (ProducerClaimedError), and Spark's retry of it
published under a producer of its own.
"""

from __future__ import annotations

import json
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

pytestmark = [pytest.mark.serial, pytest.mark.spark, pytest.mark.timeout(420)]

# Source messages (~1 KiB each), all in the first micro-batch: ~12 MiB per write task, appended
# a MiB at a time, so that the killed task appended some before it died and had more to go.
messages_n = 24000
padding = "x" * 1000
job_timeout_s = 300.0


def test_a_write_stage_resubmitted_after_an_executor_loss_commits_once(
    broker: str, tmp_path: Path
) -> None:
    source, sink = unique("spark/stage-src"), unique("spark/stage-sink")
    create_journals(broker, [source, sink])
    texts = [f"m{i}" for i in range(messages_n)]
    append_texts(broker, source, texts, padding)
    marker, log = tmp_path / "killed", tmp_path / "job.log"
    args = [broker, source, sink, str(tmp_path / "checkpoint"), str(marker)]
    output = run_job("stage_retry_job", args, log, job_timeout_s)
    assert marker.exists(), "no write task killed its executor"
    # The job's report (Spark may log more once it stops).
    report = [line for line in output.splitlines() if line.startswith('{"stages"')]
    assert report, f"the job printed no report:\n{output[-6000:]}"
    stages = json.loads(report[-1])["stages"]
    assert any(s["attempt"] > 0 for s in stages), f"no stage was resubmitted: {stages}"
    # The resubmitted stage's attempt 0 of the partition found the dead attempt's claim on the
    # producer they share, appended nothing, and failed; its retry published under its own.
    assert "ProducerClaimedError" in output, "no attempt found its producer claimed"

    written = committed_texts(broker, sink)
    assert len(written) == len(set(written)), "a message was committed twice"
    assert sorted(written) == sorted(texts)
    # The dead attempt's appends are there, rolled back (not only never made).
    lines = read_all(broker, sink).count(b'"text"')
    assert lines > messages_n, f"{lines} messages in the sink: the dead attempt appended none"
