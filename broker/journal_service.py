"""JournalService: the gRPC Journal service of one broker, each RPC delegated to its module.

``append_api`` (Append), ``replicate_api`` (Replicate), ``read_api`` (Read), ``fragments_api``
(ListFragments, FragmentStoreHealth) and ``list_apply_api`` (List, Apply). The broker
(broker/server.py) builds one over its resolver and serves it behind its readiness gate and
auth interceptor, with the server options below.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from broker.append_api import AppendApi
from broker.fragments_api import FragmentsAPI, StoreHealthAPI
from broker.list_apply_api import ListApplyAPI
from broker.pipeline import message_bytes_max
from broker.protocol import protocol_pb2 as pb
from broker.protocol import protocol_pb2_grpc as pbg
from broker.read_api import ReadAPI, write_responses
from broker.replicate_api import ReplicateApi

SERVER_OPTIONS = [
    ("grpc.max_send_message_length", message_bytes_max),
    ("grpc.max_receive_message_length", message_bytes_max),
    # Peers hold Replicate streams open across idle periods; let them ping.
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
]


class JournalService(pbg.JournalServicer):
    """The gRPC Journal service of one broker: each RPC delegates to its module."""

    def __init__(
        self,
        append: AppendApi,
        replicate: ReplicateApi,
        read: ReadAPI,
        fragments: FragmentsAPI,
        list_apply: ListApplyAPI,
        store_health: StoreHealthAPI,
    ) -> None:
        self._append = append
        self._replicate = replicate
        self._read = read
        self._fragments = fragments
        self._list_apply = list_apply
        self._store_health = store_health

    # grpc.aio serves a streaming response from an async generator method, or from a coroutine
    # that writes its responses with context.write (Read, below).

    async def Read(self, request: pb.ReadRequest, context: Any) -> None:
        # Unlike the other streaming methods, a coroutine that writes its responses (grpc.aio
        # serves that shape too): a write failing because the client has just gone then ends
        # the stream quietly, where grpc.aio's own writing logs it as an ERROR. The auth
        # interceptor (auth_server.AuthInterceptor._read) serves this shape under its expiry.
        responses = self._read.read(request, context)
        await write_responses(responses, context, journal=request.journal)

    async def List(self, request: pb.ListRequest, context: Any) -> AsyncIterator[pb.ListResponse]:
        async for response in self._list_apply.list(request, context):
            yield response

    async def Apply(self, request: pb.ApplyRequest, context: Any) -> pb.ApplyResponse:
        return await self._list_apply.apply(request, context)

    async def ListFragments(
        self, request: pb.FragmentsRequest, context: Any
    ) -> pb.FragmentsResponse:
        return await self._fragments.list_fragments(request, context)

    async def FragmentStoreHealth(
        self, request: pb.FragmentStoreHealthRequest, context: Any
    ) -> pb.FragmentStoreHealthResponse:
        return await self._store_health.fragment_store_health(request, context)

    async def Append(
        self, request_iterator: AsyncIterator[pb.AppendRequest], context: Any
    ) -> pb.AppendResponse:
        return await self._append.append(request_iterator, context)

    async def Replicate(
        self, request_iterator: AsyncIterator[pb.ReplicateRequest], context: Any
    ) -> None:
        await self._replicate.replicate(request_iterator, context)
