"""Appends by replication mode, through real in-process brokers: a journal without the label
or labelled all-replicas takes Gazette's path unchanged; a quorum journal is never served by
the all-replicas pipeline (refused, naming the label, nothing written) until the quorum shell
serves it."""

from __future__ import annotations

import grpc
import pytest
from broker_testkit import Cluster, journal_spec, local_content

from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set


@pytest.mark.parametrize("mode", [None, gl.REPLICATION_MODE_ALL_REPLICAS])
async def test_all_replicas_journals_append_and_replicate(
    cluster: Cluster, mode: str | None
) -> None:
    brokers = [await cluster.start_broker(f"zone-{i}", f"broker-{i}") for i in range(3)]
    spec = journal_spec("mode/journal", replication=3)
    if mode is not None:
        spec.labels.CopyFrom(label_set([(gl.REPLICATION_MODE, mode)]))
    await cluster.create(spec, brokers)
    first = await cluster.append(brokers[1], spec.name, [b"hello, ", b"world"])
    second = await cluster.append(brokers[0], spec.name, [b"!"])
    assert first.status == second.status == pb.OK
    assert (first.commit.begin, first.commit.end, second.commit.end) == (0, 12, 13)
    for broker in brokers:
        assert local_content(broker, spec.name) == (0, b"hello, world!")


async def test_quorum_journal_appends_are_refused_naming_the_label(cluster: Cluster) -> None:
    brokers = [await cluster.start_broker(f"zone-{i}", f"broker-{i}") for i in range(3)]
    spec = journal_spec("mode/quorum", replication=3)
    spec.labels.CopyFrom(label_set([(gl.REPLICATION_MODE, gl.REPLICATION_MODE_QUORUM)]))
    await cluster.create(spec, brokers)
    for broker in brokers:  # The primary, and brokers that would proxy to it.
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await cluster.append(broker, spec.name, [b"must not be written"])
        assert info.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "gazette.dev/replication-mode=quorum" in (info.value.details() or "")
    for broker in brokers:
        assert local_content(broker, spec.name) == (0, b"")
