"""Registration of the Journal service on a gRPC server, with the broker's own deserializers.

The generated ``add_JournalServicer_to_server`` parses every request with protobuf. The broker
registers the same handlers, except that Append and Replicate requests are read with
``content_wire.decode_append_request`` / ``decode_replicate_request``: a content chunk then
reaches its handler as a ``ContentChunk``, a view of the received bytes, instead of being copied
into a message and copied out of it again (every appended byte passes through these handlers
once per replica). Everything else about the methods (names, kinds, serializers) is the
generated code's, read from it rather than restated, so that a regenerated service stays in
step.
"""

from __future__ import annotations

from typing import Any

import grpc

from broker.protocol import protocol_pb2_grpc as pbg
from broker.protocol.content_wire import decode_append_request, decode_replicate_request

SERVICE_NAME = "protocol.Journal"

# Methods whose requests the broker reads itself (see the module docstring).
_DESERIALIZERS = {
    "Append": decode_append_request,
    "Replicate": decode_replicate_request,
}


class _Recorder:
    """Stands in for a server to capture the generated code's method handlers."""

    def __init__(self) -> None:
        self.handlers: dict[str, Any] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        if service != SERVICE_NAME:
            raise ValueError(f"unexpected service {service!r}")
        self.handlers = dict(handlers)


def journal_method_handlers(servicer: pbg.JournalServicer) -> dict[str, Any]:
    """The Journal service's method handlers for ``servicer``, by method name."""
    recorder = _Recorder()
    pbg.add_JournalServicer_to_server(servicer, recorder)
    handlers = recorder.handlers
    missing = set(_DESERIALIZERS) - set(handlers)
    if missing:
        raise ValueError(f"generated Journal service lacks {sorted(missing)}")
    for name, deserializer in _DESERIALIZERS.items():
        # RpcMethodHandler is a namedtuple: replace only the request deserializer.
        handlers[name] = handlers[name]._replace(request_deserializer=deserializer)
    return handlers


def add_journal_service(servicer: pbg.JournalServicer, server: grpc.aio.Server) -> None:
    """Serve ``servicer``'s Journal RPCs on ``server`` (before it starts)."""
    handlers = journal_method_handlers(servicer)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)
