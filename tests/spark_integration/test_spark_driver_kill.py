"""The exactly-once sink under `kill -9` of the Spark driver (issue #14's acceptance).

A streaming query runs in a driver process of its own (driver_job.py), copying a source journal
into a sink journal in micro-batches of a bounded number of messages. The test kills the driver
with SIGKILL while micro-batches are in flight, twice, at different points, and lets a third run
on the same checkpoint finish. Read back by an independent read-committed reader (the whole sink
journal through a Sequencer, not through Spark), the sink holds every source message exactly
once: batches the dead drivers left half-written are never seen, and batches they had committed
are not committed again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.spark_integration.spark_testkit import (
    OUTSIDE,
    Msg,
    append_messages,
    committed_texts,
    create_journals,
    producer,
    start_job,
    unique,
)

pytestmark = [pytest.mark.serial, pytest.mark.spark, pytest.mark.timeout(420)]

# Messages in the source journal, and at most this many per micro-batch: ~12 micro-batches.
messages_n = 3000
per_batch = 250
# A driver that has not planned the micro-batch it is to be killed in by then is stuck.
batch_timeout_s = 180.0
# The checkpoint directory is polled (no event exists for it), backing off up to this.
poll_s_max = 0.02


def _driver(
    broker: str, source: str, sink: str, checkpoint: Path, log: Path
) -> subprocess.Popen[bytes]:
    return start_job("driver_job", [broker, source, sink, str(checkpoint), str(per_batch)], log)


def _batches(checkpoint: Path, kind: str) -> set[int]:
    folder = checkpoint / kind
    if not folder.is_dir():
        return set()
    return {int(f.name) for f in folder.iterdir() if f.name.isdigit()}


def _kill_when(proc: subprocess.Popen[bytes], checkpoint: Path, batch: int, log: Path) -> None:
    """SIGKILL the driver's whole process group once it has planned micro-batch `batch` (its
    offsets are in the checkpoint's log): while the batch runs, or commits, or just after."""
    deadline, wait = time.monotonic() + batch_timeout_s, 0.01
    while batch not in _batches(checkpoint, "offsets"):
        if proc.poll() is not None:
            pytest.fail(f"the driver exited ({proc.returncode}) early:\n{log.read_text()[-4000:]}")
        assert time.monotonic() < deadline, f"micro-batch {batch} was not planned in time"
        time.sleep(wait)
        wait = min(wait * 2, poll_s_max)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_the_sink_is_exactly_once_across_driver_kills(broker: str, tmp_path: Path) -> None:
    source, sink = unique("spark/kill-src"), unique("spark/kill-sink")
    create_journals(broker, [source, sink])
    p = producer()
    texts = [f"m{i}" for i in range(messages_n)]
    append_messages(
        broker,
        source,
        [Msg(p, 1000 + i, OUTSIDE, {"text": t}) for i, t in enumerate(texts)],
        together=True,
    )
    checkpoint, log = tmp_path / "checkpoint", tmp_path / "driver.log"

    # Killed just after planning its second micro-batch, then (from the restored checkpoint)
    # after planning two more: each time with a batch in flight, and with earlier ones committed.
    for kill_at in (1, None):
        proc = _driver(broker, source, sink, checkpoint, log)
        planned = _batches(checkpoint, "offsets")
        _kill_when(proc, checkpoint, kill_at if kill_at is not None else max(planned) + 2, log)
    assert _batches(checkpoint, "commits"), "no micro-batch committed before the kills"

    proc = _driver(broker, source, sink, checkpoint, log)
    assert proc.wait(timeout=batch_timeout_s) == 0, log.read_text()[-4000:]

    written = committed_texts(broker, sink)
    assert len(written) == len(set(written)), "a message was committed twice"
    assert sorted(written) == sorted(texts)
