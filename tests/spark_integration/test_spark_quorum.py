"""The Spark source, unchanged, on a quorum journal (issue #16: "read-committed consumers and
the Spark source work unchanged on quorum journals").

Three `gazette serve` processes on a real etcd serve a replication-3 journal labelled
`gazette.dev/replication-mode=quorum`. Messages are appended as a Gazette client would (the
first append finds the term's leader); among them a committed transaction, one still open, and a
duplicate. A batch read through any member returns exactly the committed messages, once each,
in journal order, as an independent read-committed reader (a Sequencer over the raw journal)
sees them; after every broker is stopped, a read from the fragment store alone returns the
persisted ones.

The streaming sink on a quorum journal: it fences its commits with the journal's registers
(check, subtract, union on one append), which quorum journals carry in their entries. A query
writes a quorum sink journal from a quorum source; micro-batch 0 is then run again (Spark's
record of it deleted, as if the driver died after the sink committed it): every source message
is committed to the sink exactly once.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from google.protobuf.duration_pb2 import Duration

from broker.client.appender import append
from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set
from broker.testing.process_cluster import ProcessCluster
from tests.spark_integration.spark_testkit import (
    ACK,
    CONTINUE,
    OUTSIDE,
    Msg,
    committed_texts,
    producer,
    unique,
)

pytestmark = [
    pytest.mark.spark,
    pytest.mark.etcd,
    pytest.mark.skipif(shutil.which("etcd") is None, reason="etcd not installed"),
    pytest.mark.timeout(240),
]

THREE_BROKERS = [("zone-a", "broker-a1"), ("zone-a", "broker-a2"), ("zone-b", "broker-b1")]
LEASE_TTL_S = 3
# Appends retried while no leader is elected yet (each a bounded back-off of the client).
append_attempts_max = 50
# Whole-step bound of the cluster's calls from this thread.
step_timeout_s = 120.0

T = TypeVar("T")


class LoopThread:
    """An event loop on a thread of its own: the cluster's processes and clients live on it,
    while the test thread drives Spark (whose calls block)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(step_timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(step_timeout_s)
        self.loop.close()


@pytest.fixture
def quorum() -> Iterator[tuple[ProcessCluster, LoopThread]]:
    thread = LoopThread()
    cluster = ProcessCluster(THREE_BROKERS, lease_ttl_s=LEASE_TTL_S)
    thread.run(cluster.__aenter__())
    try:
        yield cluster, thread
    finally:
        thread.run(cluster.__aexit__(None, None, None))
        thread.close()


def _spec(name: str, store: str) -> pb.JournalSpec:
    return pb.JournalSpec(
        name=name,
        replication=3,
        labels=label_set(
            [
                (gl.REPLICATION_MODE, gl.REPLICATION_MODE_QUORUM),
                (gl.CONTENT_TYPE, gl.CONTENT_TYPE_JSON_LINES),
            ]
        ),
        fragment=pb.JournalSpec.Fragment(
            length=4 << 10,  # Small fragments: several are persisted, the last one is open.
            compression_codec=pb.NONE,
            stores=[store],
            refresh_interval=Duration(seconds=1),
        ),
    )


def test_batch_reads_of_a_quorum_journal_are_read_committed(spark, quorum) -> None:  # type: ignore[no-untyped-def]
    cluster, thread = quorum
    journal = unique("quorum/spark")
    thread.run(cluster.apply([_spec(journal, cluster.store_url)]))
    thread.run(cluster.wait_until(cluster.journals_ready([journal], 3, zones_min=2)))

    a, b, c = producer(), producer(), producer()
    base = time.time_ns() // 100  # Any increasing clock will do.
    pad = "x" * 200
    messages = [Msg(a, base + i, OUTSIDE, {"text": f"a{i}", "pad": pad}) for i in range(40)]
    messages += [
        Msg(b, base + 100, CONTINUE, {"text": "b1", "pad": pad}),
        Msg(c, base + 100, CONTINUE, {"text": "c1", "pad": pad}),  # c never commits.
        Msg(b, base + 101, CONTINUE, {"text": "b2", "pad": pad}),
        Msg(a, base + 5, OUTSIDE, {"text": "a5", "pad": pad}),  # A duplicate of a5.
        Msg(b, base + 102, ACK),
    ]
    messages += [Msg(a, base + 200 + i, OUTSIDE, {"text": f"z{i}", "pad": pad}) for i in range(20)]

    async def append_all() -> int:
        client = cluster.client()
        end = 0
        for m in messages:
            resp = await append(
                client,
                pb.AppendRequest(journal=journal),
                m.line(),
                attempts_max=append_attempts_max,
            )
            assert resp.status == pb.OK
            end = resp.commit.end
        return end

    head = thread.run(append_all())
    # Read at once through every member, followers included: a non-blocking read (and the
    # write head a batch read plans its end from) sees every acknowledged append
    # (docs/design/quorum.md, "Reads").
    expected = [f"a{i}" for i in range(40)] + ["b1", "b2"] + [f"z{i}" for i in range(20)]
    # The independent reader agrees with what the test means by read-committed.
    via = cluster.brokers[1].endpoint
    assert committed_texts(via, journal) == expected

    for b_ in cluster.brokers:  # Through each member, leader and followers alike.
        rows = (
            spark.read.format("gazette")
            .option("broker", b_.endpoint)
            .option("journals", journal)
            .load()
            .orderBy("offset")
            .collect()
        )
        assert [json.loads(r.content)["text"] for r in rows] == expected, b_.suffix
        assert rows[-1].offset < head

    # Every broker stopped: what the store holds is read straight from it.
    persisted = sorted(cluster.fragments_dir.rglob("*"))
    assert any(p.is_file() for p in persisted), "no fragment was persisted"
    for b_ in list(cluster.running()):
        thread.run(cluster.kill(b_))
    store_rows = (
        spark.read.format("gazette")
        .option("store", f"file://{cluster.dir}/fragments/")
        .option("journals", journal)
        .load()
        .orderBy("offset")
        .collect()
    )
    store_texts = [json.loads(r.content)["text"] for r in store_rows]
    # At least the first fragment (4 KiB: ~16 messages) was persisted and rolled by then.
    assert len(store_texts) >= 16, f"only {len(store_texts)} rows read from the store"
    assert store_texts == expected[: len(store_texts)]


def _stream(spark: Any, broker: str, source: str, sink: str, cp: Path) -> Any:
    return (
        spark.readStream.format("gazette")
        .option("broker", broker)
        .option("journals", source)
        .load()
        .selectExpr("content")
        .writeStream.format("gazette")
        .option("broker", broker)
        .option("journal", sink)
        .option("checkpointLocation", str(cp))
        .start()
    )


def test_the_streaming_sink_commits_once_to_a_quorum_journal(spark, quorum, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cluster, thread = quorum
    source, sink = unique("quorum/stream-src"), unique("quorum/stream-sink")
    thread.run(cluster.apply([_spec(source, cluster.store_url), _spec(sink, cluster.store_url)]))
    thread.run(cluster.wait_until(cluster.journals_ready([source, sink], 3, zones_min=2)))
    a = producer()
    base = time.time_ns() // 100

    async def publish(texts: list[str], at: int) -> None:
        client = cluster.client()
        for i, text in enumerate(texts):
            line = Msg(a, base + at + i, OUTSIDE, {"text": text}).line()
            resp = await append(
                client,
                pb.AppendRequest(journal=source),
                line,
                attempts_max=append_attempts_max,
            )
            assert resp.status == pb.OK

    first = [f"first-{i}" for i in range(30)]
    thread.run(publish(first, 0))
    via = cluster.brokers[1].endpoint
    cp = tmp_path / "cp"
    query = _stream(spark, via, source, sink, cp)
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert committed_texts(via, sink) == first
    for record in ("0", ".0.crc"):  # Spark's record of micro-batch 0: it runs again.
        (cp / "commits" / record).unlink()

    second = [f"second-{i}" for i in range(30)]
    query = _stream(spark, via, source, sink, cp)
    try:
        query.processAllAvailable()  # micro-batch 0 again: fenced, committed once
        thread.run(publish(second, 1000))
        query.processAllAvailable()
    finally:
        query.stop()
    assert sorted(committed_texts(via, sink)) == sorted(first + second)
