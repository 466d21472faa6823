"""Spark data source throughput, each figure beside its baseline measured in the same run.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_spark.py [rows]

Conditions: one `gazette serve` process on loopback (embedded keyspace, data in a temporary
directory, fragments of 1 MiB persisted to a file:// store there), Spark local[2], rows of ~200 bytes of JSON, wall clock of one run each, every read
into Spark's `noop` sink (the streaming read: one query, Trigger.AvailableNow). Baselines: `spark.read.json` of the same rows from a local file
(reads), parquet (writes).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pyspark.sql import SparkSession  # noqa: E402

from tests.broker.serve_testkit import gazette_serve  # noqa: E402
from tests.spark_integration.test_range_split import (  # noqa: E402
    create_small_fragment_journal,
)

rows_default = 1_000_000
# Reads are timed once the journal's fragments are in the store (what a read of data at rest
# does: straight from the store): waiting for the broker's uploads, at most this long.
persist_wait_s_max = 300.0
persist_poll_s_max = 2.0


def wait_persisted(broker: str, journal: str) -> int:
    """Wait until every fragment of `journal` but the open one is persisted; return how many
    are (a bounded wait: the figures say if it ran out)."""
    import asyncio

    from broker.client.list_apply import list_all_fragments
    from broker.client.route_cache import JournalClient
    from broker.protocol import protocol_pb2 as pb

    async def persisted() -> tuple[int, int]:
        client = JournalClient(broker)
        try:
            listing = await list_all_fragments(client, pb.FragmentsRequest(journal=journal))
        finally:
            await client.close()
        specs = [f.spec for f in listing.fragments]
        return sum(bool(f.backing_store) for f in specs), len(specs)

    deadline = time.monotonic() + persist_wait_s_max
    delay = 0.1
    while True:
        done, total = asyncio.run(persisted())
        if done >= total - 1 or time.monotonic() > deadline:
            return done
        time.sleep(delay)
        delay = min(persist_poll_s_max, delay * 2)


def timed(what: str, run) -> float:  # type: ignore[no-untyped-def]
    """Wall clock of `run()`, printed at once (with the load average): a run that fails later
    (a Python worker that does not connect back on an overloaded machine) keeps its figures."""
    start = time.perf_counter()
    run()
    took = time.perf_counter() - start
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"  {what}: {took:.2f} s (load average {load})", flush=True)
    return took


FLOOR_BATCH_ROWS = 50_000


def floor_source(n: int):  # type: ignore[no-untyped-def]
    """Spark's floor for a Python streaming source: one that does no work, yielding `n` rows of
    one ~200-byte string column from an Arrow array built once, in two partitions (as the
    gazette read of the bench's journal). Defined here, in __main__, so that Spark pickles it by
    value to its Python processes."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    class FloorReader(DataSourceStreamReader):
        def initialOffset(self) -> dict[str, int]:
            return {"end": 0}

        def latestOffset(self) -> dict[str, int]:
            return {"end": n}

        def partitions(self, start, end):  # type: ignore[no-untyped-def]
            half = (end["end"] - start["end"]) // 2
            return [InputPartition(half), InputPartition(end["end"] - start["end"] - half)]

        def read(self, partition):  # type: ignore[no-untyped-def]
            import pyarrow as pa

            column = pa.array(["x" * 200] * FLOOR_BATCH_ROWS, pa.string())
            rows = partition.value
            while rows > 0:
                take = min(rows, FLOOR_BATCH_ROWS)
                yield pa.RecordBatch.from_arrays([column.slice(0, take)], ["value"])
                rows -= take

        def commit(self, end) -> None:  # type: ignore[no-untyped-def]
            pass

    class FloorSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench-floor"

        def schema(self) -> str:
            return "value STRING"

        def streamReader(self, schema):  # type: ignore[no-untyped-def]
            return FloorReader()

    return FloorSource


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else rows_default
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    from spark_integration import GazetteDataSource

    spark.dataSource.register(GazetteDataSource)
    with tempfile.TemporaryDirectory() as tmp, gazette_serve(Path(tmp)) as (port, _proc):
        broker = f"127.0.0.1:{port}"
        journal = "bench/spark"
        # Fragments of 1 MiB, uncompressed, persisted to a file:// store under `tmp` (the
        # broker's file root): reads take them straight from there, as the data at rest.
        (Path(tmp) / "frag").mkdir()
        create_small_fragment_journal(broker, journal, 1 << 20, ("file:///frag/",))
        df = (
            spark.range(n)
            .selectExpr("id", "concat('user-', id % 1000) AS user", "repeat('x', 150) AS text")
            .repartition(2)
            .cache()
        )
        df.count()

        t_parquet = timed("parquet", lambda: df.write.mode("overwrite").parquet(f"{tmp}/p"))
        t_write = timed(
            "gazette write",
            lambda: (
                df.write.format("gazette")
                .mode("append")
                .option("broker", broker)
                .option("journal", journal)
                .save()
            ),
        )
        df.write.mode("overwrite").json(f"{tmp}/json")
        persisted = wait_persisted(broker, journal)
        schema = "id BIGINT, user STRING, text STRING"

        def noop(frame) -> None:  # type: ignore[no-untyped-def]
            frame.write.format("noop").mode("overwrite").save()

        t_json = timed("read.json", lambda: noop(spark.read.schema(schema).json(f"{tmp}/json")))
        reader = spark.read.format("gazette").option("broker", broker).option("journals", journal)
        t_cold = timed("gazette raw read (first)", lambda: noop(reader.load()))
        t_read = timed("gazette raw read", lambda: noop(reader.load()))
        t_read_fields = timed("gazette read, fields", lambda: noop(reader.schema(schema).load()))

        def stream() -> None:
            query = (
                spark.readStream.format("gazette")
                .option("broker", broker)
                .option("journals", journal)
                .load()
                .writeStream.format("noop")
                .option("checkpointLocation", f"{tmp}/stream-cp")
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            for progress in query.recentProgress:
                # Where a micro-batch's time went (latestOffset: the driver's planning walk;
                # addBatch: its partitions); the rest of the query's time is its start-up.
                durations = ", ".join(f"{k} {v}" for k, v in progress["durationMs"].items())
                print(
                    f"    micro-batch {progress['batchId']}: {progress['numInputRows']} rows;"
                    f" ms: {durations}",
                    flush=True,
                )
            rows = sum(p["numInputRows"] for p in query.recentProgress)
            assert rows == n, f"the streaming read delivered {rows} rows, not {n}"

        t_stream = timed("gazette streaming read", stream)
        spark.dataSource.register(floor_source(n))

        def stream_floor() -> None:
            query = (
                spark.readStream.format("bench-floor")
                .load()
                .writeStream.format("noop")
                .option("checkpointLocation", f"{tmp}/floor-cp")
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            rows = sum(p["numInputRows"] for p in query.recentProgress)
            assert rows == n, f"the floor's streaming read delivered {rows} rows, not {n}"

        t_floor = timed("a Python streaming source doing nothing (Spark's floor)", stream_floor)

        def rate(t: float) -> str:
            return f"{n / t / 1e3:8.0f}k rows/s ({t:6.2f} s)"

        print(
            f"rows={n}, ~200-byte JSON, local[2], one run, wall clock;"
            f" {persisted} fragments persisted before the reads"
        )
        print(
            f"batch write   gazette  {rate(t_write)}   parquet {rate(t_parquet)}"
            f"   ratio {t_parquet / t_write:.2f}x (target >= 0.3x)"
        )
        print(
            f"batch read    gazette  {rate(t_read)}   read.json {rate(t_json)}"
            f"   ratio {t_json / t_read:.2f}x (target >= 1.0x; raw columns)"
        )
        print(
            f"batch read    gazette  {rate(t_cold)}   read.json {rate(t_json)}"
            f"   ratio {t_json / t_cold:.2f}x (raw columns, the first gazette read of the session)"
        )
        print(
            f"batch read    gazette  {rate(t_read_fields)}   read.json {rate(t_json)}"
            f"   ratio {t_json / t_read_fields:.2f}x (fields parsed, user schema)"
        )
        print(
            f"stream read   gazette  {rate(t_stream)}   read.json {rate(t_json)}"
            f"   ratio {t_json / t_stream:.2f}x (target >= 0.5x; raw columns, availableNow)"
        )
        print(
            f"stream floor  nothing  {rate(t_floor)}   read.json {rate(t_json)}"
            f"   ratio {t_json / t_floor:.2f}x (a Python streaming source that does no work:"
            f" the most any reaches; gazette at {t_floor / t_stream:.2f}x of it)"
        )
    spark.stop()


if __name__ == "__main__":
    main()
