"""gRPC channels from a broker to its peers: the Replicate streams of its pipelines, and the
Append calls it proxies.

One channel per peer endpoint, shared by every pipeline and proxied request of the broker,
bounded in number (the least recently used is closed past the bound). Content chunks go out as
the bytes they already are (content_wire.py): calls are opened with a serializer that passes
bytes through and serializes messages as usual.
"""

from __future__ import annotations

from typing import Any

import grpc

from broker.client.route_cache import (
    CHANNEL_OPTIONS,
    ChannelPool,
    reconnect_backoff_initial_ms,
    reconnect_backoff_max_ms,
)
from broker.grpc_transport import PEER_KEEPALIVE_CHANNEL_OPTIONS, with_options
from broker.protocol import protocol_pb2 as pb
from broker.protocol import protocol_pb2_grpc as pbg
from broker.protocol.content_wire import passthrough_serializer
from broker.tls import ClientTls

# Largest gRPC message a broker sends or accepts (channels and server alike). Appends stream in
# chunks far below this; it bounds the memory one message can claim.
message_bytes_max = 64 << 20
# Channels a broker keeps to its peers (one per endpoint; the least recently used is closed
# past it). Far above any cluster's broker count, so that it never closes a live pipeline's.
peer_channels_max_default = 1024

_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", message_bytes_max),
    ("grpc.max_receive_message_length", message_bytes_max),
    # A peer back on the same endpoint (restarted) is reachable again within seconds.
    ("grpc.initial_reconnect_backoff_ms", reconnect_backoff_initial_ms),
    ("grpc.max_reconnect_backoff_ms", reconnect_backoff_max_ms),
    # A call to a peer that stopped answering (SIGSTOP, a hung host) fails within seconds.
    *PEER_KEEPALIVE_CHANNEL_OPTIONS,
]
# The read path's channels to peers (proxied reads, fragment listings): a client's, with the
# keepalive of peer channels.
PEER_READ_CHANNEL_OPTIONS = with_options(CHANNEL_OPTIONS, PEER_KEEPALIVE_CHANNEL_OPTIONS)
_REPLICATE_METHOD = "/protocol.Journal/Replicate"
_REPLICATE_SERIALIZER = passthrough_serializer(pb.ReplicateRequest.SerializeToString)
_APPEND_METHOD = "/protocol.Journal/Append"
_APPEND_SERIALIZER = passthrough_serializer(pb.AppendRequest.SerializeToString)


class Dialer:
    """gRPC channels to peer brokers, one per endpoint, shared by every pipeline and proxied
    request of a broker. Peers advertising ``https://`` endpoints are dialed with TLS, trusting
    and presenting what `tls` holds (broker.tls)."""

    def __init__(
        self,
        interceptors: list[grpc.aio.ClientInterceptor] | None = None,
        *,
        tls: ClientTls | None = None,
        channels_max: int = peer_channels_max_default,
    ) -> None:
        # Bounded (least recently used closed first), and channels to peers unreachable for a
        # while are dropped: brokers that come back on new endpoints (new pods, new ports) do
        # not leave a channel each behind for the broker's lifetime.
        self._channels = ChannelPool(
            channels_max=channels_max,
            interceptors=interceptors or (),  # E.g. broker.auth's token signing.
            tls=tls,
            options=_CHANNEL_OPTIONS,
        )

    def _channel(self, endpoint: str) -> grpc.aio.Channel:
        return self._channels.get(endpoint)

    def __len__(self) -> int:
        return len(self._channels)

    def stub(self, endpoint: str) -> pbg.JournalStub:
        return pbg.JournalStub(self._channel(endpoint))

    def append(self, endpoint: str) -> Any:
        """Open an Append call to ``endpoint`` (a proxied append). Besides AppendRequests, it
        sends bytes as they are: content chunks as they were received. Returns a
        grpc.aio.StreamUnaryCall."""
        return self._channel(endpoint).stream_unary(
            _APPEND_METHOD,
            request_serializer=_APPEND_SERIALIZER,
            response_deserializer=pb.AppendResponse.FromString,
        )()

    def replicate(self, endpoint: str) -> Any:
        """Open a Replicate stream to ``endpoint``. Besides ReplicateRequests, it sends bytes
        as they are: content chunks the pipeline encoded once for all peers (content_wire.py).
        Returns a grpc.aio.StreamStreamCall (the generated stubs are untyped)."""
        return self._channel(endpoint).stream_stream(
            _REPLICATE_METHOD,
            request_serializer=_REPLICATE_SERIALIZER,
            response_deserializer=pb.ReplicateResponse.FromString,
        )()

    async def close(self) -> None:
        await self._channels.close()
