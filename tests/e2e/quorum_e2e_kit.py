"""What the quorum process-level tests share: a journal whose acknowledged appends are
tracked (each must land exactly at the end of everything acknowledged before it), and
whole-journal reads from one broker that must show exactly that content."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

from e2e_workload import journal_spec

from broker.client.appender import append
from broker.client.route_cache import ChannelPool
from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set
from broker.testing.process_cluster import BrokerProcess, ProcessCluster

# The brokers' lease: a killed broker's journals move after it expires.
LEASE_TTL_S = 3
THREE_BROKERS = [("zone-a", "broker-a1"), ("zone-a", "broker-a2"), ("zone-b", "broker-b1")]
appends_per_round = 8
# Attempts of the first append after a restart (the client backs off up to 1 s between).
attempts_after_restart_max = 200
retry_backoff_cap_s = 0.1


@contextlib.asynccontextmanager
async def quorum_cluster(journal: str) -> AsyncIterator[ProcessCluster]:
    """Three broker processes on etcd (two zones), and `journal` at R=3 in quorum mode, ready
    on all three."""
    async with ProcessCluster(THREE_BROKERS, lease_ttl_s=LEASE_TTL_S) as c:
        spec = journal_spec(journal, 3, c.store_url)
        spec.labels.CopyFrom(label_set([(gl.REPLICATION_MODE, gl.REPLICATION_MODE_QUORUM)]))
        await c.apply([spec])
        await c.wait_until(c.journals_ready([journal], 3, zones_min=2))
        yield c


class Journal:
    """What the test acknowledged: the expected content and each append's offsets."""

    def __init__(self, cluster: ProcessCluster, name: str) -> None:
        self.cluster = cluster
        self.name = name
        self.expected = bytearray()
        self.leader: BrokerProcess | None = None

    async def append_round(self, tag: str, *, attempts_max: int = 1) -> float:
        """Append `appends_per_round` records (the first through any broker, retried: it
        finds the leader); each acknowledged at exactly the expected end. Returns how long the
        first took."""
        loop = asyncio.get_running_loop()
        request = pb.AppendRequest(journal=self.name)
        started = loop.time()
        first_took = 0.0
        for i in range(appends_per_round):
            data = f"{tag}-{i:03d}\n".encode()
            client = self.cluster.client(self.leader) if i else self.cluster.client()
            resp = await append(
                client,
                request,
                data,
                attempts_max=attempts_after_restart_max if not i else attempts_max,
                # Retry often: the time measured is the cluster's, not the client's backoff.
                backoff_cap_s=retry_backoff_cap_s,
            )
            assert resp.status == pb.OK, pb.Status.Name(resp.status)
            # No offset written twice, nothing acknowledged lost: each append lands exactly
            # at the end of everything acknowledged before it.
            assert (resp.commit.begin, resp.commit.end) == (
                len(self.expected),
                len(self.expected) + len(data),
            ), (tag, i)
            self.expected += data
            if not i:
                first_took = loop.time() - started
                route = resp.header.route
                self.leader = self.cluster.broker(route.members[route.primary].suffix)
        return first_took

    async def check_every_member(self, brokers: Sequence[BrokerProcess] = ()) -> None:
        """Every member (of `brokers`, default all) serves exactly the acknowledged content
        (nothing more: no reader can see content that a later truncation would remove)."""
        channels = ChannelPool()
        try:
            for b in brokers or self.cluster.brokers:
                assert await read_all(channels, b, self.name, len(self.expected)) == bytes(
                    self.expected
                ), b.suffix
        finally:
            await channels.close()

    def others(self, *not_these: BrokerProcess) -> list[BrokerProcess]:
        return [b for b in self.cluster.brokers if b not in not_these]


async def read_until(
    channels: ChannelPool, b: BrokerProcess, journal: str, end: int, *, timeout_s: float = 15
) -> bytes:
    """The journal as broker `b` serves it, from 0 until `end` (a blocking read: a follower
    applies a commit a heartbeat after the leader)."""
    out = bytearray()
    call = channels.stub(b.endpoint).Read(pb.ReadRequest(journal=journal, offset=0, block=True))
    async with asyncio.timeout(timeout_s):
        async for resp in call:
            assert resp.status == pb.OK, pb.Status.Name(resp.status)
            out += resp.content
            if len(out) >= end:
                break
    call.cancel()
    return bytes(out)


async def read_all(channels: ChannelPool, b: BrokerProcess, journal: str, end: int) -> bytes:
    """The journal as broker `b` serves it from 0 to `end`, then nothing more for a moment
    (a non-blocking read past `end` finds nothing)."""
    out = await read_until(channels, b, journal, end)
    stub = channels.stub(b.endpoint)
    beyond = stub.Read(pb.ReadRequest(journal=journal, offset=len(out), block=False))
    async for resp in beyond:
        assert resp.status == pb.OFFSET_NOT_YET_AVAILABLE or not resp.content, resp
    return out
