"""SIGTERM of a primary ``gazette serve`` whose pipeline's peer is stopped (SIGSTOP), killed
(kill -9), or whose append is stuck mid-stream: it exits within a bound, and every append
acknowledged to a client is in the journal afterwards.

The soak saw a broker still running 60 s after SIGTERM, its log ending at "stopping local
journal replica". Every wait of that stop on a peer is bounded: the pipeline's teardown by
``pipeline_close_wait_s`` (tests/broker/test_pipeline_close_bound.py), a stopped peer's calls by
the peer channels' keepalive (a few seconds). These scenarios exited in 0.1-4 s before that
bound too: they guard the bound end to end, with real processes.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from google.protobuf.duration_pb2 import Duration

from broker.client.appender import append
from broker.client.retry_reader import RetryReader
from broker.client.route_cache import JournalClient
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import OffsetNotYetAvailableError
from broker.testing.process_cluster import BrokerProcess, ProcessCluster

pytestmark = [
    pytest.mark.etcd,
    pytest.mark.skipif(shutil.which("etcd") is None, reason="etcd not installed"),
]

J = "stop-bound/journal"
BROKERS = [("zone-a", "brk-one"), ("zone-b", "brk-two"), ("zone-a", "brk-three")]
# An exiting broker waits this long for the allocator to move its journal (which it cannot
# while a peer is stopped) before it stops anyway.
HANDOFF_TIMEOUT_S = 3
# From SIGTERM to exit: the hand-off's bound, the RPC drain's grace (1 s), the replica's stop
# (its pipeline's teardown at most pipeline_close_wait_s, 10 s) and persisting, with room for
# two loaded cores. A stop that waits out a peer timeout (30 s) per phase exceeds it.
STOP_BOUND_S = 25.0
# Acknowledged appends before the fault, and while it happens.
APPENDS_BEFORE = 5
# How long the test waits for the journal to be served again, and to read it.
RECOVERY_WAIT_S = 60.0


@pytest.fixture
async def cluster() -> AsyncIterator[ProcessCluster]:
    args = ["--handoff-timeout", str(HANDOFF_TIMEOUT_S)]
    async with ProcessCluster(BROKERS, extra_args=args) as c:
        spec = pb.JournalSpec(
            name=J,
            replication=3,
            fragment=pb.JournalSpec.Fragment(
                length=1 << 20,
                compression_codec=pb.NONE,
                stores=[c.store_url],
                refresh_interval=Duration(seconds=1),
            ),
        )
        await c.apply([spec])
        await c.wait_until(c.journals_ready([J], replication=3))
        yield c


@dataclass
class Writer:
    """Appends numbered records one at a time until stopped; records what was acknowledged."""

    client: JournalClient
    acked: list[tuple[int, bytes]] = field(default_factory=list)  # (offset, record)
    progress: asyncio.Event = field(default_factory=asyncio.Event)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        seq = 0
        while not self._stop.is_set():
            seq += 1
            record = b"record-%06d\n" % seq
            try:
                resp = await append(self.client, pb.AppendRequest(journal=J), record)
            except Exception:  # Not acknowledged: nothing is owed for it.
                continue
            assert resp.commit.end - resp.commit.begin == len(record)
            self.acked.append((resp.commit.begin, record))
            self.progress.set()
            self.progress = asyncio.Event()

    async def wait_for(self, count: int) -> None:
        async with asyncio.timeout(RECOVERY_WAIT_S):
            while len(self.acked) < count:
                await self.progress.wait()

    async def stop(self) -> None:
        """Stop at once: an append in flight (retrying while the journal has too few brokers
        to take appends) is abandoned, unacknowledged."""
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


async def read_journal(client: JournalClient) -> bytes:
    reader = RetryReader(client, pb.ReadRequest(journal=J, offset=0, block=False))
    out = bytearray()
    try:
        async with asyncio.timeout(RECOVERY_WAIT_S):
            while True:
                try:
                    chunk = await reader.read_chunk()
                except OffsetNotYetAvailableError:
                    break
                assert chunk.offset == len(out), f"read jumped to {chunk.offset}"
                out += chunk.content
    finally:
        await reader.close()
    return bytes(out)


async def sigterm_within_bound(c: ProcessCluster, primary: BrokerProcess) -> None:
    started = time.monotonic()
    code, elapsed_s = await c.terminate(primary, timeout_s=STOP_BOUND_S)
    assert code == 0, primary.log_tail()
    assert elapsed_s < STOP_BOUND_S
    assert time.monotonic() - started < STOP_BOUND_S


async def assert_nothing_acknowledged_lost(
    c: ProcessCluster, primary: BrokerProcess, writer: Writer
) -> None:
    """The survivors serve the journal again (for reads: appends need a third broker), and
    hold every acknowledged record at its acknowledged offset."""
    await writer.stop()
    await c.wait_until(
        c.journals_ready([J], replication=2, exclude=[primary.suffix]), RECOVERY_WAIT_S
    )
    survivor = next(b for b in c.running())
    content = await read_journal(c.client(survivor))
    for offset, record in writer.acked:
        assert content[offset : offset + len(record)] == record, (offset, record)


async def start_writing(c: ProcessCluster) -> tuple[BrokerProcess, list[BrokerProcess], Writer]:
    primary = c.primary(J)
    assert primary is not None
    peers = [b for b in c.brokers if b is not primary]
    # The writer's default broker is a peer: it finds the primary through the route.
    writer = Writer(c.client(peers[1]))
    writer.start()
    await writer.wait_for(APPENDS_BEFORE)
    return primary, peers, writer


async def test_sigterm_of_a_primary_whose_peer_is_stopped_exits_in_bound(
    cluster: ProcessCluster,
) -> None:
    primary, peers, writer = await start_writing(cluster)
    cluster.pause(peers[0])  # SIGSTOP: its sockets stay open, it answers nothing.
    await sigterm_within_bound(cluster, primary)
    # Resumed, it would find its lease expired and exit (a zombie): restart it instead.
    await cluster.restart(peers[0])
    await assert_nothing_acknowledged_lost(cluster, primary, writer)


async def test_sigterm_of_a_primary_whose_peer_was_killed_exits_in_bound(
    cluster: ProcessCluster,
) -> None:
    primary, peers, writer = await start_writing(cluster)
    await cluster.kill(peers[0])  # kill -9: its connections reset.
    await sigterm_within_bound(cluster, primary)
    await cluster.start_broker(peers[0])  # Back, with its durable spool.
    await assert_nothing_acknowledged_lost(cluster, primary, writer)


async def test_sigterm_of_a_primary_with_an_append_stuck_mid_stream_exits_in_bound(
    cluster: ProcessCluster,
) -> None:
    primary, peers, writer = await start_writing(cluster)
    # An append that sent its header and some content, then neither more nor its end: it
    # holds (or waits for) the journal's pipeline until the broker stops.
    stuck = cluster.client(primary).default_stub().Append()
    await stuck.write(pb.AppendRequest(journal=J))
    await stuck.write(pb.AppendRequest(content=b"never-committed\n"))
    cluster.pause(peers[0])
    try:
        await sigterm_within_bound(cluster, primary)
    finally:
        stuck.cancel()
    await cluster.restart(peers[0])
    await assert_nothing_acknowledged_lost(cluster, primary, writer)
    content = await read_journal(cluster.client(peers[1]))
    assert b"never-committed" not in content
