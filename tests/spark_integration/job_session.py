"""The SparkSession of a driver job of its own (driver_job.py, stage_retry_job.py): on
loopback, without the UI, two shuffle partitions, the gazette data source registered."""

from __future__ import annotations

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
