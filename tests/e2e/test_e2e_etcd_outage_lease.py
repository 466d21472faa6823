"""An etcd outage longer than the brokers' lease TTL, on brokers with scratch spools (no
`--data-dir`, `gazette serve`'s default): every broker's lease expires at about the same time,
and every broker exits. docs/reliability.md promises that nothing acknowledged is lost then:
each broker persists the fragments it holds as it fails (as Gazette's brokers do: their
replicas stop and the persister finishes on any exit), since its spools are gone with the
process. Once etcd and the brokers are back, the journal reads back everything acknowledged,
and nothing is written over it (an offset is never written twice)."""

from __future__ import annotations

import asyncio

import pytest
from e2e_workload import journal_spec, read_journal, requires_etcd
from google.protobuf.duration_pb2 import Duration

from broker.client.appender import append
from broker.fragment.naming import parse_content_name
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import IndexHasGreaterOffsetError
from broker.testing.process_cluster import ProcessCluster

pytestmark = [pytest.mark.etcd, requires_etcd]

J = "outage/lease"
LEASE_TTL_S = 3
# The lease's expiry (the TTL after etcd went away), then the persisting of a few small
# fragments: seconds, with room for loaded cores.
EXIT_BOUND_S = 60.0


def persisted_through(cluster: ProcessCluster) -> int:
    """The offset through which persisted fragments of J cover the journal from 0."""
    ranges = sorted(
        parse_content_name(p.name)[:2]
        for p in (cluster.fragments_dir / J).glob("*")
        if p.is_file() and p.name[0] != "."
    )
    through = 0
    for begin, end in ranges:
        if begin > through:
            break
        through = max(through, end)
    return through


async def test_brokers_that_lose_their_leases_to_an_etcd_outage_persist_what_they_acknowledged() -> (
    None
):
    brokers = [("zone-a", "broker-a"), ("zone-b", "broker-b")]
    async with ProcessCluster(brokers, lease_ttl_s=LEASE_TTL_S, durable_spools=False) as cluster:
        spec = journal_spec(J, 2, cluster.store_url, length=1 << 30, codec=pb.NONE)
        # Nothing is persisted on its own during the test: no flush interval, a large length.
        spec.fragment.flush_interval.CopyFrom(Duration(seconds=0))
        await cluster.apply([spec])
        await cluster.wait_until(cluster.journals_ready([J], 2))
        c = cluster.client()
        acknowledged = b""
        for i in range(20):
            record = f"record {i:04d}\n".encode()
            resp = await append(c, pb.AppendRequest(journal=J), record)
            assert resp.commit.begin == len(acknowledged)
            acknowledged += record
        # The precondition: its end lives only in the brokers' spools.
        assert persisted_through(cluster) < len(acknowledged)

        await cluster.etcd.stop()
        async with asyncio.timeout(EXIT_BOUND_S):
            for b in cluster.brokers:
                assert b.process is not None
                code = await b.process.wait()
                assert code != 0, f"{b.suffix} exited {code}: it should fail, its lease lost"

        # What each broker persisted as it failed covers everything acknowledged.
        assert persisted_through(cluster) == len(acknowledged), "acknowledged appends are lost"

        await cluster.etcd.start()
        for b in cluster.brokers:
            await cluster.start_broker(b)
        await cluster.wait_until(cluster.journals_ready([J], 2))
        c = cluster.client()
        assert await read_journal(c, J) == acknowledged
        # The new spools start empty, below the persisted fragments: as in Gazette, a plain
        # append is refused rather than written over them, until the journal's end is
        # confirmed (gazctl journals reset-head: an append at the index's end offset).
        with pytest.raises(IndexHasGreaterOffsetError):
            await append(c, pb.AppendRequest(journal=J), b"after the outage\n")
        at_end = pb.AppendRequest(journal=J, offset=len(acknowledged))
        resp = await append(c, at_end, b"after the outage\n")
        assert resp.status == pb.OK and resp.commit.begin == len(acknowledged)
        assert await read_journal(c, J) == acknowledged + b"after the outage\n"
