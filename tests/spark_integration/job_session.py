"""What the driver jobs of their own (driver_job.py, stage_retry_job.py, speculation_job.py)
share: their SparkSession (on loopback, without the UI, two shuffle partitions, the gazette data
source registered), their streaming write, and their UDFs' wait for the sink's claims."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def job_session(master: str, app_name: str, log_level: str = "ERROR", **conf: str) -> Any:
    """A SparkSession on `master` with the settings above and `conf` (Spark keys with dots
    given as a dict's keys: `**{"spark.x.y": "1"}`)."""
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    from spark_integration import GazetteDataSource

    spark.dataSource.register(GazetteDataSource)
    return spark


def shuffled_through(spark: Any, broker: str, source: str, udf: Any) -> Any:
    """A stream of journal `source`'s message contents, repartitioned by content into two
    partitions (a shuffle: the write stage's tasks read from every executor), each passed
    through `udf` in the write stage."""
    return (
        spark.readStream.format("gazette")
        .option("broker", broker)
        .option("journals", source)
        .load()
        .selectExpr("content")
        .repartition(2, "content")
        .select(udf("content").alias("content"))
    )


def write_available_now(df: Any, broker: str, sink: str, checkpoint: str) -> Any:
    """Start a streaming write of `df` into journal `sink` through the gazette sink,
    checkpointed at `checkpoint`, over what its source has when it starts
    (Trigger.AvailableNow); returns the query."""
    return (
        df.writeStream.format("gazette")
        .option("broker", broker)
        .option("journal", sink)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )


# How long a driver job's UDF waits for the sink's claims to change, and the polling backoff.
CLAIM_WAIT_S = 120.0
CLAIM_POLL_S_MAX = 0.2


def wait_for_claims(broker: str, sink: str, until: Callable[[list[Any]], bool], what: str) -> None:
    """Return once `until` holds of the producer claims in journal `sink`'s registers
    (`spark_integration.sink_task.Claim`s); polled, backing off, for at most CLAIM_WAIT_S, then
    RuntimeError naming `what` was awaited."""
    from spark_integration.journal_io import run_with_client
    from spark_integration.publish import read_registers
    from spark_integration.sink_task import claims_of

    deadline, wait = time.monotonic() + CLAIM_WAIT_S, 0.01
    while True:
        registers = run_with_client(broker, lambda client: read_registers(client, sink))
        if until(claims_of(registers)):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{sink}: {what} did not happen within {CLAIM_WAIT_S:g} s")
        time.sleep(wait)
        wait = min(wait * 2, CLAIM_POLL_S_MAX)
