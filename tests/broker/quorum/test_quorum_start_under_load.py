"""A broker restarted with several quorum journals whose member logs are a few MB each keeps
its lease while their nodes start: the logs are replayed off the event loop, so the loop's
longest stall during the start stays far below the lease TTL (docs/reliability.md, "Brokers
lose their 3-s lease while starting under heavy load").

Before the fix, every member log was replayed inside the KeySpace observer, one after the
other, on the event loop: the loop stalled for the sum of the replays (seconds at a few MB
each, more under load), the lease refresh was not sent, and the broker exited."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

from broker_testkit import Cluster, journal_spec, wait_until

from broker.keyspace.backend import OpPut
from broker.protocol import labels as gl
from broker.protocol.labels import label_set
from broker.quorum.entry import Entry
from broker.quorum_shell.log_file import QuorumLogFile, log_path
from broker.server import Broker
from broker.topology import DEFAULT_ROOT, assignment_key

JOURNALS = [f"start/load-{i}" for i in range(6)]
# Each member log grows to about this many bytes of small entries (the soak saw 1-5 MB).
LOG_BYTES = 3 << 20
ENTRY_BYTES = 128
LEASE_TTL_S = 2
SUFFIX = "broker-0"
# The event loop's longest stall while the broker starts must stay below this: half the lease
# TTL, so that a refresh (due every TTL/3) still reaches etcd in time. Replaying the logs on the
# loop stalled it 1.6 s on an idle machine; off the loop ~0.15 s idle and up to 0.8 s on a
# machine busy with other processes (the probe counts time the process is not scheduled).
loop_stall_max_s = LEASE_TTL_S / 2
# How often the probe wakes up to measure the loop's lag.
probe_interval_s = 0.005
wait_s = 30.0


class LoopLagProbe:
    """The longest the event loop took beyond `probe_interval_s` to wake a sleeping task."""

    def __init__(self) -> None:
        self.longest_s = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(probe_interval_s)
            self.longest_s = max(self.longest_s, time.monotonic() - before - probe_interval_s)

    def __enter__(self) -> LoopLagProbe:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()


def _all_lead(broker: Broker) -> bool:
    nodes = broker.quorum.nodes
    return all(j in nodes and nodes[j].is_leader for j in JOURNALS)


async def _until_all_lead(broker: Broker) -> None:
    """Until every journal's node leads (or the broker stopped: its lease lost); fails naming
    the state."""
    task = broker._task
    assert task is not None
    with contextlib.suppress(TimeoutError):
        await wait_until(lambda: _all_lead(broker) or task.done(), wait_s)
    failed = task.exception() if task.done() else None
    assert _all_lead(broker) and failed is None, (
        f"nodes {sorted(broker.quorum.nodes)}, errors {broker.quorum.errors}, broker failed:"
        f" {failed!r}"
    )


def _inflate(data_dir: Path, journal: str) -> int:
    """Append entries of the log's term until the member log holds about LOG_BYTES (as a
    member that acknowledged them and stopped); the file's size."""
    log_file = QuorumLogFile(log_path(data_dir, journal))
    try:
        log = log_file.log
        term, data = log.term, b"x" * ENTRY_BYTES
        while log_file.size + len(log.changes or ()) * ENTRY_BYTES < LOG_BYTES:
            index, end = log.head_index, log.head_end
            log.append(Entry(term, index + 1, end, end + ENTRY_BYTES, data))
        log.sync()
        log_file.persist()
        return log_file.size
    finally:
        log_file.close()


async def _assign_all(cluster: Cluster, broker: Broker) -> None:
    """Assign every journal to `broker` in one transaction, as the allocator assigns a restarted
    broker its replicas: one KeySpace update brings them all."""
    puts = [
        OpPut(assignment_key(DEFAULT_ROOT, j, "zone-a", SUFFIX, 0).encode(), b"", broker.lease_id)
        for j in JOURNALS
    ]
    resp = await cluster.admin.txn([], puts, [])
    await cluster.sync(resp.header.revision)


async def test_a_broker_restarted_with_large_member_logs_keeps_its_lease(
    cluster: Cluster, tmp_path: Path
) -> None:
    data_dir = tmp_path / "b0"

    async def start() -> Broker:
        return await cluster.start_broker(
            "zone-a", SUFFIX, data_dir=str(data_dir), lease_ttl_s=LEASE_TTL_S
        )

    broker = await start()
    for journal in JOURNALS:
        spec = journal_spec(journal, replication=1)
        spec.labels.CopyFrom(label_set([(gl.REPLICATION_MODE, gl.REPLICATION_MODE_QUORUM)]))
        await cluster.create(spec, [broker])
    await _until_all_lead(broker)
    await cluster.stop_broker(broker)
    sizes = [_inflate(data_dir, journal) for journal in JOURNALS]
    assert all(size >= LOG_BYTES for size in sizes), sizes

    with LoopLagProbe() as probe:
        broker = await start()
        await _assign_all(cluster, broker)
        await _until_all_lead(broker)
    # Every node replayed its log and leads; the broker still holds its lease.
    assert await cluster.admin.lease_keepalive_once(broker.lease_id) > 0
    assert probe.longest_s < loop_stall_max_s, (
        f"the event loop stalled {probe.longest_s:.2f} s while the broker started"
        f" (bound {loop_stall_max_s} s; lease TTL {LEASE_TTL_S} s)"
    )
