"""Content chunks through real brokers at R=1 and R=3, on each path the receive-side fast path takes:
a first chunk forwarded to peers as the bytes it arrived in, later chunks re-encoded with their
delta, chunks small and large (the primary spools large ones on a worker thread), appends
proxied by a replica, and an aborted append. Every replica ends with the same bytes, and each
commit carries the SHA1 of exactly its append."""

from __future__ import annotations

import hashlib

import pytest
from broker_testkit import Cluster, journal_spec, local_content

from broker.fragment.naming import sum_from_digest
from broker.pipeline import local_offload_bytes_min
from broker.protocol import protocol_pb2 as pb

J = "wire/journal"
BIG = local_offload_bytes_min + 17


def pattern(seed: int, size: int) -> bytes:
    return (bytes(range(seed, 256)) + bytes(range(seed))) * (size // 256) + bytes(size % 256)


@pytest.mark.parametrize("replication", [1, 3])
async def test_chunks_reach_every_replica_byte_for_byte(cluster: Cluster, replication: int) -> None:
    # R=1: the primary spools in place; R=3: on a worker thread while it sends to its peers.
    brokers = [await cluster.start_broker(f"zone-{i}", f"broker-{i}") for i in range(3)]
    members = brokers[:replication]
    await cluster.create(journal_spec(J, replication=replication, length=64 << 20), members)
    appends = [
        [pattern(1, 10)],  # One small chunk: forwarded as received.
        [pattern(2, BIG)],  # One large chunk: forwarded, spooled on a worker.
        [pattern(3, 5), pattern(4, BIG), pattern(5, 7)],  # Later chunks carry a delta.
        [pattern(6, BIG), pattern(7, BIG)],
    ]
    expected = b""
    for i, chunks in enumerate(appends):
        # Every other append enters at another broker, which proxies it to the primary.
        resp = await cluster.append(brokers[i % 2], J, chunks)
        assert resp.status == pb.OK
        content = b"".join(chunks)
        assert (resp.commit.begin, resp.commit.end) == (len(expected), len(expected) + len(content))
        assert resp.commit.sum == sum_from_digest(hashlib.sha1(content).digest())
        expected += content
    for b in members:
        assert local_content(b, J) == (0, expected)


async def test_an_aborted_append_leaves_no_chunk_behind(cluster: Cluster) -> None:
    brokers = [await cluster.start_broker(f"zone-{i}", f"broker-{i}") for i in range(3)]
    await cluster.create(journal_spec(J, replication=3, length=64 << 20), brokers)
    assert (await cluster.append(brokers[0], J, [b"kept"])).status == pb.OK
    # Content, then the end of the stream without the commit marker: rolled back everywhere.
    with pytest.raises(Exception, match="without the empty commit chunk"):
        await cluster.append(brokers[0], J, [pattern(8, BIG), b"tail"], commit=False)
    resp = await cluster.append(brokers[0], J, [b"next"])
    assert (resp.commit.begin, resp.commit.end) == (4, 8)
    for b in brokers:
        assert local_content(b, J) == (0, b"keptnext")
