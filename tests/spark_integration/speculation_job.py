"""A Spark driver of its own on a standalone cluster of real processes (a master and two
workers on different loopback hosts: standalone_cluster.py), with speculative execution on, for
test_spark_speculation.py: a streaming query copies one journal into another through a shuffle.

In the first micro-batch, the first attempt of partition 0's write task stalls once the sink
has appended some of its rows: its UDF stops passing rows on until the driver's commit of the
micro-batch has removed the attempt's claim. The write task of partition 1 finishes, so Spark
marks partition 0 as speculatable and runs a copy of it (attempt 1) on the other host, whose
executor is free. The copy publishes under a producer of its own and finishes; Spark kills the
stalled attempt ("another attempt succeeded"), and the driver commits the copy's rows and rolls
back what the stalled attempt appended: the case docs/spark.md names ("Failed, retried and
speculative tasks").

    python -m tests.spark_integration.speculation_job BROKER SOURCE SINK CHECKPOINT MARKER ROOT

MARKER is a file the stalling task creates, so that exactly one attempt stalls in the whole
run (it records there what the stalled attempt saw of its claim); ROOT holds the cluster's logs
and work directories.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

# The rows of partition 0 its first attempt passes on before it stalls: past the sink's first
# append (it is handed rows in batches of ROWS_PER_BATCH, and appends each MiB).
STALL_AT_ROW = 3000
ROWS_PER_BATCH = 1000
# Two workers, on hosts other than the driver's (127.0.0.1).
WORKER_HOSTS = ("127.0.0.2", "127.0.0.3")
EXECUTORS_WAIT_S = 180.0
# Speculation, checked every SPECULATION_INTERVAL: a task is copied once it ran longer than
# SPECULATION_MULTIPLIER x the median of its stage's finished tasks (and SPECULATION_MIN_S),
# as soon as half of them finished. Spark's "efficiency" check (a task reading slowly) is off:
# a stalled task is copied by its run time alone, as in Spark before 3.4.
SPECULATION_CONF = {
    "spark.speculation": "true",
    "spark.speculation.interval": "100ms",
    "spark.speculation.multiplier": "1.5",
    "spark.speculation.quantile": "0.5",
    "spark.speculation.minTaskRuntime": "1s",
    "spark.speculation.efficiency.enabled": "false",
}

_passed: dict[int, int] = {}  # Rows passed on, per task attempt (taskAttemptId).


def stall_once(broker: str, sink: str, marker: str) -> Any:
    """A UDF passing its argument through, which stalls as described above. The marker file
    gets the stalled attempt's task attempt id, then a line once its claim is gone."""
    from pyspark import TaskContext

    from tests.spark_integration.job_session import wait_for_claims

    def pass_through(text: str) -> str:
        ctx = TaskContext.get()
        assert ctx is not None
        attempt = ctx.taskAttemptId()
        n = _passed[attempt] = _passed.get(attempt, 0) + 1
        if n == STALL_AT_ROW and ctx.partitionId() == 0 and ctx.attemptNumber() == 0:
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return text  # Stalled once already (an earlier micro-batch).
            os.write(fd, f"stalled {attempt}\n".encode())
            # The rows passed on so far are on their way to the sink: stall once it appended
            # them (its claim is there), until the driver's commit removed the claim. Spark
            # may kill this worker meanwhile: then the marker says no more.
            wait_for_claims(
                broker,
                sink,
                lambda claims: any(c.task_attempt_id == attempt for c in claims),
                f"task attempt {attempt}'s first append",
            )
            os.write(fd, b"appended\n")
            wait_for_claims(
                broker,
                sink,
                lambda claims: all(c.task_attempt_id != attempt for c in claims),
                f"the commit removing task attempt {attempt}'s claim",
            )
            os.write(fd, b"claim removed\n")
            os.close(fd)
        return text

    return pass_through


def main(argv: list[str]) -> int:
    broker, source, sink, checkpoint, marker, root = argv
    from pyspark.sql import functions as f
    from pyspark.sql.types import StringType

    from tests.spark_integration.job_session import (
        job_session,
        shuffled_through,
        write_available_now,
    )
    from tests.spark_integration.standalone_cluster import (
        EXECUTOR_MEMORY,
        standalone_cluster,
        wait_for_executors,
    )

    with standalone_cluster(Path(root), WORKER_HOSTS) as master:
        spark = job_session(
            master,
            "gazette-speculation",
            log_level="WARN",
            **SPECULATION_CONF,
            **{
                "spark.executor.memory": EXECUTOR_MEMORY,
                "spark.executor.cores": "1",
                "spark.sql.execution.arrow.maxRecordsPerBatch": str(ROWS_PER_BATCH),
                "spark.executorEnv.PYTHONPATH": os.environ.get("PYTHONPATH", ""),
            },
        )
        # The scheduler's decisions (speculatable, launched, killed) are logged at INFO.
        jvm = spark.sparkContext._jvm
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
            "org.apache.spark.scheduler.TaskSetManager", jvm.org.apache.logging.log4j.Level.INFO
        )
        wait_for_executors(spark, WORKER_HOSTS, EXECUTORS_WAIT_S)
        udf = f.udf(stall_once(broker, sink, marker), StringType())
        source_rows = shuffled_through(spark, broker, source, udf)
        query = write_available_now(source_rows, broker, sink, checkpoint)
        print("started", flush=True)
        query.awaitTermination()
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
