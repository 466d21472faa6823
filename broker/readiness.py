"""Readiness: a process answers RPCs only once it knows the cluster.

A broker (or consumer) binds its gRPC port first, because its member key must name its
endpoint, but it cannot serve yet: until it has announced itself (which, after a crash, means
waiting out its predecessor's lease: ``broker.allocator.announce``) and loaded the keyspace, its
view of the cluster is empty. Answered from that view, a List would show no journal, an Append
JOURNAL_NOT_FOUND for a journal that exists, a request proxied to it "etcd cluster ID ... is not
ours (0)"; clients take those as final. So the server carries a ``ReadinessGate``, the first of
its interceptors: until the process opens it, every RPC, of every service, is answered
UNAVAILABLE ("... is starting"), which every client retries, without running its handler.

The process opens the gate once ``check_own_member`` holds (its keyspace mirror is loaded at a
revision at least that of its own announcement, and the member key there is its own, under its
lease) and whatever else it needs before serving is running; it closes it again when it stops
or fails (``/debug/ready`` follows ``is_open``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import grpc
import grpc.aio

from broker.keyspace.keyspace import KeySpace
from broker.request_stream import read_to_end, refusal_messages_max, refusal_read_s

STARTING: Final = "starting"
STOPPING: Final = "stopping"


class MemberKeyError(RuntimeError):
    """After loading its keyspace, a process does not find its own member key there."""


def check_own_member(ks: KeySpace[Any], key: bytes, lease: int, announced_revision: int) -> None:
    """Raise MemberKeyError unless ``ks`` is loaded at ``announced_revision`` or later and holds
    ``key`` under ``lease`` (the announcement this process made)."""
    name = key.decode(errors="replace")
    if ks.header.revision < announced_revision:
        raise MemberKeyError(
            f"keyspace at revision {ks.header.revision}, before the announcement of {name} at"
            f" {announced_revision}"
        )
    entry = ks.get(key)
    if entry is None:
        raise MemberKeyError(f"member key {name} is missing from the loaded keyspace")
    if entry.kv.lease != lease:
        raise MemberKeyError(
            f"member key {name} is held by lease {entry.kv.lease:x}, not ours ({lease:x})"
        )


def rebuild_handler(handler: grpc.RpcMethodHandler, behavior: Callable[..., Any]) -> Any:
    """A handler of the same kind and (de)serializers as ``handler``, running ``behavior``."""
    if handler.request_streaming and handler.response_streaming:
        make = grpc.stream_stream_rpc_method_handler
    elif handler.request_streaming:
        make = grpc.stream_unary_rpc_method_handler
    elif handler.response_streaming:
        make = grpc.unary_stream_rpc_method_handler
    else:
        make = grpc.unary_unary_rpc_method_handler
    return make(
        behavior,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


class ReadinessGate(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """See the module docstring. ``what`` names the process in refusals ("broker z1#b1")."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._open = False
        self._state = STARTING
        self.refused = 0  # RPCs answered UNAVAILABLE while closed.

    @property
    def is_open(self) -> bool:
        return self._open

    def open(self) -> None:
        self._open = True

    def close(self) -> None:
        """Refuse RPCs again (the process is stopping, or failed)."""
        self._open = False
        self._state = STOPPING

    def refusal(self) -> str:
        if self._state == STARTING:
            return (
                f"{self._what} is {STARTING}: it does not know the cluster yet (its keyspace is"
                " not loaded, or its predecessor's lease has not expired); retry"
            )
        return f"{self._what} is {STOPPING}: retry with another broker or later"

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(details)
        if self._open or handler is None:
            return handler
        self.refused += 1
        message = self.refusal()
        # A client-streaming RPC (Append) hears its answer only once it stops writing; a
        # bidirectional one (Replicate) reads answers as it writes (request_stream.py).
        drains = handler.request_streaming and not handler.response_streaming

        async def refuse(request: Any, context: Any) -> None:
            if drains:
                await read_to_end(
                    aiter(request), seconds=refusal_read_s, messages_max=refusal_messages_max
                )
            await context.abort(grpc.StatusCode.UNAVAILABLE, message)

        return rebuild_handler(handler, refuse)
