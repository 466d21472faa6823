"""etcd out of space, and an append that needs an etcd write: resuming a suspended journal
writes its spec. docs/reliability.md promises that such an append waits for room, answered
UNAVAILABLE (which clients retry, bounded), with nothing appended; once an operator makes room,
the same append resumes the journal and lands after what was acknowledged before."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest
from e2e_workload import journal_spec, read_journal, requires_etcd
from etcd_space_kit import QUOTA_ARGS, fill, make_room, requires_etcdctl

from broker.client.appender import append
from broker.keyspace.etcd import EtcdBackend
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import SuspendedError
from broker.testing.process_cluster import ProcessCluster
from broker.topology import JournalItem, lookup_item

pytestmark = [pytest.mark.etcd, requires_etcd, requires_etcdctl]

J = "nospace/suspended"
WAIT_S = 30.0


async def test_resuming_a_suspended_journal_waits_for_room_in_etcd() -> None:
    cluster = ProcessCluster([("zone-a", "broker-a")], lease_ttl_s=3, etcd_args=QUOTA_ARGS)
    async with cluster:
        await cluster.apply([journal_spec(J, 1, cluster.store_url, codec=pb.NONE)])
        await cluster.wait_until(cluster.journals_ready([J], 1))
        c = cluster.client()
        await append(c, pb.AppendRequest(journal=J), b"before\n")
        # Suspended now (PARTIAL: one replica kept, its fragment persisted promptly).
        with pytest.raises(SuspendedError):
            await append(c, pb.AppendRequest(journal=J, suspend=pb.AppendRequest.SUSPEND_NOW))
        await cluster.wait_until(_level_is(cluster, pb.JournalSpec.Suspend.PARTIAL), WAIT_S)

        admin = EtcdBackend([cluster.etcd.endpoint])
        try:
            await fill(admin)
            # A plain append resumes the journal: a write of its spec, which etcd refuses.
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await append(c, pb.AppendRequest(journal=J), b"during\n", attempts_max=3)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
            assert "out of space" in (refused.value.details() or ""), refused.value.details()
            assert _suspend_level(cluster) == pb.JournalSpec.Suspend.PARTIAL

            await make_room(cluster, admin)
        finally:
            await admin.close()
        resp = await append(c, pb.AppendRequest(journal=J), b"after\n")
        assert resp.commit.begin == len(b"before\n")
        await cluster.wait_until(_level_is(cluster, pb.JournalSpec.Suspend.NONE), WAIT_S)
        assert await read_journal(c, J) == b"before\nafter\n"


def _suspend_level(cluster: ProcessCluster) -> int:
    """The journal's suspension level in the cluster's mirror of etcd."""
    entry = lookup_item(cluster.ks, cluster.root, J)
    assert entry is not None and isinstance(entry.decoded, JournalItem), f"{J}: no spec"
    return int(entry.decoded.spec.suspend.level)


def _level_is(cluster: ProcessCluster, level: int) -> Callable[[], str | None]:
    def condition() -> str | None:
        have = _suspend_level(cluster)
        return None if have == level else f"{J}: suspend level {have}, waiting for {level}"

    return condition
