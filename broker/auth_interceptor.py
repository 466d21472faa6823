"""What every token-checking server interceptor does first: verify the RPC's token.

An RPC must present a token (``broker.auth``) that verifies with one of the server's keys and
grants the capability its method needs. Otherwise it fails at once, before its handler runs:
UNAUTHENTICATED for a missing, malformed, forged or expired token, PERMISSION_DENIED for a token
without the capability; the message says which, and the refusal is counted
(``gazette_auth_rejections_total``). A verified RPC's handler and claims go to the subclass
(``authorized``), which adds its service's scope checks: the broker's Journal service
(``broker.auth_server``) and the consumer's Shard service (``gazette_consumer.shard_auth``).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc
import grpc.aio

from broker import metrics
from broker.auth import AUTHORIZATION, AuthError, Claims, KeyedAuth, capability_of, verified_claims
from broker.logging import get_logger
from broker.readiness import rebuild_handler
from broker.request_stream import read_to_end, refusal_messages_max, refusal_read_s

log = get_logger(__name__)


class TokenInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """See the module docstring. `clock` returns Unix seconds (token expiry is in them)."""

    def __init__(self, auth: KeyedAuth, *, clock: Callable[[], float] = time.time) -> None:
        self._auth = auth
        self._clock = clock

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        method: str = details.method
        try:
            claims = self._auth.verify(
                authorization_of(details.invocation_metadata), capability_of(method)
            )
        except AuthError as err:
            metrics.AUTH_REJECTIONS.labels(err.reason).inc()
            log.info("rpc refused", method=method, code=err.code.name, reason=str(err))
            # A client-streaming RPC (Append) hears its answer only once it stops writing;
            # a bidirectional one (Replicate) reads answers as it writes.
            drains = handler.request_streaming and not handler.response_streaming
            return rebuild_handler(handler, refusal(err, drains))
        return self.authorized(handler, claims, method)

    def authorized(self, handler: grpc.RpcMethodHandler, claims: Claims, method: str) -> Any:
        """The handler to run `method` with, its token verified as `claims`."""
        return with_claims(handler, claims)


def authorization_of(metadata: Sequence[tuple[str, Any]] | None) -> str | None:
    """The ``authorization`` value of an RPC's invocation metadata, if any."""
    for key, value in metadata or ():
        if key == AUTHORIZATION:
            return value.decode() if isinstance(value, bytes) else str(value)
    return None


def _behavior(handler: grpc.RpcMethodHandler) -> Callable[..., Any]:
    inner = handler.unary_unary or handler.unary_stream or handler.stream_unary
    return inner or handler.stream_stream  # type: ignore[no-any-return]


def with_claims(handler: grpc.RpcMethodHandler, claims: Claims) -> Any:
    """`handler`, run with `claims` as the verified claims of its context (for RPCs that need
    no more than a valid token)."""
    inner = _behavior(handler)
    if inspect.isasyncgenfunction(inner):

        async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
            verified_claims.set(claims)
            async for response in inner(request, context):
                yield response

        return rebuild_handler(handler, stream)

    async def call(request: Any, context: Any) -> Any:
        verified_claims.set(claims)
        result = inner(request, context)  # A generated default may be a plain function.
        return await result if inspect.isawaitable(result) else result

    return rebuild_handler(handler, call)


def refusal(err: AuthError, drains: bool) -> Callable[[Any, Any], Any]:
    """A handler behaviour answering `err` (after reading the requests, if `drains`)."""

    async def refuse(request: Any, context: Any) -> None:
        if drains:
            # So that the client hears why (request_stream.py); tightly bounded, as the
            # client is not authorized to use the broker at all.
            await read_to_end(
                aiter(request), seconds=refusal_read_s, messages_max=refusal_messages_max
            )
        await context.abort(err.code, str(err))

    return refuse


async def abort_expired(context: Any) -> None:
    """End a stream whose authorization expired while it ran."""
    metrics.AUTH_REJECTIONS.labels("expired").inc()
    await context.abort(
        grpc.StatusCode.UNAUTHENTICATED,
        "authorization expired during the stream (re-authorize and resume)",
    )
