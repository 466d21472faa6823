"""list_all_fragments: pages of the ListFragments RPC (a real FragmentsAPI server on loopback)
joined into one response, and statuses raised as typed errors."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest

from broker.client.list_apply import list_all_fragments
from broker.client.route_cache import ChannelPool, JournalClient
from broker.fragment.index import FragmentIndex
from broker.fragment.stores.registry import StoreRegistry
from broker.fragments_api import FragmentsAPI
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import NotAllowedError
from tests.broker.read_testkit import JOURNAL, FakeResolver, Replica, Servicer, serving


@contextlib.asynccontextmanager
async def listing(resolver: FakeResolver) -> AsyncIterator[JournalClient]:
    """A client of a FragmentsAPI over ``resolver``, served on loopback."""
    channels = ChannelPool()
    servicer = Servicer(fragments=FragmentsAPI(resolver, StoreRegistry({}), channels))
    async with serving(servicer) as endpoint:
        client = JournalClient(endpoint)
        try:
            yield client
        finally:
            await client.close()
            await channels.close()


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
    async with listing(FakeResolver(Replica(indexed(7)))) as client:
        response = await list_all_fragments(
            client, pb.FragmentsRequest(journal=JOURNAL, page_limit=3)
        )
    assert [f.spec.begin for f in response.fragments] == [0, 10, 20, 30, 40, 50, 60]
    assert response.next_page_token == 0


async def test_continues_from_a_page_token_and_filters() -> None:
    async with listing(FakeResolver(Replica(indexed(7)))) as client:
        response = await list_all_fragments(
            client,
            pb.FragmentsRequest(
                journal=JOURNAL, page_limit=2, next_page_token=25, end_mod_time=1005
            ),
        )
    assert [f.spec.begin for f in response.fragments] == [30, 40, 50]


async def test_statuses_are_raised() -> None:
    resolver = FakeResolver(Replica(indexed(1)), flags=pb.JournalSpec.O_WRONLY)
    async with listing(resolver) as client:
        with pytest.raises(NotAllowedError):
            await list_all_fragments(client, pb.FragmentsRequest(journal=JOURNAL))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await list_all_fragments(client, pb.FragmentsRequest(journal=JOURNAL, page_limit=-1))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
