"""How a pipeline names a peer's failure in the error an append reports: the peer and gRPC's
status; and where gRPC replaced the peer's own status with its local "Internal error from Core"
(our write raced the peer ending the stream), where the reason is to be found."""

from __future__ import annotations

import grpc
import grpc.aio
from grpc.aio import Metadata

from broker.grpc_transport import CORE_SEND_FAILED
from broker.pipeline import PeerError, _describe, _Peer
from broker.protocol import protocol_pb2 as pb

PEER = pb.ProcessSpec.ID(zone="zone-b", suffix="broker-b")


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, Metadata(), Metadata(), details)


def test_a_peer_status_is_named_with_the_peer() -> None:
    cause = rpc_error(grpc.StatusCode.UNAVAILABLE, "No space left on device")
    err = _describe(_Peer(member=PEER), cause, "send to")
    assert isinstance(err, PeerError) and err.__cause__ is cause
    assert str(err) == "send to zone-b#broker-b: UNAVAILABLE: No space left on device"


def test_a_send_that_broke_the_stream_says_where_the_reason_is() -> None:
    cause = rpc_error(grpc.StatusCode.INTERNAL, CORE_SEND_FAILED)
    err = _describe(_Peer(member=PEER), cause, "send to")
    assert str(err) == (
        f"send to zone-b#broker-b: INTERNAL: {CORE_SEND_FAILED} "
        "(the stream broke: zone-b#broker-b's log says why)"
    )
    # Another INTERNAL is the peer's own answer: told as it is.
    other = _describe(_Peer(member=PEER), rpc_error(grpc.StatusCode.INTERNAL, "boom"), "send to")
    assert str(other) == "send to zone-b#broker-b: INTERNAL: boom"
