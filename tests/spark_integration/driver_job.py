"""A Spark driver of its own, for test_spark_driver_kill.py: a streaming query that copies one
journal into another with the gazette source and sink, micro-batch by micro-batch, until it has
read everything available when it started (Trigger.AvailableNow). The test kills this process
with SIGKILL in the middle of its micro-batches, then runs it again on the same checkpoint.

    python -m tests.spark_integration.driver_job BROKER SOURCE SINK CHECKPOINT MESSAGES_PER_BATCH
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    broker, source, sink, checkpoint, per_batch = argv
    from tests.spark_integration.job_session import job_session, write_available_now

    spark = job_session("local[2]", "gazette-driver-kill")
    source_rows = (
        spark.readStream.format("gazette")
        .option("broker", broker)
        .option("journals", source)
        .option("maxMessagesPerTrigger", per_batch)
        .load()
        .selectExpr("content")
    )
    query = write_available_now(source_rows, broker, sink, checkpoint)
    print("started", flush=True)
    query.awaitTermination()
    print("finished", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
