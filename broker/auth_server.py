"""The broker's side of authorization: a grpc.aio server interceptor over the Journal service.

Every RPC must present a token (see `broker.auth`) that verifies with one of the broker's keys
and grants the capability its method needs: List LIST, Apply APPLY, Read and ListFragments READ,
Append APPEND, Replicate REPLICATE. Otherwise the RPC fails at once, before its handler runs:
UNAUTHENTICATED for a missing, malformed, forged or expired token, PERMISSION_DENIED for a token
without the capability; the message says which (`broker.auth_interceptor`, shared with the
consumer's Shard service). (RPCs of other services need a valid token.)

The token's selector then limits the journals the RPC may touch, as in Gazette:

- Read, Append and ListFragments of a journal the selector does not match are answered as if
  the journal did not exist (in-band JOURNAL_NOT_FOUND), so a token reveals nothing about
  journals outside its scope. Nothing is read or appended.
- List shows only the journals the selector matches.
- Apply refuses (PERMISSION_DENIED) a change to a journal outside the selector, before or after
  the change.
- Replicate (broker to broker) refuses a journal outside the selector.

A selector is matched against a journal's labels plus its meta-labels ("name", and "prefix" at
each '/'), with "prefix" selector labels read as name prefixes, exactly as List selects.

Streams that outlive their token (a blocking Read, a List watch) are ended at its expiry with
UNAUTHENTICATED, after any response being written (never cut half-way); the client
re-authorizes and resumes. Appends and Replicate streams are checked when they start only:
cutting a pipeline or an append mid-way would fail work that was authorized when it began.

Handlers run with the verified claims in `broker.auth.verified_claims`, so that requests the
broker proxies on carry the caller's claims (re-signed), not the broker's own power.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import grpc
import grpc.aio

from broker import metrics
from broker.auth import Claims, KeyedAuth, verified_claims
from broker.auth_interceptor import TokenInterceptor, abort_expired, with_claims
from broker.list_apply_api import rewrite_prefix_labels
from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol.selector import matches
from broker.protocol.validate import split_journal_meta
from broker.read_api import write_responses
from broker.readiness import rebuild_handler
from broker.resolver import Resolver
from broker.topology import etcd_header, make_header

_JOURNAL_SERVICE = "/protocol.Journal/"


class JournalScope(Protocol):
    """What the interceptor needs to know of the broker's journals."""

    def lookup_spec(self, journal: str) -> pb.JournalSpec | None:
        """The spec of `journal` (no ";meta" suffix), or None if there is none."""
        ...

    def refusal_header(self) -> pb.Header:
        """The header to answer a journal that is out of scope with (as the resolver answers
        a journal that does not exist)."""
        ...


def covering_selector(claims: Claims) -> pb.LabelSelector | None:
    """The claims' selector ready to match journals ("prefix" read as a name prefix), or None
    if it matches every journal."""
    selector = claims.selector
    if not selector.include.labels and not selector.exclude.labels:
        return None
    return rewrite_prefix_labels(selector)


def covers(selector: pb.LabelSelector | None, name: str, labels: pb.LabelSet) -> bool:
    """Whether `selector` (from covering_selector) matches the journal `name` with `labels`."""
    if selector is None:
        return True
    return matches(selector, gl.union(gl.journal_meta_labels(name), labels))


async def _chain(first: Any, rest: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """`first` (the message a check peeked at), then the rest of the request stream."""
    if first is not None:
        yield first
    async for message in rest:
        yield message


class AuthInterceptor(TokenInterceptor):
    """See the module docstring. `clock` returns Unix seconds (token expiry is in them)."""

    def __init__(
        self, auth: KeyedAuth, scope: JournalScope, *, clock: Callable[[], float] = time.time
    ) -> None:
        super().__init__(auth, clock=clock)
        self._scope = scope
        self._wrappers: dict[str, Callable[[grpc.RpcMethodHandler, Claims], Any]] = {
            "Read": self._read,
            "List": self._list,
            "Apply": self._apply,
            "Append": self._append,
            "Replicate": self._replicate,
            "ListFragments": self._list_fragments,
        }

    def authorized(self, handler: grpc.RpcMethodHandler, claims: Claims, method: str) -> Any:
        name = method[len(_JOURNAL_SERVICE) :] if method.startswith(_JOURNAL_SERVICE) else ""
        wrapper = self._wrappers.get(name)
        return wrapper(handler, claims) if wrapper is not None else with_claims(handler, claims)

    # --- Scope checks ---

    def _permits(self, selector: pb.LabelSelector | None, journal: str) -> bool:
        if selector is None:
            return True
        name, _ = split_journal_meta(journal)
        spec = self._scope.lookup_spec(name)
        # A journal that does not exist is the handler's to answer (JOURNAL_NOT_FOUND too).
        if spec is None or covers(selector, name, spec.labels):
            return True
        metrics.AUTH_REJECTIONS.labels("selector").inc()
        return False

    # --- Wrappers, one per method shape ---

    def _read(self, handler: grpc.RpcMethodHandler, claims: Claims) -> Any:
        inner, selector = handler.unary_stream, covering_selector(claims)
        # The broker's Read (server.JournalService.Read) is a coroutine writing its responses
        # itself, so that a client going away mid-stream ends it quietly (see
        # read_api.write_responses); a Read yielding them is relayed and written the same way.
        yields = inspect.isasyncgenfunction(inner)

        async def read(request: pb.ReadRequest, context: Any) -> None:
            verified_claims.set(claims)
            if not self._permits(selector, request.journal):
                header = self._scope.refusal_header()
                await context.write(pb.ReadResponse(status=pb.JOURNAL_NOT_FOUND, header=header))
                return
            if yields:
                responses = self._until_expiry(inner(request, context), claims, context)
                await write_responses(responses, context, journal=request.journal)
            else:
                await self._within_expiry(inner, request, claims, context)

        return rebuild_handler(handler, read)

    def _list(self, handler: grpc.RpcMethodHandler, claims: Claims) -> Any:
        inner, selector = handler.unary_stream, covering_selector(claims)

        async def list_(request: pb.ListRequest, context: Any) -> AsyncIterator[pb.ListResponse]:
            verified_claims.set(claims)
            responses = self._until_expiry(inner(request, context), claims, context)
            async for response in responses:
                if selector is not None and response.journals:
                    kept = [j for j in response.journals if covers(selector, j.spec.name,
                                                                   j.spec.labels)]  # fmt: skip
                    if not kept and not response.HasField("header"):
                        # A continuation of a snapshot, now empty: drop it, since an empty
                        # message would read as the end of the snapshot.
                        continue
                    del response.journals[:]
                    response.journals.extend(kept)
                yield response

        return rebuild_handler(handler, list_)

    def _apply(self, handler: grpc.RpcMethodHandler, claims: Claims) -> Any:
        inner, selector = handler.unary_unary, covering_selector(claims)

        async def apply(request: pb.ApplyRequest, context: Any) -> pb.ApplyResponse:
            verified_claims.set(claims)
            for change in request.changes if selector is not None else ():
                name = change.upsert.name if change.HasField("upsert") else change.delete
                current = self._scope.lookup_spec(name)
                allowed = current is None or covers(selector, name, current.labels)
                if change.HasField("upsert"):
                    allowed = allowed and covers(selector, name, change.upsert.labels)
                if not allowed:
                    metrics.AUTH_REJECTIONS.labels("selector").inc()
                    await context.abort(
                        grpc.StatusCode.PERMISSION_DENIED,
                        f"authorization does not cover journal {name!r}",
                    )
            response: pb.ApplyResponse = await inner(request, context)
            return response

        return rebuild_handler(handler, apply)

    def _append(self, handler: grpc.RpcMethodHandler, claims: Claims) -> Any:
        inner, selector = handler.stream_unary, covering_selector(claims)

        async def append(requests: AsyncIterator[pb.AppendRequest], context: Any) -> Any:
            verified_claims.set(claims)
            stream = aiter(requests)
            first = await anext(stream, None)
            if first is not None and not self._permits(selector, first.journal):
                header = self._scope.refusal_header()
                return pb.AppendResponse(status=pb.JOURNAL_NOT_FOUND, header=header)
            return await inner(_chain(first, stream), context)

        return rebuild_handler(handler, append)

    def _replicate(self, handler: grpc.RpcMethodHandler, claims: Claims) -> Any:
        inner, selector = handler.stream_stream, covering_selector(claims)
        if inspect.isasyncgenfunction(inner):
            raise TypeError("Replicate handlers must be coroutines writing to their context")

        async def replicate(requests: AsyncIterator[pb.ReplicateRequest], context: Any) -> Any:
            verified_claims.set(claims)
            stream = aiter(requests)
            first = await anext(stream, None)
            if first is not None:
                journal = first.proposal.journal or first.deprecated_journal
                if not self._permits(selector, journal):
                    await context.abort(
                        grpc.StatusCode.PERMISSION_DENIED,
                        f"authorization does not cover journal {journal!r}",
                    )
            return await inner(_chain(first, stream), context)

        return rebuild_handler(handler, replicate)

    def _list_fragments(self, handler: grpc.RpcMethodHandler, claims: Claims) -> Any:
        inner, selector = handler.unary_unary, covering_selector(claims)

        async def list_fragments(request: pb.FragmentsRequest, context: Any) -> Any:
            verified_claims.set(claims)
            if not self._permits(selector, request.journal):
                header = self._scope.refusal_header()
                return pb.FragmentsResponse(status=pb.JOURNAL_NOT_FOUND, header=header)
            return await inner(request, context)

        return rebuild_handler(handler, list_fragments)

    async def _until_expiry(
        self, responses: AsyncIterator[Any], claims: Claims, context: Any
    ) -> AsyncGenerator[Any, None]:
        """Relay `responses` until the claims expire; then end the RPC with UNAUTHENTICATED.
        The deadline covers each wait for the next response, never the relaying of one."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (claims.expires_at - self._clock())
        try:
            while True:
                timeout = asyncio.timeout_at(deadline)
                try:
                    async with timeout:
                        response = await anext(responses)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    if not timeout.expired():
                        raise
                    await abort_expired(context)
                yield response
        finally:
            await responses.aclose()  # type: ignore[attr-defined]

    async def _within_expiry(
        self, handler: Callable[[Any, Any], Awaitable[None]], request: Any, claims: Claims,
        context: Any,
    ) -> None:  # fmt: skip
        """Run `handler` (a streaming handler that writes its responses) until the claims
        expire; then end the RPC with UNAUTHENTICATED, after the messages already written.

        The expiry never cuts a write: one in progress completes first (`_WritesBeforeExpiry`).
        grpc.aio cannot end a call whose write was cancelled: until the first write completes
        it has not recorded the initial metadata as sent, so the status it sends next carries
        them again, core refuses that batch (GRPC_CALL_ERROR_TOO_MANY_OPERATIONS), and the
        client waits forever. A write that flow control holds completes when the client reads
        on, or fails when it goes away, as without authorization."""
        deadline = asyncio.get_running_loop().time() + (claims.expires_at - self._clock())
        timeout = asyncio.timeout_at(deadline)
        try:
            async with timeout:
                await handler(request, _WritesBeforeExpiry(context, timeout, deadline))
        except TimeoutError:
            if not timeout.expired():
                raise
            await abort_expired(context)
        except _ExpiredBeforeWrite:
            await abort_expired(context)


class _ExpiredBeforeWrite(Exception):
    """The claims expired before a write began (raised into the handler in place of it)."""


class _WritesBeforeExpiry:
    """A servicer context whose writes the expiry `timeout` waits for: put off while a write is
    in progress, and set back to `deadline` after it (due at once if that has passed). A write
    begun after the deadline raises _ExpiredBeforeWrite instead: back-to-back writes would
    otherwise put the expiry off for as long as there is content to send. Everything else is
    the wrapped context's."""

    def __init__(self, context: Any, timeout: asyncio.Timeout, deadline: float) -> None:
        self._context = context
        self._timeout = timeout
        self._deadline = deadline

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    async def write(self, message: Any) -> None:
        if self._timeout.expired():  # The handler writes on while it is being cancelled.
            await self._context.write(message)
            return
        self._timeout.reschedule(None)
        if asyncio.get_running_loop().time() >= self._deadline:
            raise _ExpiredBeforeWrite()
        try:
            await self._context.write(message)
        finally:
            self._timeout.reschedule(self._deadline)


class ResolverScope:
    """A JournalScope over a broker's Resolver (its KeySpace mirror)."""

    def __init__(self, resolver: Resolver) -> None:
        self._resolver = resolver

    def lookup_spec(self, journal: str) -> pb.JournalSpec | None:
        return self._resolver.lookup_spec(journal)

    def refusal_header(self) -> pb.Header:
        return make_header(
            self._resolver.local_id(), pb.Route(primary=-1), etcd_header(self._resolver.ks.header)
        )
