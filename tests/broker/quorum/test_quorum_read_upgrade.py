"""The read index across a rolling upgrade (docs/design/quorum.md, "Reads"): quorum nodes on
loopback gRPC, some of them serving as a broker of the version before the read index does (its
Deliver handler refuses ReadIndexAsk and ReadIndexAnswer as unknown types, INVALID_ARGUMENT,
through the real decoder: wire.decode_envelope(unknown=...)).

Before the fix, an upgraded follower of such a leader asked until read_index_wait_s (5 s) ran
out and every non-blocking read through it failed UNAVAILABLE, for as long as the upgrade
lasted."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

from broker.quorum.read_index import ReadIndexAnswer, ReadIndexAsk
from broker.quorum_shell import read_barrier
from broker.quorum_shell.node import QuorumNode
from broker.quorum_shell.transport import (
    GrpcTransport,
    Receiver,
    Sent,
    TypeRefused,
    deliver_handler,
)
from broker.quorum_shell.wire import (
    READ_INDEX_TYPES,
    Envelope,
    WireDecodeError,
    decode_envelope,
    encode_envelope,
    refused_type,
)
from tests.broker.quorum.quorum_nodes_testkit import NAMES, Cluster, J, append_all

# "Promptly": well under the read index's bound (what a read waited before the fix).
prompt_s = read_barrier.read_index_wait_s / 5


async def _caught_up(c: Cluster, node: QuorumNode, end: int) -> None:
    """Until `node` knows a leader and its own commit offset reached `end`."""

    def caught_up() -> bool:
        return node.joined.is_set() and bool(node.leader_name) and node.commit_offset >= end

    await c.until(caught_up, f"{node.name} committed through {end}")


async def test_an_upgraded_follower_of_an_older_leader_serves_reads_at_once(
    quorum_nodes: Cluster,
) -> None:
    c = quorum_nodes
    old, new = NAMES[:2], NAMES[2]
    for name in old:  # a majority of the previous version: one of them leads
        await c.start(name, unknown=READ_INDEX_TYPES)
    expected = bytearray()
    await append_all(c, "a", 3, expected)
    follower = await c.start(new)  # upgraded
    await _caught_up(c, follower, len(expected))
    leader = c.leader()
    assert leader is not None and leader.name in old

    started = time.monotonic()
    offset = await follower.reads.read_index()
    assert time.monotonic() - started < prompt_s
    # As before the read index: up to what this member knows is committed.
    assert offset == follower.commit_offset >= len(expected)
    assert follower.reads.predates == (follower.member.term, leader.name)
    # And the next reads, at once too, without asking.
    await append_all(c, "b", 2, expected)
    await _caught_up(c, follower, len(expected))
    started = time.monotonic()
    assert await follower.reads.read_index() == follower.commit_offset == len(expected)
    assert time.monotonic() - started < prompt_s

    # The upgrade goes on: each older broker restarts onto the new code. Once an upgraded
    # member leads, a follower learns the read index from it again (read-your-writes).
    for name in old:
        await c.kill(name)
        await c.start(name)
    await append_all(c, "c", 2, expected)
    leader = c.leader()
    assert leader is not None
    _, end = await c.append(b"the last append;")
    for node in (c.live[n].node for n in NAMES if n != leader.name):
        assert await node.reads.read_index() >= end  # not only what it has learned itself
        assert node.reads.predates is None


async def test_only_the_unknown_type_refusal_counts(quorum_nodes: Cluster) -> None:
    """A send's outcome: TypeRefused only for the unknown-type refusal; a node that is not
    there (NOT_FOUND), a malformed envelope, a broker that is down: dropped, nothing learned."""
    c = quorum_nodes
    await c.start(NAMES[0], unknown=READ_INDEX_TYPES)
    await c.start(NAMES[1])
    transport = GrpcTransport(c.endpoints() | {"down": "http://127.0.0.1:1"})
    try:
        ask = ReadIndexAsk(1, "m9", 1)
        assert await transport.send(NAMES[0], Envelope(J, NAMES[0], ask)) == TypeRefused(
            "ReadIndexAsk"
        )
        answer = ReadIndexAnswer(1, "m9", 1, 0)
        assert await transport.send(NAMES[0], Envelope(J, NAMES[0], answer)) == TypeRefused(
            "ReadIndexAnswer"
        )
        # The upgraded broker takes both.
        assert await transport.send(NAMES[1], Envelope(J, NAMES[1], ask)) == Sent.DELIVERED
        # Refusals of another kind, and a broker that does not answer at all.
        assert await transport.send(NAMES[1], Envelope(J, "elsewhere", ask)) == Sent.DROPPED
        assert await transport.send("down", Envelope(J, "down", ask)) == Sent.DROPPED
        assert await transport.send("unknown", Envelope(J, "unknown", ask)) == Sent.DROPPED
    finally:
        await transport.close()


async def test_a_malformed_envelope_is_not_an_unknown_type(tmp_path: Path) -> None:
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")

    def route(journal: str, to: str) -> Receiver | None:
        return None

    server.add_generic_rpc_handlers([deliver_handler(route)])
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        call = channel.unary_unary("/gazette.quorum.Replica/Deliver")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(b'{"format":1,"journal":"j","to":"m","message":{"@":"Nope"}}')
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused_type(err.value.details() or "") == "Nope"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(b"not json")
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused_type(err.value.details() or "") is None
    finally:
        await channel.close()
        await server.stop(None)


def test_an_older_decoder_refuses_the_read_index_as_the_previous_version_did() -> None:
    raw = encode_envelope(Envelope(J, "m0", ReadIndexAsk(3, "m1", 7)))
    assert decode_envelope(raw).message == ReadIndexAsk(3, "m1", 7)
    # The previous version's decoder: WireDecodeError(f"unknown type {name!r}").
    with pytest.raises(WireDecodeError) as err:
        decode_envelope(raw, unknown=READ_INDEX_TYPES)
    assert str(err.value) == "unknown type 'ReadIndexAsk'"
    assert refused_type(f"quorum deliver: {err.value}") == "ReadIndexAsk"
    assert refused_type("quorum deliver: envelope format must be 1") is None
    assert refused_type("unknown type 'ReadIndexAsk'") is None  # not a Deliver refusal
