"""Registers on a quorum journal, on real broker processes over real etcd (issue #16): a
Gazette client's check / union / subtract work as on an all-replicas journal, and after the
leader is killed (kill -9) the new leader's registers are those of the committed log: the
fence an acknowledged append set holds, and a check against it passes.

Unlike an all-replicas journal (whose registers live in the replicas' spools and reset if
every replica is lost), a quorum journal's registers are in its members' entry logs."""

from __future__ import annotations

import pytest
from e2e_workload import journal_spec, requires_etcd

from broker.client.appender import Appender, append
from broker.client.route_cache import JournalClient
from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set
from broker.protocol.status import RegisterMismatchError
from broker.testing.process_cluster import ProcessCluster

pytestmark = [pytest.mark.etcd, requires_etcd]

JOURNAL = "quorum/registers"
LEASE_TTL_S = 3
THREE_BROKERS = [("zone-a", "broker-a1"), ("zone-a", "broker-a2"), ("zone-b", "broker-b1")]
OWNER_A = label_set([("owner", "a")])
OWNER_B = label_set([("owner", "b")])


async def mismatched(client: JournalClient, request: pb.AppendRequest) -> pb.LabelSet:
    """Append expecting REGISTER_MISMATCH (which the client raises): the registers answered."""
    appender = Appender(client, request)
    with pytest.raises(RegisterMismatchError):
        async with appender:
            await appender.write(b"not appended\n")
    assert appender.response is not None
    return appender.response.registers


async def test_registers_survive_the_leader_being_killed() -> None:
    async with ProcessCluster(THREE_BROKERS, lease_ttl_s=LEASE_TTL_S) as cluster:
        spec = journal_spec(JOURNAL, 3, cluster.store_url)
        spec.labels.CopyFrom(label_set([(gl.REPLICATION_MODE, gl.REPLICATION_MODE_QUORUM)]))
        await cluster.apply([spec])
        await cluster.wait_until(cluster.journals_ready([JOURNAL], 3, zones_min=2))

        fence = pb.AppendRequest(journal=JOURNAL, union_registers=OWNER_A)
        first = await append(cluster.client(), fence, b"owner a\n", attempts_max=50)
        assert first.status == pb.OK and first.registers == OWNER_A
        route = first.header.route
        leader = cluster.broker(route.members[route.primary].suffix)
        client = cluster.client(leader)
        # A check that fails: REGISTER_MISMATCH with the registers, nothing appended.
        stale = pb.AppendRequest(journal=JOURNAL, check_registers=pb.LabelSelector(include=OWNER_B))
        assert await mismatched(client, stale) == OWNER_A
        acknowledged_end = first.commit.end

        await cluster.kill(leader)  # kill -9: no hand-off
        survivor = cluster.broker(
            next(m.suffix for m in route.members if m.suffix != leader.suffix)
        )
        # The new leader checks against the committed registers: owner=a holds, and is
        # swapped for owner=b.
        swap = pb.AppendRequest(
            journal=JOURNAL,
            check_registers=pb.LabelSelector(include=OWNER_A),
            subtract_registers=OWNER_A,
            union_registers=OWNER_B,
        )
        after = cluster.client(survivor)  # one client: its route cache learns the new leader
        swapped = await append(after, swap, b"owner b\n", attempts_max=60)
        assert swapped.status == pb.OK, pb.Status.Name(swapped.status)
        new_route = swapped.header.route
        assert new_route.members[new_route.primary].suffix != leader.suffix
        assert swapped.commit.begin == acknowledged_end and swapped.registers == OWNER_B
        again = await append(after, stale, b"x\n", attempts_max=10)
        assert again.status == pb.OK and again.registers == OWNER_B  # owner=b now matches
        old_owner = pb.AppendRequest(
            journal=JOURNAL, check_registers=pb.LabelSelector(include=OWNER_A)
        )
        assert await mismatched(after, old_owner) == OWNER_B
