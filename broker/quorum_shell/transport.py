"""The quorum replication RPC over gRPC: `gazette.quorum.Replica/Deliver`, one unary call per
protocol message (wire.py), and the server-side handler that hands envelopes to local nodes.

Sends are fire and forget: the protocol core re-sends what goes unanswered on its own bounded
backoff, so a lost or failed call is only counted (`dropped`), never retried here. At most
`sends_inflight_max` calls are outstanding per transport; beyond it a message is dropped as a
congested network would, which the core tolerates the same way.

Each send also has an outcome (`send` returns it as a future; most callers ignore it):
`Sent.DELIVERED`, `Sent.DROPPED` (lost, for whatever reason: the sender must not conclude
anything from it), or `TypeRefused` when the receiver refused the message's type as unknown to
its decoder (a broker of an earlier version: wire.py, `refused_type`). The read barrier uses
the last to tell a leader that predates the read index from one that is slow or unreachable.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from broker.client.route_cache import open_channel
from broker.logging import get_logger
from broker.quorum_shell.wire import (
    DELIVER_METHOD,
    ENVELOPE_BYTES_MAX,
    REFUSAL_PREFIX,
    SERVICE,
    Envelope,
    WireDecodeError,
    decode_envelope,
    encode_envelope,
    refused_type,
)

log = get_logger(__name__)

sends_inflight_max = 1024
send_timeout_s = 2.0
_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", ENVELOPE_BYTES_MAX),
    ("grpc.max_receive_message_length", ENVELOPE_BYTES_MAX),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


class Sent(enum.Enum):
    DELIVERED = "delivered"
    DROPPED = "dropped"  # no endpoint, congested, timed out, unreachable, any other refusal


@dataclass(frozen=True, slots=True)
class TypeRefused:
    """The receiver refused the message because its decoder does not know `type_name`."""

    type_name: str


SendOutcome = Sent | TypeRefused


class GrpcTransport:
    """Sends envelopes to nodes by name; `endpoints` maps a node name to its broker's endpoint
    (a Gazette endpoint URL, e.g. http://127.0.0.1:8080)."""

    def __init__(self, endpoints: Mapping[str, str]) -> None:
        self.endpoints = dict(endpoints)
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._inflight: set[asyncio.Task[SendOutcome]] = set()
        self.sent = 0
        self.dropped = 0

    def send(self, node: str, envelope: Envelope) -> asyncio.Future[SendOutcome]:
        """Send `envelope` to `node`; the future answers its outcome (see the module
        docstring), and is cancelled if the transport closes first."""
        loop = asyncio.get_running_loop()
        endpoint = self.endpoints.get(node)
        if endpoint is None or len(self._inflight) >= sends_inflight_max:
            self.dropped += 1
            dropped: asyncio.Future[SendOutcome] = loop.create_future()
            dropped.set_result(Sent.DROPPED)
            return dropped
        raw = encode_envelope(envelope)
        task = loop.create_task(self._call(endpoint, raw))
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)
        return task

    async def _call(self, endpoint: str, raw: bytes) -> SendOutcome:
        channel = self._channels.get(endpoint)
        if channel is None:
            channel = open_channel(endpoint, options=_CHANNEL_OPTIONS)
            self._channels[endpoint] = channel
        call = channel.unary_unary(
            DELIVER_METHOD, request_serializer=None, response_deserializer=None
        )
        try:
            await call(raw, timeout=send_timeout_s)
        except grpc.aio.AioRpcError as err:
            self.dropped += 1
            if err.code() == grpc.StatusCode.INVALID_ARGUMENT:
                name = refused_type(err.details() or "")
                if name is not None:
                    return TypeRefused(name)
            return Sent.DROPPED
        except grpc.RpcError:
            self.dropped += 1
            return Sent.DROPPED
        self.sent += 1
        return Sent.DELIVERED

    async def close(self) -> None:
        for task in list(self._inflight):
            task.cancel()
        await asyncio.gather(*self._inflight, return_exceptions=True)
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()


Receiver = Callable[[Envelope], None]


def deliver_handler(
    route: Callable[[str, str], Receiver | None], *, unknown: frozenset[str] = frozenset()
) -> grpc.GenericRpcHandler:
    """The server side: decode an envelope and hand it to `route(journal, node)`'s receiver.
    Malformed envelopes are refused INVALID_ARGUMENT; an unknown journal or node NOT_FOUND (the
    sender's core retries: the node may not have started yet). `unknown`: message types it
    refuses as a broker of an earlier version, without them, does (wire.decode_envelope)."""

    async def deliver(raw: bytes, context: Any) -> bytes:
        try:
            envelope = decode_envelope(raw, unknown=unknown)
        except WireDecodeError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{REFUSAL_PREFIX}{err}")
            raise AssertionError("not reached") from err
        receiver = route(envelope.journal, envelope.to)
        if receiver is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"{REFUSAL_PREFIX}no node {envelope.to!r} of journal {envelope.journal!r} here",
            )
        else:
            receiver(envelope)
        return b""

    handler = grpc.unary_unary_rpc_method_handler(
        deliver, request_deserializer=None, response_serializer=None
    )
    return grpc.method_handlers_generic_handler(SERVICE, {"Deliver": handler})
