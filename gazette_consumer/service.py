"""The Shard gRPC service of a consumer process (Gazette's ``consumer.Shard``).

``ShardService`` is the servicer a ``ConsumerMember`` registers: List, Apply, Unassign and
GetHints are answered from etcd and the member's mirror (``shard_specs_api``); Stat resolves the
shard (``resolver``) and answers for it:

* the primary is this process: once the replica serves and has read through the requested
  offsets (of journals it reads) in a completed transaction, its read-through and publish-at
  offsets;
* the primary is another process: the request is proxied to it, once, with our resolution's
  header attached (the peer checks the header names it and catches up with our revision);
  a request that already carries a header is not proxied again and is answered
  NOT_SHARD_PRIMARY;
* no such shard, or no primary now: SHARD_NOT_FOUND / NO_SHARD_PRIMARY, with the route;
* the local replica stopped or failed while the request waited: SHARD_STOPPED.

Bad requests are refused with INVALID_ARGUMENT naming the field, and change nothing.
"""

from __future__ import annotations

from typing import Any, Final

import grpc
import grpc.aio

from broker.client.route_cache import ChannelPool
from broker.keyspace.backend import Backend, KeySpaceError
from broker.keyspace.keyspace import KeySpace
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import consumer_pb2_grpc as cpbg
from broker.protocol import protocol_pb2 as pb
from broker.protocol.validate import (
    ValidationError,
    at,
    validate_offsets,
    validate_shard_id,
)
from broker.read_api import Context
from broker.topology import validate_header
from gazette_consumer.local_shards import LocalShardsStoppedError
from gazette_consumer.resolver import ResolveError, Resolver, read_through_wait_s_max
from gazette_consumer.shard_specs_api import ShardSpecsAPI
from gazette_consumer.topology import Decoded

# A proxied Stat gives up after this long without an answer from the primary (the caller's own
# deadline, when shorter, applies first).
proxy_timeout_s: Final = read_through_wait_s_max + 10.0


def validate_stat_request(request: cpb.StatRequest) -> None:
    if request.HasField("header"):
        with at("header"):
            validate_header(request.header)
    with at("shard"):
        validate_shard_id(request.shard)
    with at("read_through"):
        validate_offsets(request.read_through)


def _wait_bound_s(context: Context) -> float:
    """How long a Stat may wait: the caller's remaining deadline, capped."""
    remaining = context.time_remaining()
    if remaining is None:
        return read_through_wait_s_max
    return max(0.0, min(read_through_wait_s_max, remaining))


class ShardService(cpbg.ShardServicer):
    """The Shard service of one consumer process (see the module docstring)."""

    def __init__(
        self,
        ks: KeySpace[Decoded],
        backend: Backend,
        root: str,
        resolver: Resolver,
        channels: ChannelPool,
        process_id: pb.ProcessSpec.ID,
    ) -> None:
        self._specs = ShardSpecsAPI(ks, backend, root, process_id)
        self._resolver = resolver
        self._channels = channels

    async def List(self, request: cpb.ListRequest, context: Any) -> cpb.ListResponse:
        return await self._specs.list_shards(request, context)

    async def Apply(self, request: cpb.ApplyRequest, context: Any) -> cpb.ApplyResponse:
        return await self._specs.apply(request, context)

    async def Unassign(self, request: cpb.UnassignRequest, context: Any) -> cpb.UnassignResponse:
        return await self._specs.unassign(request, context)

    async def GetHints(self, request: cpb.GetHintsRequest, context: Any) -> cpb.GetHintsResponse:
        return await self._specs.get_hints(request, context)

    async def Stat(self, request: cpb.StatRequest, context: Any) -> cpb.StatResponse:
        try:
            validate_stat_request(request)
        except ValidationError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"StatRequest.{err}")
        proxied = request.HasField("header")
        try:
            res = await self._resolver.resolve(
                request.shard,
                may_proxy=not proxied,
                proxy_header=request.header if proxied else None,
                read_through=dict(request.read_through),
                wait_s=_wait_bound_s(context),
            )
        except ResolveError as err:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        except LocalShardsStoppedError as err:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
        except (TimeoutError, KeySpaceError) as err:
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"shard {request.shard}: not ready (or not read through) in time: {err}",
            )
        response = cpb.StatResponse(status=res.status, header=res.header)
        if res.status != cpb.OK:
            return response
        if res.handle is None:
            return await self._proxy(request, res.header, context)
        progress = res.handle.progress()
        response.read_through.update(progress.read_through)
        response.publish_at.update(progress.publish_at)
        return response

    async def _proxy(
        self, request: cpb.StatRequest, header: pb.Header, context: Context
    ) -> cpb.StatResponse:
        route = header.route
        endpoint = (
            route.endpoints[route.primary] if 0 <= route.primary < len(route.endpoints) else ""
        )
        if not endpoint:
            # The primary's ConsumerSpec is gone (its lease just expired): the allocator will
            # promote another; until then there is nobody to ask.
            return cpb.StatResponse(status=cpb.NO_SHARD_PRIMARY, header=header)
        forwarded = cpb.StatRequest()
        forwarded.CopyFrom(request)
        forwarded.header.CopyFrom(header)
        stub = cpbg.ShardStub(self._channels.get(endpoint))
        remaining = context.time_remaining()
        timeout_s = proxy_timeout_s if remaining is None else min(proxy_timeout_s, remaining)
        try:
            response: cpb.StatResponse = await stub.Stat(forwarded, timeout=timeout_s)
        except grpc.aio.AioRpcError as err:
            await context.abort(err.code(), f"proxying Stat to {endpoint}: {err.details()}")
        return response
