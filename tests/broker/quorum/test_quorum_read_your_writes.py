"""Read-your-writes through any member of a quorum journal, through real in-process brokers
(docs/design/quorum.md, "Reads"): an append acknowledged OK is seen, at once, by a non-blocking
Read served by any member, leader or follower, and the write head that Read reports is at least
the append's end.

Before the read barrier (quorum_shell/read_barrier.py) a follower learned the new commit offset
only on the leader's next message, and meanwhile served the journal as committed before it:
the read right after the append found OFFSET_NOT_YET_AVAILABLE and an older write head.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from broker_testkit import Cluster, journal_spec

from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set
from broker.quorum_shell import read_barrier
from broker.server import Broker

wait_s = 15.0
# Appends, each followed at once by a read through every member: enough that a follower
# learning the commit a heartbeat later is caught every time, not by luck.
appends = 200
# The read barrier's bound in the test that waits it out (the broker's is longer).
short_wait_s = 0.5


async def _leader(brokers: list[Broker], journal: str) -> Broker:
    """The broker whose node leads `journal` (waits on the nodes' progress events)."""
    async with asyncio.timeout(wait_s):
        while True:
            nodes = [b.quorum.nodes.get(journal) for b in brokers]
            for broker, node in zip(brokers, nodes, strict=True):
                if node is not None and node.is_leader and node.coordinator.leader:
                    return broker
            live = [n.progress for n in nodes if n is not None]
            for event in live:
                event.clear()
            waits = [asyncio.ensure_future(e.wait()) for e in live]
            try:
                await asyncio.wait(waits, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()


async def _read_now(
    cluster: Cluster, broker: Broker, journal: str, offset: int
) -> tuple[bytes, int, list[str]]:
    """A non-blocking Read served by `broker` from `offset`: the content, the highest write
    head its responses reported, and the statuses it answered."""
    content, head, statuses = bytearray(), -1, []
    call = cluster.stub(broker).Read(pb.ReadRequest(journal=journal, offset=offset, block=False))
    async for resp in call:
        if not resp.content:
            statuses.append(pb.Status.Name(resp.status))
            head = max(head, resp.write_head)
        content += resp.content
    return bytes(content), head, statuses


async def _quorum_journal(cluster: Cluster, name: str, route: list[Broker]) -> str:
    spec = journal_spec(name, replication=3)
    spec.labels.CopyFrom(label_set([(gl.REPLICATION_MODE, gl.REPLICATION_MODE_QUORUM)]))
    await cluster.create(spec, route)
    return spec.name


@pytest.mark.timeout(120)
async def test_an_acknowledged_append_is_read_at_once_through_every_member(
    cluster: Cluster,
) -> None:
    brokers = [await cluster.start_broker(f"zone-{i}", f"broker-{i}") for i in range(3)]
    journal = await _quorum_journal(cluster, "ryw/every-member", brokers)
    leader = await _leader(brokers, journal)
    followers = [b for b in brokers if b is not leader]
    for i in range(appends):
        data = f"append {i};".encode()
        resp = await cluster.append(leader, journal, [data])
        assert resp.status == pb.OK, pb.Status.Name(resp.status)
        for broker in (*followers, leader):
            content, head, statuses = await _read_now(cluster, broker, journal, resp.commit.begin)
            where = f"append {i} [{resp.commit.begin}, {resp.commit.end}) read via {broker.config.suffix}"
            assert content == data, f"{where}: {content!r} ({statuses})"
            assert head >= resp.commit.end, f"{where}: write head {head}"


@pytest.mark.timeout(120)
async def test_the_write_head_reported_at_once_covers_the_append(cluster: Cluster) -> None:
    """What a Spark batch read or `gazctl` plans its end from: a metadata-only read of the
    write head (offset -1), through a follower right after the append."""
    brokers = [await cluster.start_broker(f"zone-{i}", f"broker-{i}") for i in range(3)]
    journal = await _quorum_journal(cluster, "ryw/write-head", brokers)
    leader = await _leader(brokers, journal)
    followers = [b for b in brokers if b is not leader]
    for i in range(appends // 2):
        resp = await cluster.append(leader, journal, [f"head {i};".encode()])
        assert resp.status == pb.OK, pb.Status.Name(resp.status)
        follower = followers[i % 2]
        request = pb.ReadRequest(journal=journal, offset=-1, block=False, metadata_only=True)
        heads = [r.write_head async for r in cluster.stub(follower).Read(request)]
        assert heads and max(heads) >= resp.commit.end, (i, heads, resp.commit.end)


@pytest.mark.timeout(60)
async def test_a_member_that_cannot_learn_the_read_index_answers_unavailable(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Never the stale content it holds: UNAVAILABLE (clients retry it), naming why, within
    the bound; a blocking read is not refused."""
    brokers = [await cluster.start_broker(f"zone-{i}", f"broker-{i}") for i in range(3)]
    journal = await _quorum_journal(cluster, "ryw/unavailable", brokers)
    leader = await _leader(brokers, journal)
    resp = await cluster.append(leader, journal, [b"acknowledged;"])
    assert resp.status == pb.OK, pb.Status.Name(resp.status)
    survivor = next(b for b in brokers if b is not leader)
    # Read through it while it can: it has then applied the append (the barrier waited).
    assert (await _read_now(cluster, survivor, journal, 0))[0] == b"acknowledged;"
    for broker in [b for b in brokers if b is not survivor]:
        await cluster.stop_broker(broker)  # the leader among them: no majority is left
    monkeypatch.setattr(read_barrier, "read_index_wait_s", short_wait_s)
    started = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await _read_now(cluster, survivor, journal, 0)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "ryw/unavailable" in (refused.value.details() or ""), refused.value.details()
    assert time.monotonic() - started < short_wait_s + 5.0
    # A blocking read of what the member applied still streams it (no barrier).
    request = pb.ReadRequest(journal=journal, offset=0, end_offset=resp.commit.end, block=True)
    content = bytearray()
    async with asyncio.timeout(wait_s):
        async for r in cluster.stub(survivor).Read(request):
            content += r.content
    assert bytes(content) == b"acknowledged;"
