"""Read one journal, aggregate, write another: a batch Spark job over Gazette journals.

Input: JSON lines ``{"key": "...", "n": 3}`` in a source journal, published by Gazette
Publishers (committed or in transactions). The job reads the source read-committed (so
duplicates and rolled-back transactions count for nothing), sums ``n`` per key, and appends one
message ``{"key", "total", "messages"}`` per key to the sink journal, exactly once: the rows are
published uncommitted by the tasks and acknowledged by the driver only once the job succeeded.

    python -m examples.spark_pipeline.pipeline --broker localhost:8080 \\
        --source examples/orders --sink examples/totals

    python -m examples.spark_pipeline.pipeline --demo   # starts a broker and publishes input

`--demo` runs `gazette serve` on a free loopback port in a temporary directory, creates the two
journals, publishes a few messages (a transaction that is rolled back among them), runs the job
and prints the sink's content.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

SOURCE_SCHEMA = "key STRING, n LONG"


def run_pipeline(spark: SparkSession, broker: str, source: str, sink: str) -> DataFrame:
    """Sum `n` per key of `source`'s committed messages, append the totals to `sink`; return
    the totals written."""
    messages = (
        spark.read.format("gazette")
        .option("broker", broker)
        .option("journals", source)
        .schema(SOURCE_SCHEMA)
        .load()
    )
    totals = messages.groupBy("key").agg(
        F.sum(F.coalesce("n", F.lit(1))).alias("total"), F.count("*").alias("messages")
    )
    totals.write.format("gazette").mode("append").option("broker", broker).option(
        "journal", sink
    ).save()
    return totals


# -- the demo --------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _demo_broker() -> Iterator[str]:
    root = tempfile.mkdtemp(prefix="spark-pipeline-")
    port = _free_port()
    with open(os.path.join(root, "broker.log"), "wb") as log:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-c", "from broker.serve_cli import main; main()", "serve"),
                *("--port", str(port), "--data-dir", root, "--file-root", root),
            ],
            stdout=subprocess.PIPE,
            stderr=log,
        )
        assert proc.stdout is not None
        if not proc.stdout.readline().startswith(b"serving on"):
            raise SystemExit(f"the broker did not start: see {root}/broker.log")
        try:
            yield f"127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait()


async def _publish_demo_input(broker: str, source: str, sink: str) -> None:
    from google.protobuf.duration_pb2 import Duration

    from broker.client import AppendService, JournalClient, apply_journals, upsert
    from broker.protocol import protocol_pb2 as pb
    from gazette_consumer.message import JSONMessage, Partition, Publisher

    class Order(JSONMessage, kw_only=True):
        key: str = ""
        n: int = 1

    json_lines = pb.Label(name="content-type", value="application/x-ndjson")
    client = JournalClient(broker)
    try:
        await apply_journals(
            client,
            [
                upsert(
                    pb.JournalSpec(
                        name=name,
                        replication=1,
                        labels=pb.LabelSet(labels=[json_lines]),
                        fragment=pb.JournalSpec.Fragment(
                            length=1 << 20,
                            compression_codec=pb.NONE,
                            refresh_interval=Duration(seconds=1),
                        ),
                    )
                )
                for name in (source, sink)
            ],
        )
        to_source = lambda _m: Partition(source, json_lines.value)  # noqa: E731
        async with AppendService(client) as service:
            committed = Publisher(service)
            for key, n in (("apples", 3), ("pears", 2), ("apples", 4)):
                await committed.publish_committed(to_source, Order(key=key, n=n))
            # A transaction acknowledged: counts. One never acknowledged: does not.
            txn = Publisher(service)
            await txn.publish_uncommitted(to_source, Order(key="plums", n=5))
            await txn.write_ack_intents(txn.build_ack_intents())
            abandoned = Publisher(service)
            await abandoned.publish_uncommitted(to_source, Order(key="apples", n=100))
    finally:
        await client.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="localhost:8080")
    parser.add_argument("--source", default="examples/orders")
    parser.add_argument("--sink", default="examples/totals")
    parser.add_argument("--demo", action="store_true", help="start a broker, publish input")
    args = parser.parse_args(argv)

    from spark_integration import GazetteDataSource

    # Python workers must import this repository's packages too.
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    def run(broker: str) -> None:
        spark = SparkSession.builder.master("local[2]").appName("gazette-pipeline").getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        spark.dataSource.register(GazetteDataSource)
        try:
            run_pipeline(spark, broker, args.source, args.sink).show()
            sink: Any = spark.read.format("gazette").option("broker", broker)
            sink.option("journals", args.sink).load().select("offset", "content").show(
                truncate=False
            )
        finally:
            spark.stop()

    if args.demo:
        with _demo_broker() as broker:
            asyncio.run(_publish_demo_input(broker, args.source, args.sink))
            run(broker)
    else:
        run(args.broker)


if __name__ == "__main__":
    main()
