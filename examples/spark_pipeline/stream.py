"""Copy one journal's committed messages to another with a streaming query, exactly once.

The query reads the source's committed messages ``{"key": ..., "n": ...}`` (read-committed:
duplicates, rolled-back and unacknowledged transactions are dropped), keeps those with n > 1,
and appends them to the sink with the gazette streaming sink. It runs with
``Trigger.AvailableNow``: it processes what the source holds when it starts, and stops. Run it
again with the same checkpoint and it takes up where it stopped, each message copied once.

    python -m examples.spark_pipeline.stream --broker localhost:8080 \\
        --source examples/orders --sink examples/big-orders --checkpoint /tmp/big-orders-cp

    python -m examples.spark_pipeline.stream --demo   # a broker, some input, two runs

`--demo` runs `gazette serve` on a free loopback port, creates the journals, publishes a few
messages, runs the query, publishes one more and runs it again, then prints the sink: the four
orders with n > 1 of the first run (of which one in a transaction; an abandoned one is not
there), and the new one.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from typing import Any

from pyspark.sql import SparkSession

from examples.spark_pipeline.pipeline import _demo_broker, _publish_demo_input


def run_stream(spark: SparkSession, broker: str, source: str, sink: str, checkpoint: str) -> None:
    """Copy `source`'s committed messages with n > 1 to `sink`, from where the query whose
    checkpoint is `checkpoint` stopped (or the beginning), until the source's current end."""
    query = (
        spark.readStream.format("gazette")
        .option("broker", broker)
        .option("journals", source)
        .schema("content STRING, n LONG")
        .load()
        .where("n > 1")
        .select("content")
        .writeStream.format("gazette")
        .option("broker", broker)
        .option("journal", sink)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


async def _publish_more(broker: str, source: str) -> None:
    """More demo input: one order, committed alone."""
    from broker.client import AppendService, JournalClient
    from gazette_consumer.message import JSONMessage, Partition, Publisher

    class Order(JSONMessage, kw_only=True):
        key: str = ""
        n: int = 1

    client = JournalClient(broker)
    try:
        to_source = lambda _m: Partition(source, "application/x-ndjson")  # noqa: E731
        async with AppendService(client) as service:
            await Publisher(service).publish_committed(to_source, Order(key="figs", n=7))
    finally:
        await client.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="localhost:8080")
    parser.add_argument("--source", default="examples/orders")
    parser.add_argument("--sink", default="examples/big-orders")
    parser.add_argument("--checkpoint", default="")
    parser.add_argument("--demo", action="store_true", help="start a broker, publish input")
    args = parser.parse_args(argv)

    from spark_integration import GazetteDataSource

    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    checkpoint = args.checkpoint or tempfile.mkdtemp(prefix="gazette-stream-cp-")

    spark = SparkSession.builder.master("local[2]").appName("gazette-stream").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(GazetteDataSource)

    def show(broker: str) -> None:
        sink: Any = spark.read.format("gazette").option("broker", broker)
        sink.option("journals", args.sink).load().select("offset", "content").show(truncate=False)

    try:
        if args.demo:
            with _demo_broker() as broker:
                asyncio.run(_publish_demo_input(broker, args.source, args.sink))
                run_stream(spark, broker, args.source, args.sink, checkpoint)
                asyncio.run(_publish_more(broker, args.source))
                run_stream(spark, broker, args.source, args.sink, checkpoint)  # Only what's new.
                show(broker)
        else:
            run_stream(spark, args.broker, args.source, args.sink, checkpoint)
            show(args.broker)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
