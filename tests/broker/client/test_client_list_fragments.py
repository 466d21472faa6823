"""list_all_fragments: pages of the ListFragments RPC (a real FragmentsAPI server on loopback)
joined into one response, and statuses raised as typed errors."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
import pytest

from broker.client.list_apply import list_all_fragments
from broker.client.route_cache import ChannelPool, JournalClient
from broker.fragment.index import FragmentIndex
from broker.fragment.stores.registry import StoreRegistry
from broker.fragments_api import FragmentsAPI
from broker.protocol import protocol_pb2 as pb
from broker.protocol import protocol_pb2_grpc as pb_grpc
from broker.protocol.status import NotAllowedError

JOURNAL = "a/journal"


@dataclass
class Replica:
    index: FragmentIndex


@dataclass
class Resolution:
    status: int
    header: pb.Header
    spec: pb.JournalSpec | None
    replica: Replica | None
    is_local: bool = True


@dataclass
class FakeResolver:
    replica: Replica
    flags: int = 0

    async def resolve(self, journal: str, **kwargs: Any) -> Resolution:
        spec = pb.JournalSpec(name=journal, flags=self.flags)
        return Resolution(pb.OK, pb.Header(), spec, self.replica)


class Servicer(pb_grpc.JournalServicer):  # type: ignore[misc]
    def __init__(self, api: FragmentsAPI) -> None:
        self.api = api

    async def ListFragments(self, request: pb.FragmentsRequest, context: Any) -> Any:
        return await self.api.list_fragments(request, context)


@contextlib.asynccontextmanager
async def serving(resolver: FakeResolver) -> AsyncIterator[JournalClient]:
    channels = ChannelPool()
    server = grpc.aio.server()
    pb_grpc.add_JournalServicer_to_server(
        Servicer(FragmentsAPI(resolver, StoreRegistry({}), channels)), server
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    client = JournalClient(f"http://127.0.0.1:{port}")
    try:
        yield client
    finally:
        await client.close()
        await channels.close()
        await server.stop(None)


def indexed(count: int) -> FragmentIndex:
    index = FragmentIndex(JOURNAL)
    index.replace_remote(
        pb.Fragment(
            journal=JOURNAL,
            begin=i * 10,
            end=(i + 1) * 10,
            compression_codec=pb.NONE,
            backing_store="file:///store/",
            mod_time=1000 + i,
        )
        for i in range(count)
    )
    return index


async def test_joins_every_page() -> None:
    async with serving(FakeResolver(Replica(indexed(7)))) as client:
        response = await list_all_fragments(
            client, pb.FragmentsRequest(journal=JOURNAL, page_limit=3)
        )
    assert [f.spec.begin for f in response.fragments] == [0, 10, 20, 30, 40, 50, 60]
    assert response.next_page_token == 0


async def test_continues_from_a_page_token_and_filters() -> None:
    async with serving(FakeResolver(Replica(indexed(7)))) as client:
        response = await list_all_fragments(
            client,
            pb.FragmentsRequest(
                journal=JOURNAL, page_limit=2, next_page_token=25, end_mod_time=1005
            ),
        )
    assert [f.spec.begin for f in response.fragments] == [30, 40, 50]


async def test_statuses_are_raised() -> None:
    resolver = FakeResolver(Replica(indexed(1)), flags=pb.JournalSpec.O_WRONLY)
    async with serving(resolver) as client:
        with pytest.raises(NotAllowedError):
            await list_all_fragments(client, pb.FragmentsRequest(journal=JOURNAL))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await list_all_fragments(client, pb.FragmentsRequest(journal=JOURNAL, page_limit=-1))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
