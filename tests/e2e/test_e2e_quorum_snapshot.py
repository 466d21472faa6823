"""Snapshot catch-up on real broker processes over real etcd (docs/design/quorum.md,
Remaining 4): a quorum journal whose leader's entry log is small (`--quorum-log-bytes-max`),
so that it compacts what the file:// store holds; a follower killed (-9) while appends move
the leader's log base past the follower's head; restarted, it is sent a `Snapshot` (the
leader's `gazette_quorum_snapshots_sent_total`), its spool rolls forward to the base (what is
before it is read from the store) and it serves every acknowledged byte itself (not proxied).
Then it is the one member holding the newest entries: the other follower and the leader are
killed in turn, the other follower comes back, and the caught-up member leads and serves
everything."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import grpc
import pytest
from e2e_workload import requires_etcd
from prometheus_client.parser import text_string_to_metric_families
from quorum_e2e_kit import LEASE_TTL_S, Journal, quorum_cluster, read_all, read_until

from broker.client.appender import append
from broker.client.route_cache import ChannelPool
from broker.protocol import protocol_pb2 as pb
from broker.testing.process_cluster import BrokerProcess, ProcessCluster

pytestmark = [pytest.mark.etcd, requires_etcd]

JOURNAL = "quorum/snapshot"
# The leader refuses appends past 64 KiB not in the store and compacts at 32 KiB.
LOG_BYTES_MAX = 64 << 10
# Fragments roll (and are persisted) every 8 KiB, so the store keeps up with the appends.
FRAGMENT_BYTES = 8 << 10
CHUNK_BYTES = 4 << 10
# Appended while the follower is down: four logs' worth, so the leader's base moves past it
# (the leader can take them only by compacting).
BEHIND_BYTES = 4 * LOG_BYTES_MAX
# A full log is refused RESOURCE_EXHAUSTED until the store catches up: the client tries
# again, doubling its wait up to a cap, a bounded number of times.
full_retries_max = 60
full_backoff_initial_s = 0.05
full_backoff_max_s = 0.5


@pytest.fixture
async def cluster() -> AsyncIterator[ProcessCluster]:
    async with quorum_cluster(
        JOURNAL,
        extra_args=["--quorum-log-bytes-max", str(LOG_BYTES_MAX)],
        http_gateway=True,
        fragment_length=FRAGMENT_BYTES,
    ) as c:
        yield c


async def _append_chunks(journal: Journal, tag: str, total_bytes: int) -> None:
    """Append `total_bytes` in chunks through the leader, each acknowledged exactly at the end
    of everything acknowledged before it."""
    assert journal.leader is not None
    client = journal.cluster.client(journal.leader)
    request = pb.AppendRequest(journal=journal.name)
    for i in range(total_bytes // CHUNK_BYTES):
        head = f"{tag}-{i:04d}:".encode()
        data = head + b"z" * (CHUNK_BYTES - len(head) - 1) + b"\n"
        delay = full_backoff_initial_s
        for _ in range(full_retries_max):
            try:
                resp = await append(client, request, data, attempts_max=1)
                break
            except grpc.aio.AioRpcError as err:
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
                await asyncio.sleep(delay)  # a client's backoff, not a synchronisation
                delay = min(delay * 2, full_backoff_max_s)
        else:
            raise AssertionError(
                f"{tag}-{i}: refused {full_retries_max} times (log never compacted)"
            )
        assert resp.status == pb.OK, pb.Status.Name(resp.status)
        assert (resp.commit.begin, resp.commit.end) == (
            len(journal.expected),
            len(journal.expected) + len(data),
        ), (tag, i)
        journal.expected += data


async def _metric(b: BrokerProcess, name: str) -> float:
    """Sample `name` of `b`'s member of the journal, from its /debug/metrics."""
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{b.http_endpoint}/debug/metrics") as resp:
            assert resp.status == 200
            text = await resp.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.name == name
                and sample.labels["journal"] == JOURNAL
                and sample.labels["member"] == f"{b.zone}#{b.suffix}"
            ):
                return sample.value
    raise AssertionError(f"{b.suffix}: no {name} for {JOURNAL}")


async def _served_by_itself(b: BrokerProcess, journal: Journal) -> bytes:
    channels = ChannelPool()
    try:
        return await read_until(channels, b, journal.name, len(journal.expected), by_itself=True)
    finally:
        await channels.close()


async def test_a_follower_behind_the_log_base_catches_up_by_snapshot(
    cluster: ProcessCluster,
) -> None:
    journal = Journal(cluster, JOURNAL)
    await journal.append_round("before")
    leader = journal.leader
    assert leader is not None
    behind, other = journal.others(leader)

    await cluster.kill(behind)
    head_when_killed = len(journal.expected)
    await _append_chunks(journal, "behind", BEHIND_BYTES)
    # The leader holds at most LOG_BYTES_MAX of entries: its base is past the killed head.
    assert len(journal.expected) - LOG_BYTES_MAX > head_when_killed
    # (It sends the killed member Snapshots already: they are lost with its process.)
    assert await _metric(leader, "gazette_quorum_log_base_offset") > head_when_killed

    # Its lease expired (the journal's route dropped it): it comes back as a new process
    # would after a crash, and the allocator assigns it again.
    await cluster.wait_until(cluster.member_gone(behind), timeout_s=4 * LEASE_TTL_S)
    await cluster.start_broker(behind)
    await cluster.wait_until(cluster.journals_ready([JOURNAL], 3, zones_min=2))
    # A round the store does not hold yet (its fragment is open): only a member whose log
    # holds its entries serves it, and the restarted one's log stopped below the leader's
    # base, so it serves it only once a Snapshot aligned it and Replicate followed.
    await journal.append_round("after-restart")
    # It serves every acknowledged byte itself: what its spool lacks from the store, the
    # newest round from its spool.
    assert await _served_by_itself(behind, journal) == bytes(journal.expected)
    assert await _metric(leader, "gazette_quorum_snapshots_sent_total") >= 1
    assert await _metric(behind, "gazette_quorum_snapshots_installed_total") >= 1
    assert await _metric(behind, "gazette_quorum_log_base_offset") > head_when_killed

    # It acknowledges new entries: with the other follower down, the leader commits with it.
    await cluster.kill(other)
    await journal.append_round("with-caught-up")
    # The leader goes too; the other follower comes back lacking that round, so only the
    # caught-up member's log can lead, and it serves everything.
    await cluster.kill(leader)
    await cluster.start_broker(other)
    journal.leader = None
    await journal.append_round("after")
    assert journal.leader is behind, journal.leader
    assert await _served_by_itself(behind, journal) == bytes(journal.expected)
    channels = ChannelPool()
    try:
        assert await read_all(channels, other, JOURNAL, len(journal.expected)) == bytes(
            journal.expected
        )
    finally:
        await channels.close()
