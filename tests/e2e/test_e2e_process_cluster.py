"""The process-cluster harness itself: bad broker identities are refused before anything starts,
a broker that cannot start is reported with its log and leaves nothing running, and a
restarted broker rejoins under its identity on a new endpoint."""

from __future__ import annotations

import pytest
from e2e_workload import requires_etcd

from broker.protocol.validate import ValidationError
from broker.testing.process_cluster import ProcessCluster, ProcessClusterError
from broker.topology import lookup_member


def test_bad_broker_identities_are_refused() -> None:
    with pytest.raises(ValidationError, match=r"brokers\[1\].*suffix"):
        ProcessCluster([("zone-a", "broker-a"), ("zone-a", "b")])
    with pytest.raises(ValueError, match="unique"):
        ProcessCluster([("zone-a", "broker-a"), ("zone-b", "broker-a")])


@pytest.mark.etcd
@requires_etcd
async def test_a_broker_that_cannot_start_is_reported_with_its_log() -> None:
    cluster = ProcessCluster([("zone-a", "broker-a")], extra_args=["--lease-ttl", "0"])
    with pytest.raises(ProcessClusterError, match=r"(?s)broker-a did not start.*--lease-ttl"):
        async with cluster:
            pass
    assert cluster.running() == []
    assert not cluster.dir.exists()


@pytest.mark.etcd
@requires_etcd
async def test_a_restarted_broker_rejoins_on_a_new_endpoint() -> None:
    async with ProcessCluster([("zone-a", "broker-a"), ("zone-b", "broker-b")]) as cluster:
        b = cluster.broker("broker-b")
        first = b.endpoint
        await cluster.restart(b)
        assert b.running and b.starts == 2 and b.endpoint != first

        def announced() -> str | None:
            member = lookup_member(cluster.ks, cluster.root, b.zone, b.suffix)
            endpoint = member.spec.process_spec.endpoint if member else None
            return None if endpoint == b.endpoint else f"member endpoint {endpoint}"

        await cluster.wait_until(announced)
        code, _ = await cluster.terminate(b)
        assert code == 0 and not b.running
        with pytest.raises(ProcessClusterError, match="not running"):
            await cluster.terminate(b)
