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

A shard's series live as long as something in the process uses them: each `ShardSeriesUse`
(a `ShardMetrics` is one) counts, and closing the shard's last one drops its series
(`forget_shard`), so that a process that runs shard after shard does not grow with them. The
transaction loop uses them while it runs; a replica (``LocalShard``) from its start until it is
stopped, so that its counters survive the attempts it retries, and a replica that failed for
good still exports its read-through (its lag keeps showing) until it is stopped. A use closed
while another is open (a second runner of the same shard ID, a replica started again before
the old one stopped) drops nothing: the other goes on recording into the same series.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Final, Self

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

__all__ = ["ShardMetrics", "ShardSeriesUse", "forget_shard", "serve_metrics"]

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
    process restart). Closing a shard's last `ShardSeriesUse` calls it; called while one is
    open, that use would go on recording into series no longer exported."""
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


# Open ShardSeriesUses per shard ID (absent: none). Only the event loop opens and closes them;
# the lock costs nothing at a shard's start and stop, and keeps a count and the series it
# guards changing together should another thread ever do so (see ShardSeriesUse.close).
_uses: dict[str, int] = {}
_uses_lock = threading.Lock()


class ShardSeriesUse:
    """One use of `shard`'s series in this process, from its creation until `close()` (or the
    end of a ``with`` block); closing the shard's last open use drops its series
    (`forget_shard`). A plain use records nothing and creates no series: a replica holds one
    so that its series outlive the transaction loops of its attempts (see the module
    docstring). Closing twice is closing once."""

    def __init__(self, shard: str) -> None:
        self.shard = shard
        with _uses_lock:
            _uses[shard] = _uses.get(shard, 0) + 1
        self._open = True

    def close(self) -> None:
        with _uses_lock:
            if not self._open:
                return
            self._open = False
            left = _uses[self.shard] - 1
            if left:
                _uses[self.shard] = left
                return
            del _uses[self.shard]
            # Under the lock: a use opened meanwhile must find the series either still there
            # or already gone, never lose the children it just looked up.
            forget_shard(self.shard)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class ShardMetrics(ShardSeriesUse):
    """The metrics of one shard, recorded by its transaction loop (on the event loop): a use
    of its series (`ShardSeriesUse`), to be closed when the loop ends and not recorded into
    after (`progressed` would create series that nothing drops)."""

    def __init__(self, shard: str) -> None:
        # Counted before the children are looked up: a last use closing meanwhile then drops
        # the series before these look them up again, never after (which would leave this one
        # recording into children no longer exported).
        super().__init__(shard)
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
