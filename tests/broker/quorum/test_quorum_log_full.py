"""A quorum leader whose log is full (`log_bytes_max` of entries the fragment store does not
hold yet) refuses an append at once with RESOURCE_EXHAUSTED, which clients retry, rather than
holding the RPC until the store catches up (docs/design/quorum.md, Remaining 7)."""

from __future__ import annotations

import asyncio
import dataclasses

import grpc
import pytest
from broker_testkit import Cluster, journal_spec

from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set
from broker.quorum_shell.node import broker_quorum_config
from broker.serve_cli import _parse_args
from tests.broker.quorum.test_quorum_append_dispatch import _leader_of

LOG_BYTES_MAX = 4096
CHUNK = b"x" * 1000
# Far below the RPC's own patience: a refusal that waited for the store would miss it.
answer_s = 5.0


async def test_a_full_log_answers_resource_exhausted_at_once(cluster: Cluster) -> None:
    brokers = [await cluster.start_broker(f"zone-{i}", f"broker-{i}") for i in range(3)]
    for broker in brokers:  # the bound of the nodes started from now on
        broker.quorum.quorum_config = dataclasses.replace(
            broker_quorum_config(), log_bytes_max=LOG_BYTES_MAX
        )
    # Fragments of 1 MiB, no flush interval: the store holds nothing of these appends, so
    # the leader can compact nothing.
    spec = journal_spec("mode/full", replication=3)
    spec.labels.CopyFrom(label_set([(gl.REPLICATION_MODE, gl.REPLICATION_MODE_QUORUM)]))
    await cluster.create(spec, brokers)
    leader = await _leader_of(brokers, spec.name)

    accepted = 0
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        for _ in range(LOG_BYTES_MAX // len(CHUNK) + 1):
            async with asyncio.timeout(answer_s):
                resp = await cluster.append(leader, spec.name, [CHUNK])
            assert resp.status == pb.OK
            accepted += 1
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "log_bytes_max" in (refused.value.details() or "")
    assert accepted == LOG_BYTES_MAX // len(CHUNK)  # every append that fits was committed
    node = leader.quorum.nodes[spec.name]
    assert node.commit_offset == accepted * len(CHUNK)  # the refused one wrote nothing


@pytest.mark.parametrize("value", ["0", "-1", "1.5", "x"])
def test_serve_refuses_a_bad_quorum_log_bound(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        _parse_args(["serve", "--quorum-log-bytes-max", value])
    assert "argument --quorum-log-bytes-max:" in capsys.readouterr().err


def test_serve_passes_the_quorum_log_bound() -> None:
    assert _parse_args(["serve", "--quorum-log-bytes-max", "65536"]).quorum_log_bytes_max == 65536
    assert _parse_args(["serve"]).quorum_log_bytes_max is None  # the core's default
