"""A quorum journal's members killed (-9) and restarted on their data directories, on real
broker processes over real etcd (issue #16's "restart members in any order"): every member's
log file is replayed, so no acknowledged append is lost, no offset is written twice, every
member serves exactly the acknowledged content, and a new leader serves appends within the
lease TTL + 3 s once the route is whole again.

Nodes start only with a whole route (quorum_shell/journals.py), so "in any order" is the order
the processes come back; the protocol then re-elects from the replayed logs.

The case an in-memory log loses (test_follower_restart_then_leader_loss): a follower is down
while appends commit on the two others; one of those two restarts, then the leader is killed.
Only logs that survived the kills still hold those appends (with the in-memory log of part two
the next append lands at offset 0)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest
from e2e_workload import journal_spec, requires_etcd

from broker.client.appender import append
from broker.client.route_cache import ChannelPool
from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set
from broker.testing.process_cluster import BrokerProcess, ProcessCluster

pytestmark = [pytest.mark.etcd, requires_etcd]

JOURNAL = "quorum/restart"
LEASE_TTL_S = 3
THREE_BROKERS = [("zone-a", "broker-a1"), ("zone-a", "broker-a2"), ("zone-b", "broker-b1")]
appends_per_round = 8
# Attempts of the first append after a restart (the client backs off up to 1 s between).
attempts_after_restart_max = 200
retry_backoff_cap_s = 0.1


@pytest.fixture
async def cluster() -> AsyncIterator[ProcessCluster]:
    async with ProcessCluster(THREE_BROKERS, lease_ttl_s=LEASE_TTL_S) as c:
        spec = journal_spec(JOURNAL, 3, c.store_url)
        spec.labels.CopyFrom(label_set([(gl.REPLICATION_MODE, gl.REPLICATION_MODE_QUORUM)]))
        await c.apply([spec])
        await c.wait_until(c.journals_ready([JOURNAL], 3, zones_min=2))
        yield c


class Journal:
    """What the test acknowledged: the expected content and each append's offsets."""

    def __init__(self, cluster: ProcessCluster) -> None:
        self.cluster = cluster
        self.expected = bytearray()
        self.leader: BrokerProcess | None = None

    async def append_round(self, tag: str, *, attempts_max: int = 1) -> float:
        """Append `appends_per_round` records (the first through any broker, retried: it
        finds the leader); each acknowledged at exactly the expected end. Returns how long the
        first took."""
        loop = asyncio.get_running_loop()
        request = pb.AppendRequest(journal=JOURNAL)
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

    async def check_every_member(self) -> None:
        """Every member serves exactly the acknowledged content (nothing more: no reader can
        see content that a later truncation would remove)."""
        channels = ChannelPool()
        try:
            for b in self.cluster.brokers:
                assert await _read_all(channels, b, len(self.expected)) == bytes(self.expected), (
                    b.suffix
                )
        finally:
            await channels.close()

    def others(self, *not_these: BrokerProcess) -> list[BrokerProcess]:
        return [b for b in self.cluster.brokers if b not in not_these]


async def _read_all(channels: ChannelPool, b: BrokerProcess, end: int) -> bytes:
    """The journal as broker `b` serves it from 0 to `end`, then nothing more for a moment
    (a non-blocking read past `end` finds nothing)."""
    out = bytearray()
    stub = channels.stub(b.endpoint)
    call = stub.Read(pb.ReadRequest(journal=JOURNAL, offset=0, block=True))
    async with asyncio.timeout(15):
        async for resp in call:
            assert resp.status == pb.OK, pb.Status.Name(resp.status)
            out += resp.content
            if len(out) >= end:
                break
    call.cancel()
    beyond = stub.Read(pb.ReadRequest(journal=JOURNAL, offset=len(out), block=False))
    async for resp in beyond:
        assert resp.status == pb.OFFSET_NOT_YET_AVAILABLE or not resp.content, resp
    return bytes(out)


async def _restart_in_order(cluster: ProcessCluster, order: Sequence[BrokerProcess]) -> float:
    """Start the (killed) brokers one after the other; the time the last one served."""
    for b in order:
        await cluster.start_broker(b)
    return asyncio.get_running_loop().time()


@pytest.mark.parametrize("order", ["leader-first", "leader-last"])
async def test_all_members_killed_and_restarted(cluster: ProcessCluster, order: str) -> None:
    journal = Journal(cluster)
    await journal.append_round("before")
    leader = journal.leader
    assert leader is not None
    for b in cluster.brokers:
        await cluster.kill(b)  # kill -9, all three: logs, spools and etcd remain.
    followers = journal.others(leader)
    sequence = [leader, *followers] if order == "leader-first" else [*followers, leader]
    whole_at = await _restart_in_order(cluster, sequence)
    first_took = await journal.append_round("after")
    # A new leader serves within the lease TTL + 3 s of the route being whole again.
    assert first_took < LEASE_TTL_S + 3, (first_took, whole_at)
    await journal.check_every_member()


async def test_follower_restart_then_leader_loss(cluster: ProcessCluster) -> None:
    journal = Journal(cluster)
    await journal.append_round("all-up")
    leader = journal.leader
    assert leader is not None
    down, restarted = journal.others(leader)
    await cluster.kill(down)
    # Committed by the leader and `restarted` alone.
    await journal.append_round("two-up")
    await cluster.restart(restarted)  # kill -9 and start: it must come back with its log.
    await cluster.kill(leader)  # The leader is lost (kill -9).
    # Only `restarted` and the (stopped) leader hold the two-up appends (`down` never had
    # them); `down` and the leader come back, and any majority that elects includes one of
    # the two holders: their logs must have survived the kill. (A lost disk is not tested:
    # a member back with an empty log still counts in an election, see the design's
    # Remaining.)
    await cluster.start_broker(down)
    await cluster.start_broker(leader)
    first_took = await journal.append_round("after")
    assert first_took < LEASE_TTL_S + 3, first_took
    await journal.check_every_member()
