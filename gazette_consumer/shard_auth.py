"""The consumer's side of authorization: a grpc.aio server interceptor over the Shard service.

The tokens, keys and claims are the brokers' (``broker.auth``): ``gazette-consumer serve
--auth-keys`` verifies with the same pre-shared keys. Every RPC must present a token that
verifies and grants the capability its method needs (Gazette's): Stat and GetHints READ, List
LIST, Apply and Unassign APPLY. Otherwise the RPC fails before its handler runs:
UNAUTHENTICATED for a missing, malformed, forged or expired token, PERMISSION_DENIED for one
without the capability. RPCs of other services on the member's server (an application's own)
need a valid token.

The token's selector limits the shards an RPC may touch. It is matched against a shard's labels
plus the meta-label ``id`` (as List selects):

- Stat and GetHints of a shard outside it are answered SHARD_NOT_FOUND, as if it did not
  exist; List shows only the shards it matches. A token reveals nothing outside its scope.
- Apply refuses (PERMISSION_DENIED, nothing written) a change to a shard outside it, before or
  after the change; Unassign, a shard outside it. (Gazette matches deletions and Unassign
  against the ``id`` label alone, and upserts against the new labels only; we match what the
  shard is and what it becomes, as our brokers do for journals.)

Every RPC ends with UNAUTHENTICATED once its token expires (a Stat may wait for read-through
offsets). Handlers run with the verified claims in ``broker.auth.verified_claims``, so that a
Stat proxied to the shard's primary carries the caller's claims (re-signed), never more.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol

import grpc
import grpc.aio

from broker import metrics
from broker.auth import Claims, KeyedAuth, verified_claims
from broker.auth_interceptor import TokenInterceptor, abort_expired, with_claims
from broker.keyspace.keyspace import KeySpace
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol.selector import matches
from broker.readiness import rebuild_handler
from broker.topology import etcd_header
from gazette_consumer.topology import Decoded, ShardItem, lookup_shard

_SHARD_SERVICE = "/consumer.Shard/"


class ShardScope(Protocol):
    """What the interceptor needs to know of the consumer group's shards."""

    def lookup_spec(self, shard: str) -> cpb.ShardSpec | None:
        """The spec of `shard`, or None if there is none."""
        ...

    def header(self) -> pb.Header:
        """An unrouted header at the current revision (as a shard that does not exist gets)."""
        ...


class KeySpaceShardScope:
    """A ShardScope over a consumer member's KeySpace mirror."""

    def __init__(self, ks: KeySpace[Decoded], root: str) -> None:
        self._ks = ks
        self._root = root

    def lookup_spec(self, shard: str) -> cpb.ShardSpec | None:
        entry = lookup_shard(self._ks, self._root, shard)
        return entry.decoded.spec if entry is not None and isinstance(entry.decoded,
                                                                      ShardItem) else None  # fmt: skip

    def header(self) -> pb.Header:
        return pb.Header(route=pb.Route(primary=-1), etcd=etcd_header(self._ks.header))


def covers(claims: Claims, shard: str, labels: pb.LabelSet) -> bool:
    """Whether the claims' selector matches the shard `shard` with `labels` (an empty selector
    matches every shard)."""
    selector = claims.selector
    if not selector.include.labels and not selector.exclude.labels:
        return True
    return matches(selector, gl.union(gl.shard_meta_labels(shard), labels))


class ShardAuthInterceptor(TokenInterceptor):
    """See the module docstring. `clock` returns Unix seconds (token expiry is in them)."""

    def __init__(
        self, auth: KeyedAuth, scope: ShardScope, *, clock: Callable[[], float] = time.time
    ) -> None:
        super().__init__(auth, clock=clock)
        self._scope = scope
        self._checks: dict[str, Callable[[Any, Claims], Any]] = {
            "Stat": self._check_stat,
            "GetHints": self._check_get_hints,
            "Apply": self._check_apply,
            "Unassign": self._check_unassign,
        }

    def authorized(self, handler: grpc.RpcMethodHandler, claims: Claims, method: str) -> Any:
        if not method.startswith(_SHARD_SERVICE):
            return with_claims(handler, claims)
        return self._unary(handler, claims, method[len(_SHARD_SERVICE) :])

    def _unary(self, handler: grpc.RpcMethodHandler, claims: Claims, name: str) -> Any:
        inner = handler.unary_unary
        check = self._checks.get(name)

        async def call(request: Any, context: Any) -> Any:
            verified_claims.set(claims)
            loop = asyncio.get_running_loop()
            timeout = asyncio.timeout_at(loop.time() + (claims.expires_at - self._clock()))
            try:
                async with timeout:
                    if check is not None:
                        refused = await check(request, claims)
                        if refused is not None:
                            if isinstance(refused, str):
                                metrics.AUTH_REJECTIONS.labels("selector").inc()
                                await context.abort(grpc.StatusCode.PERMISSION_DENIED, refused)
                            return refused
                    response = await inner(request, context)
            except TimeoutError:
                if not timeout.expired():
                    raise
                await abort_expired(context)
            if name == "List":
                self._filter_list(response, claims)
            return response

        return rebuild_handler(handler, call)

    # --- Scope checks: None lets the request through; a response answers it (as if the shard
    # did not exist); a string refuses it with PERMISSION_DENIED. ---

    def _outside(self, claims: Claims, shard: str) -> bool:
        spec = self._scope.lookup_spec(shard)
        # A shard that does not exist is the handler's to answer (SHARD_NOT_FOUND too).
        return spec is not None and not covers(claims, shard, spec.labels)

    async def _check_stat(self, request: cpb.StatRequest, claims: Claims) -> Any:
        if not self._outside(claims, request.shard):
            return None
        metrics.AUTH_REJECTIONS.labels("selector").inc()
        return cpb.StatResponse(status=cpb.SHARD_NOT_FOUND, header=self._scope.header())

    async def _check_get_hints(self, request: cpb.GetHintsRequest, claims: Claims) -> Any:
        if not self._outside(claims, request.shard):
            return None
        metrics.AUTH_REJECTIONS.labels("selector").inc()
        return cpb.GetHintsResponse(status=cpb.SHARD_NOT_FOUND, header=self._scope.header())

    async def _check_apply(self, request: cpb.ApplyRequest, claims: Claims) -> str | None:
        for change in request.changes:
            shard = change.upsert.id if change.HasField("upsert") else change.delete
            outside = self._outside(claims, shard)
            if change.HasField("upsert"):
                outside = outside or not covers(claims, shard, change.upsert.labels)
            if outside:
                return f"authorization does not cover shard {shard!r}"
        return None

    async def _check_unassign(self, request: cpb.UnassignRequest, claims: Claims) -> str | None:
        for shard in request.shards:
            if self._outside(claims, shard):
                return f"authorization does not cover shard {shard!r}"
        return None

    @staticmethod
    def _filter_list(response: cpb.ListResponse, claims: Claims) -> None:
        kept = [s for s in response.shards if covers(claims, s.spec.id, s.spec.labels)]
        if len(kept) != len(response.shards):
            del response.shards[:]
            response.shards.extend(kept)
