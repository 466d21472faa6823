"""A Spark write whose broker's disk fills up in the middle of the job: a real `gazette serve`
process with its data directory (spools, embedded keyspace, log) on a small tmpfs, its fragment
store elsewhere, and more rows to write than that disk holds.

What a user sees: the appends that do not fit are refused (UNAVAILABLE, "append to <journal>:
... No space left on device"), a task tries each append `appendAttempts` times (default 10,
about 16 s of back-off; 2 here, so that the test does not wait), then fails, Spark retries it
(the session's master, local[2,3], gives a task three attempts) and then fails the job, or the
streaming query, with an error on the driver that names the journal and the cause: not a hang.
Read-committed readers see nothing of the failed job, although part of its rows were appended
before the disk filled. Once the disk has room again (the broker keeps running), the same batch
job run again, or the streaming query restarted from its checkpoint, delivers every row exactly
once."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.client import JournalClient, apply_journals, upsert
from broker.protocol import labels
from broker.protocol import protocol_pb2 as pb
from tests.broker.serve_testkit import gazette_serve
from tests.broker.test_disk_full_serve import spec as disk_full_spec
from tests.small_disk import resize, small_disk
from tests.spark_integration.spark_testkit import (
    CONTINUE,
    TextSource,
    committed,
    create_journals,
    read_all,
    reader,
    start_copy,
    unique,
    uuid_flags,
)

pytestmark = [pytest.mark.spark]

DISK_BYTES = 3 << 20
DISK_BYTES_AFTER = 128 << 20
# The batch job's rows: a small first partition (one append, which fits) and a second one of
# twice the disk, refused part way. Which of the two tasks meets the full disk first does not
# matter to what the test asserts.
ROWS = 6000
SMALL_PAD, LARGE_PAD = 8, 2000
# The streaming query's rows: one micro-batch of twice the disk.
STREAM_ROWS = 3000
STREAM_PAD = 2000
# How long a failing streaming query may take to stop: its three task attempts, and reading
# and writing what fit before the disk filled, on a loaded machine.
STREAM_FAIL_S_MAX = 90
CAUSE = "No space left on device"
# Tries of each append of a task (option appendAttempts): the default's ~16 s of back-off per
# task attempt would be most of this test's time.
APPEND_ATTEMPTS = "2"


def sink_spec(name: str) -> pb.JournalSpec:
    """A JSON-lines journal whose fragments roll only as its first append does: the spool on the
    small disk holds the rest, and its store (off that disk) takes what was persisted."""
    out = disk_full_spec(name)
    out.labels.CopyFrom(
        pb.LabelSet(
            labels=[pb.Label(name=labels.CONTENT_TYPE, value=labels.CONTENT_TYPE_JSON_LINES)]
        )
    )
    return out


def create_sink(broker: str, name: str) -> None:
    async def go() -> None:
        client = JournalClient(broker)
        try:
            await apply_journals(client, [upsert(sink_spec(name))])
        finally:
            await client.close()

    asyncio.run(go())


def committed_bodies(broker: str, journal: str) -> list[dict[str, Any]]:
    """The journal's committed JSON messages, by its raw content put through a Sequencer
    (spark_testkit.committed), apart from the data source's read path."""
    bodies = [json.loads(line) for line in read_all(broker, journal).splitlines()]
    return list(committed(journal, [(uuid.UUID(b["UUID"]), b) for b in bodies]))


def failed_uncommitted(
    spark: Any, failed: BaseException, broker: str, journal: str, proc: Any
) -> None:
    """The write failed on the driver with the broker's refusal as the last task attempt met
    it (naming the journal and the cause), the broker still runs, and the rows appended
    before the disk filled are all uncommitted: nothing is readable read-committed."""
    text = str(failed)
    assert "StatusCode.UNAVAILABLE" in text, text[-3000:]
    assert CAUSE in text, text[-3000:]
    assert f"append to {journal}: " in text, text[-3000:]
    assert proc.poll() is None, "the broker stopped"
    flags = uuid_flags(read_all(broker, journal))
    assert flags.count(CONTINUE) > 0, flags
    assert all(flag != 0 for flag in flags), "a message outside a transaction"
    assert committed_bodies(broker, journal) == []
    assert reader(spark, broker, journals=journal).load().count() == 0


@pytest.fixture
def full_disk_broker(tmp_path: Path) -> Iterator[tuple[str, Path, Any]]:
    """(host:port, its disk, its process) of a broker whose data directory is a small disk."""
    store = tmp_path / "store"
    store.mkdir()
    with (
        small_disk(tmp_path / "disk", DISK_BYTES) as disk,
        gazette_serve(disk, "--file-root", str(store)) as (port, proc),
    ):
        yield f"127.0.0.1:{port}", disk, proc


def test_batch_write_fails_naming_the_full_disk_and_commits_nothing(  # type: ignore[no-untyped-def]
    spark, full_disk_broker
) -> None:
    from pyspark.errors import PythonException

    broker, disk, proc = full_disk_broker
    journal = unique("spark/disk-full")
    create_sink(broker, journal)
    df = spark.range(ROWS, numPartitions=2).selectExpr(
        "to_json(named_struct('k', id, 'pad', repeat('x', IF(id < "
        f"{ROWS // 2}, {SMALL_PAD}, {LARGE_PAD})))) AS content"
    )

    def write() -> None:
        df.write.format("gazette").mode("append").option("broker", broker).option(
            "journal", journal
        ).option("appendAttempts", APPEND_ATTEMPTS).save()

    with pytest.raises(PythonException) as failed:
        write()
    failed_uncommitted(spark, failed.value, broker, journal, proc)

    # Room again, the broker still running: the same job, run again, lands exactly once.
    resize(disk, DISK_BYTES_AFTER)
    write()
    expected = list(range(ROWS))
    assert sorted(b["k"] for b in committed_bodies(broker, journal)) == expected
    back = reader(spark, broker, journals=journal).load().collect()
    assert sorted(json.loads(r.content)["k"] for r in back) == expected


def test_streaming_write_fails_naming_the_full_disk_and_restarts_exactly_once(  # type: ignore[no-untyped-def]
    spark, broker, full_disk_broker, tmp_path: Path
) -> None:
    from pyspark.errors import StreamingQueryException

    sink_broker, disk, proc = full_disk_broker
    source, sink = unique("spark/disk-full-src"), unique("spark/disk-full")
    create_journals(broker, [source])  # On the session's broker, which has room.
    create_sink(sink_broker, sink)
    texts: list[str] = []
    add = TextSource(broker, source).add
    for lo in range(0, STREAM_ROWS, 1000):
        texts += add([f"{i:06d}-" + "x" * STREAM_PAD for i in range(lo, lo + 1000)])

    def start() -> Any:
        return start_copy(
            spark,
            broker,
            source,
            sink,
            tmp_path / "cp",
            sink_broker=sink_broker,
            appendAttempts=APPEND_ATTEMPTS,
        )

    query = start()
    try:
        with pytest.raises(StreamingQueryException) as failed:
            # Returns False (and the test fails) if the query still runs then.
            query.awaitTermination(STREAM_FAIL_S_MAX)
    finally:
        query.stop()
    failed_uncommitted(spark, failed.value, sink_broker, sink, proc)

    # Room again: restarted from its checkpoint, the query delivers every row exactly once.
    resize(disk, DISK_BYTES_AFTER)
    query = start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert sorted(b["text"] for b in committed_bodies(sink_broker, sink)) == texts
    back = reader(spark, sink_broker, journals=sink).load().collect()
    assert sorted(json.loads(r.content)["text"] for r in back) == texts
