"""One etcd endpoint's connection: its gRPC channel, stubs and auth token.

Used by EtcdBackend (broker/keyspace/etcd.py), which creates one per endpoint on first use,
fails over between them and authenticates them. The channel options make a client find a lost
or restarted etcd in seconds rather than minutes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio

from broker.keyspace.etcdpb import rpc_pb2_grpc
from broker.tls import ClientTls

# Largest response accepted. gRPC's default (4 MiB) is smaller than a Range over a large prefix
# or a watch response catching up many revisions can be.
response_bytes_max = 256 * 1024 * 1024
# Reconnect backoff after a lost connection. gRPC's defaults (1 s initial, 120 s max) would keep
# a client away from a restarted etcd for minutes.
reconnect_backoff_initial_ms = 100
reconnect_backoff_max_ms = 2000
# HTTP/2 keepalive pings find connections that died without a TCP reset (a partitioned or
# frozen server), which would otherwise hang a watch forever. etcd rejects pings more frequent
# than every 5 s by default.
keepalive_time_ms = 10_000
keepalive_timeout_ms = 5_000

channel_options: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", response_bytes_max),
    ("grpc.initial_reconnect_backoff_ms", reconnect_backoff_initial_ms),
    ("grpc.min_reconnect_backoff_ms", reconnect_backoff_initial_ms),
    ("grpc.max_reconnect_backoff_ms", reconnect_backoff_max_ms),
    ("grpc.keepalive_time_ms", keepalive_time_ms),
    ("grpc.keepalive_timeout_ms", keepalive_timeout_ms),
]


class Token:
    """The auth token a connection sends (empty: none), replaced when etcd refuses it."""

    def __init__(self) -> None:
        self.value = ""

    def metadata(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        if not self.value:
            return details
        metadata = grpc.aio.Metadata(*((k, v) for k, v in (details.metadata or ()) if k != "token"))
        metadata.add("token", self.value)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )


class UnaryToken(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, token: Token) -> None:
        self._token = token

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._token.metadata(details), request)


class StreamToken(grpc.aio.StreamStreamClientInterceptor):
    def __init__(self, token: Token) -> None:
        self._token = token

    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._token.metadata(details), requests)


@dataclass(frozen=True, slots=True)
class Conn:
    """One endpoint's channel, its stubs (the generated stubs are untyped) and auth token."""

    channel: grpc.aio.Channel
    token: Token
    kv: Any
    watch: Any
    lease: Any
    maintenance: Any
    auth: Any

    @classmethod
    def dial(cls, target: str, tls: ClientTls | None, *, secure: bool) -> Conn:
        token = Token()
        interceptors = [UnaryToken(token), StreamToken(token)]
        if secure:
            credentials = (tls or ClientTls()).credentials()
            channel = grpc.aio.secure_channel(
                target, credentials, options=channel_options, interceptors=interceptors
            )
        else:
            channel = grpc.aio.insecure_channel(
                target, options=channel_options, interceptors=interceptors
            )
        return cls(
            channel,
            token,
            kv=rpc_pb2_grpc.KVStub(channel),
            watch=rpc_pb2_grpc.WatchStub(channel),
            lease=rpc_pb2_grpc.LeaseStub(channel),
            maintenance=rpc_pb2_grpc.MaintenanceStub(channel),
            auth=rpc_pb2_grpc.AuthStub(channel),
        )
