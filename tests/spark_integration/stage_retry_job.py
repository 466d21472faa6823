"""A Spark driver of its own on a local cluster (a master, a worker, two executor JVMs), for
test_spark_stage_retry.py: a streaming query copies one journal into another through a
shuffle, so that the sink's tasks read their rows from both executors. In the first
micro-batch, the first attempt of partition 0's write task kills its own executor JVM with
SIGKILL once it has passed `KILL_AT_ROW` rows on to the sink (and the sink has appended some of
them): the task is lost with the executor, and so are the executor's shuffle outputs, which the
write stage's tasks still need. Spark then reruns the map stage and resubmits the write stage,
whose tasks start again as attempt 0 of a new stage attempt: the case the sink's producer
claims are for (docs/spark.md, "Exactly-once writes").

    python -m tests.spark_integration.stage_retry_job BROKER SOURCE SINK CHECKPOINT MARKER

MARKER is a file the killing task creates before it kills, so that exactly one executor is
killed in the whole run. At the end the job prints one line of JSON: the write stages'
attempts as Spark's status tracker saw them.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

# Rows of partition 0 the write task passes on before it kills its executor: past the sink's
# first appends: it is handed rows in batches of ROWS_PER_BATCH, and appends each MiB.
KILL_AT_ROW = 6000

ROWS_PER_BATCH = 1000

_passed: dict[int, int] = {}  # Rows passed on, per task attempt (taskAttemptId).


def _executor_jvm() -> int:
    """The pid of the executor JVM this Python worker runs under (its nearest ancestor whose
    command line names CoarseGrainedExecutorBackend)."""
    pid = os.getpid()
    while pid > 1:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"CoarseGrainedExecutorBackend" in cmdline:
            return pid
        stat = Path(f"/proc/{pid}/stat").read_text()
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # The parent's pid.
    raise RuntimeError("no executor JVM among this worker's ancestors")


def kill_once(broker: str, sink: str, marker: str) -> Any:
    """A UDF passing its argument through, which kills its executor as described above."""
    from pyspark import TaskContext

    from tests.spark_integration.job_session import wait_for_claims

    def pass_through(text: str) -> str:
        ctx = TaskContext.get()
        assert ctx is not None
        attempt = ctx.taskAttemptId()
        n = _passed[attempt] = _passed.get(attempt, 0) + 1
        if n == KILL_AT_ROW and ctx.partitionId() == 0 and ctx.attemptNumber() == 0:
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return text  # Killed once already (an earlier micro-batch).
            os.write(fd, f"{ctx.stageId()} {attempt}\n".encode())
            os.close(fd)
            # The rows passed on so far are on their way to the sink (in the pipes between
            # this UDF, the JVM and the sink's Python worker): kill once it has appended.
            wait_for_claims(
                broker,
                sink,
                lambda claims: any(c.task_attempt_id == attempt for c in claims),
                f"task attempt {attempt}'s first append",
            )
            os.kill(_executor_jvm(), signal.SIGKILL)
        return text

    return pass_through


def main(argv: list[str]) -> int:
    broker, source, sink, checkpoint, marker = argv
    from pyspark.sql import functions as f
    from pyspark.sql.types import StringType

    from tests.spark_integration.job_session import (
        job_session,
        shuffled_through,
        write_available_now,
    )

    # Failed task attempts are logged as warnings: the test looks for the claimed producer's.
    spark = job_session(
        "local-cluster[2,1,1024]",
        "gazette-stage-retry",
        log_level="WARN",
        **{
            "spark.sql.execution.arrow.maxRecordsPerBatch": str(ROWS_PER_BATCH),
            "spark.executorEnv.PYTHONPATH": os.environ.get("PYTHONPATH", ""),
        },
    )
    udf = f.udf(kill_once(broker, sink, marker), StringType())
    source_rows = shuffled_through(spark, broker, source, udf)
    query = write_available_now(source_rows, broker, sink, checkpoint)
    print("started", flush=True)
    query.awaitTermination()
    tracker = spark.sparkContext.statusTracker()
    stages = []
    for stage_id in range(64):
        info = tracker.getStageInfo(stage_id)
        if info is not None:
            stages.append({"stage": stage_id, "attempt": info.currentAttemptId, "name": info.name})
    print("\n" + json.dumps({"stages": stages}), flush=True)  # On a line of its own.
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
