"""The all-replicas mode's replication bytes are Gazette's, with or without the mode label.

A real broker is the primary of an R=2 journal whose other member is a recording peer: a gRPC
server on loopback implementing protocol.Journal/Replicate over raw bytes, which records every
request exactly as it arrived on the wire and acknowledges what asks to be. One append of
"hello, world" must reach it as Gazette's messages (the opening proposal, the content, the
commit proposal) and nothing else, byte for byte; the header (revisions, the peer's ID)
is compared as decoded, the rest of each message as bytes."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from broker_testkit import ROOT, Cluster, journal_spec

from broker.fragment.naming import sum_from_digest
from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set
from broker.topology import assignment_key, member_key

PEER = pb.ProcessSpec.ID(zone="zone-9", suffix="recording-peer")
CONTENT = b"hello, world"


class RecordingPeer:
    def __init__(self) -> None:
        self.raw: list[bytes] = []
        self.server = grpc.aio.server()
        handler = grpc.stream_stream_rpc_method_handler(
            self._replicate,
            request_deserializer=None,  # Keep the wire bytes.
            response_serializer=pb.ReplicateResponse.SerializeToString,
        )
        self.server.add_generic_rpc_handlers(
            [grpc.method_handlers_generic_handler("protocol.Journal", {"Replicate": handler})]
        )
        self.endpoint = f"http://127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"

    async def _replicate(
        self, requests: AsyncIterator[bytes], context: Any
    ) -> AsyncIterator[pb.ReplicateResponse]:
        first = True
        async for raw in requests:
            self.raw.append(raw)
            req = pb.ReplicateRequest.FromString(raw)
            if req.acknowledge:
                resp = pb.ReplicateResponse(status=pb.OK)
                if first:
                    resp.header.CopyFrom(req.header)
                    first = False
                yield resp


@pytest.fixture
async def peer() -> AsyncIterator[RecordingPeer]:
    p = RecordingPeer()
    await p.server.start()
    yield p
    await p.server.stop(None)


@pytest.mark.parametrize("mode", [None, gl.REPLICATION_MODE_ALL_REPLICAS])
async def test_replication_bytes_are_gazettes(
    cluster: Cluster, peer: RecordingPeer, mode: str | None
) -> None:
    primary = await cluster.start_broker("zone-0", "primary")
    spec = journal_spec("wire/journal", replication=2)
    if mode is not None:
        spec.labels.CopyFrom(label_set([(gl.REPLICATION_MODE, mode)]))
    await cluster.put_spec(spec)
    lease, _ = await cluster.admin.lease_grant(60)
    broker_spec = pb.BrokerSpec(process_spec=pb.ProcessSpec(id=PEER, endpoint=peer.endpoint))
    await cluster.admin.put(
        member_key(ROOT, PEER.zone, PEER.suffix).encode(), broker_spec.SerializeToString(), lease
    )
    primary_key = assignment_key(ROOT, spec.name, "zone-0", "primary", 0).encode()
    await cluster.admin.put(primary_key, b"", lease=primary.lease_id)
    peer_key = assignment_key(ROOT, spec.name, PEER.zone, PEER.suffix, 1).encode()
    header = await cluster.admin.put(peer_key, b"", lease=lease)
    await cluster.sync(header.revision)

    resp = await cluster.append(primary, spec.name, [CONTENT])
    assert resp.status == pb.OK, resp
    assert (resp.commit.begin, resp.commit.end) == (0, len(CONTENT))

    # Every message is a ReplicateRequest with only Gazette's fields, canonically encoded.
    requests = [pb.ReplicateRequest.FromString(raw) for raw in peer.raw]
    for raw, req in zip(peer.raw, requests, strict=True):
        assert req.SerializeToString() == raw
    opening = requests[0]
    assert opening.header.process_id == PEER
    assert [m.suffix for m in opening.header.route.members] == ["primary", "recording-peer"]

    # The messages without the opening header, as bytes built from Gazette's field numbers:
    # the opening proposal of the empty fragment; as many again as empty appends (the journal's
    # pulse) committed meanwhile; the content; the commit proposal.
    empty = pb.Fragment(journal=spec.name, compression_codec=pb.NONE, sum=pb.SHA1Sum())
    committed = pb.Fragment(
        journal=spec.name,
        end=len(CONTENT),
        compression_codec=pb.NONE,
        sum=sum_from_digest(hashlib.sha1(CONTENT).digest()),
    )
    proposal = pb.ReplicateRequest(proposal=empty, registers=pb.LabelSet(), acknowledge=True)
    content = pb.ReplicateRequest(content=CONTENT)
    commit = pb.ReplicateRequest(proposal=committed, registers=pb.LabelSet(), acknowledge=True)
    assert proposal.SerializeToString() == b'\x1a\x12\n\x0cwire/journal"\x00(\x010\x01:\x00'
    assert content.SerializeToString() == b'"\x0chello, world'
    opening.ClearField("header")
    got = [opening.SerializeToString(), *peer.raw[1:]]
    pulses = len(got) - 3
    assert pulses >= 0
    assert got == [proposal.SerializeToString()] * (1 + pulses) + [
        content.SerializeToString(),
        commit.SerializeToString(),
    ]
