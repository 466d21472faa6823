"""Prometheus metrics of consumer shards, served by ``gazette-consumer serve --http-port`` at
``/debug/metrics``.

Per shard (label ``shard``, the ShardSpec ID):

- ``gazette_consumer_shard_transactions_total``: transactions whose commit started.
- ``gazette_consumer_shard_messages_total``: messages consumed by those transactions.
- ``gazette_consumer_shard_txn_duration_seconds``: from a transaction's first message to the
  start of its commit (histogram).
- ``gazette_consumer_shard_commit_latency_seconds``: from the start of a commit until the store
  made it durable (histogram; failed commits are not observed).
- ``gazette_consumer_shard_commit_failures_total``: commits that failed (fenced, say).
- ``gazette_consumer_shard_read_through_bytes`` (also label ``journal``): the source offset
  through which the last completed transaction read. Read lag is the journal's write head
  (the brokers' metrics, or ``gazctl journals list``) minus this: the shard's readers do not
  learn the head cheaply, so the lag itself is left to the query.

The collectors are module-level, in prometheus_client's default registry (as in
``broker.metrics``), so a process's shards, and a broker embedded in it, share one exposition.
The transaction loop records through a `ShardMetrics`, whose children are looked up once per
primary assignment; messages are counted per transaction (``ClosedTxn.consumed``), so that no
metric costs anything per message.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from typing import Final

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from gazette_consumer.stores.base import OpFuture
from gazette_consumer.transaction import ClosedTxn

__all__ = ["ShardMetrics", "forget_shard", "serve_metrics"]

# Seconds: transactions last from sub-millisecond to their max duration (Gazette's default 1s),
# stalled ones longer.
_DURATION_BUCKETS: Final = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

TRANSACTIONS: Final = Counter(
    "gazette_consumer_shard_transactions_total",
    "Consumer transactions whose commit started, by shard.",
    ["shard"],
)
MESSAGES: Final = Counter(
    "gazette_consumer_shard_messages_total",
    "Messages consumed by transactions whose commit started, by shard.",
    ["shard"],
)
TXN_DURATION: Final = Histogram(
    "gazette_consumer_shard_txn_duration_seconds",
    "Seconds from a transaction's first message to the start of its commit, by shard.",
    ["shard"],
    buckets=_DURATION_BUCKETS,
)
COMMIT_LATENCY: Final = Histogram(
    "gazette_consumer_shard_commit_latency_seconds",
    "Seconds from the start of a transaction's commit until the store made it durable.",
    ["shard"],
    buckets=_DURATION_BUCKETS,
)
COMMIT_FAILURES: Final = Counter(
    "gazette_consumer_shard_commit_failures_total",
    "Store commits that failed (a fenced zombie, a lost database), by shard.",
    ["shard"],
)
READ_THROUGH: Final = Gauge(
    "gazette_consumer_shard_read_through_bytes",
    "Source journal offset through which the shard's last completed transaction read.",
    ["shard", "journal"],
)


def forget_shard(shard: str) -> None:
    """Drop `shard`'s series from every per-shard metric: a shard that left this process (its
    assignment went to another member, or it was disabled or deleted) is no longer exported,
    and a process that sees many shards come and go does not grow with them. A shard that
    comes back starts its series afresh (Prometheus takes that as a counter reset, as after a
    process restart). Call it only while no ShardMetrics of `shard` is in use: one would go on
    recording into series no longer exported."""
    for metric in (TRANSACTIONS, MESSAGES, TXN_DURATION, COMMIT_LATENCY, COMMIT_FAILURES):
        with contextlib.suppress(KeyError):
            metric.remove(shard)
    journals = {
        sample.labels["journal"]
        for family in READ_THROUGH.collect()
        for sample in family.samples
        if sample.labels.get("shard") == shard
    }
    for journal in journals:
        with contextlib.suppress(KeyError):
            READ_THROUGH.remove(shard, journal)


class ShardMetrics:
    """The metrics of one shard, recorded by its transaction loop (on the event loop)."""

    def __init__(self, shard: str) -> None:
        self.shard = shard
        self._transactions = TRANSACTIONS.labels(shard)
        self._messages = MESSAGES.labels(shard)
        self._duration = TXN_DURATION.labels(shard)
        self._latency = COMMIT_LATENCY.labels(shard)
        self._failures = COMMIT_FAILURES.labels(shard)

    def commit_started(self, txn: ClosedTxn, commit: OpFuture) -> None:
        """A transaction's commit started: count it, and time the commit until it resolves."""
        self._transactions.inc()
        self._messages.inc(txn.consumed)
        self._duration.observe(max(0.0, txn.commit_started_at - txn.began_at))
        started = time.monotonic()

        def resolved(future: OpFuture) -> None:
            if future.cancelled():
                return  # Abandoned (the shard stopped): neither a latency nor a failure.
            if future.exception() is None:
                self._latency.observe(time.monotonic() - started)
            else:
                self._failures.inc()

        commit.add_done_callback(resolved)

    def progressed(self, read_through: Mapping[str, int]) -> None:
        """A transaction completed, having read each source journal through these offsets."""
        for journal, offset in read_through.items():
            READ_THROUGH.labels(self.shard, journal).set(offset)


async def serve_metrics(
    host: str,
    port: int,
    registry: CollectorRegistry = REGISTRY,
    *,
    ready: Callable[[], bool] | None = None,
) -> tuple[web.AppRunner, int]:
    """Serve ``GET /debug/metrics`` (Prometheus text) on host:port (0: a free port), and with
    ``ready``, ``GET /debug/ready``: 200 while it returns True, else 503 (the process is
    starting or stopping). Returns the runner (``await runner.cleanup()`` stops it) and the
    bound port."""

    async def metrics(_request: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def readiness(_request: web.Request) -> web.Response:
        if ready is not None and ready():
            return web.Response(text="ready\n")
        return web.Response(status=503, text="not ready: the consumer is starting or stopping\n")

    app = web.Application()
    app.router.add_get("/debug/metrics", metrics)
    if ready is not None:
        app.router.add_get("/debug/ready", readiness)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner, int(runner.addresses[0][1])  # The bound port (port 0 picks one).
