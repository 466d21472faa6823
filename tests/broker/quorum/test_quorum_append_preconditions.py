"""A quorum append's preconditions, as every Gazette append's (append_offset.py), through real
in-process brokers: a named offset where the append would not land, content for a read-only
journal, a fragment store holding content the quorum log did not write (found by audit,
2026-11-29: acknowledged appends landed at offset 0 and readers were served the stored bytes).
Each is refused with nothing appended."""

from __future__ import annotations

import hashlib
from pathlib import Path

import grpc
import pytest
from broker_testkit import Cluster, journal_spec
from test_quorum_append_dispatch import _leader_of, _read

from broker.fragment.naming import sum_from_digest
from broker.fragment.stores.registry import new_registry
from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set
from broker.server import Broker


async def _quorum_journal(
    cluster: Cluster, name: str, *, stores: list[str] | None = None, flags: int = 0
) -> tuple[list[Broker], Broker]:
    brokers = [await cluster.start_broker(f"zone-{i}", f"broker-{i}") for i in range(3)]
    spec = journal_spec(name, replication=3, stores=stores or [], flags=flags)
    spec.labels.CopyFrom(label_set([(gl.REPLICATION_MODE, gl.REPLICATION_MODE_QUORUM)]))
    await cluster.create(spec, brokers)
    return brokers, await _leader_of(brokers, name)


async def test_an_append_at_a_named_offset_lands_there_or_nowhere(cluster: Cluster) -> None:
    """An at-most-once writer's retry names the offset its first try expected: after that try
    landed, the retry is refused (WRONG_APPEND_OFFSET), as it is far ahead; at the head, it
    lands."""
    brokers, leader = await _quorum_journal(cluster, "pre/offset")
    first = await cluster.append(leader, "pre/offset", [b"abc"])
    assert (first.status, first.commit.begin, first.commit.end) == (pb.OK, 0, 3)
    for offset in (1, 1000):
        refused = await cluster.append(leader, "pre/offset", [b"retry"], offset=offset)
        assert refused.status == pb.WRONG_APPEND_OFFSET
    at_head = await cluster.append(leader, "pre/offset", [b"def"], offset=3)
    assert (at_head.status, at_head.commit.begin, at_head.commit.end) == (pb.OK, 3, 6)
    assert leader.quorum.nodes["pre/offset"].read_committed() == b"abcdef"
    # Through another member (proxied to the leader): the same answer.
    other = next(b for b in brokers if b is not leader)
    assert (await cluster.append(other, "pre/offset", [b"x"], offset=3)).status == (
        pb.WRONG_APPEND_OFFSET
    )


async def test_content_for_a_read_only_journal_is_not_allowed(cluster: Cluster) -> None:
    _, leader = await _quorum_journal(cluster, "pre/read-only", flags=pb.JournalSpec.O_RDONLY)
    refused = await cluster.append(leader, "pre/read-only", [b"data"])
    assert refused.status == pb.NOT_ALLOWED
    assert leader.quorum.nodes["pre/read-only"].read_committed() == b""


async def test_suspending_a_quorum_journal_is_refused(cluster: Cluster) -> None:
    _, leader = await _quorum_journal(cluster, "pre/suspend")
    for control in (pb.AppendRequest.SUSPEND_IF_FLUSHED, pb.AppendRequest.SUSPEND_NOW):
        with pytest.raises(grpc.aio.AioRpcError, match="quorum journals are not suspended") as e:
            await cluster.append(leader, "pre/suspend", [], suspend=control)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    ok = await cluster.append(leader, "pre/suspend", [b"a"], suspend=pb.AppendRequest.SUSPEND_KEEP)
    assert ok.status == pb.OK


async def test_content_in_the_store_beyond_the_log_refuses_appends(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The store holds [0, 100) of the journal, written before it was created (deleted and
    created again under the same name, or another cluster's store). Appends are refused
    INDEX_HAS_GREATER_OFFSET, and the operator's reset-head at the store's end is refused
    saying what to do; readers read the stored content, and nothing else lands."""
    (tmp_path / "frags").mkdir()
    cluster.stores = new_registry(file_root=tmp_path)
    old = b"z" * 100
    stored = pb.Fragment(
        journal="pre/store-ahead",
        begin=0,
        end=len(old),
        sum=sum_from_digest(hashlib.sha1(old).digest()),
        compression_codec=pb.NONE,
    )
    await cluster.stores.get("file:///frags/").put(stored, old)
    brokers, leader = await _quorum_journal(cluster, "pre/store-ahead", stores=["file:///frags/"])

    refused = await cluster.append(leader, "pre/store-ahead", [b"NEW"])
    assert refused.status == pb.INDEX_HAS_GREATER_OFFSET
    assert (await cluster.append(leader, "pre/store-ahead", [b"NEW"], offset=3)).status == (
        pb.WRONG_APPEND_OFFSET
    )
    with pytest.raises(grpc.aio.AioRpcError, match="cannot continue after it yet") as e:
        await cluster.append(leader, "pre/store-ahead", [], offset=100)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    node = leader.quorum.nodes["pre/store-ahead"]
    assert node.member.log.head_end == 0  # Nothing appended.
    for broker in brokers:
        assert await _read(cluster, broker, "pre/store-ahead") == old
