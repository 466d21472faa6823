"""AppendRequest.min_etcd_revision and ReadRequest.min_etcd_revision (Gazette's fields 10 and 9):
the broker resolves the request only once its view of etcd reached that revision, waiting for it
within a bound (the resolver's ``revision_wait_s``), and fails UNAVAILABLE beyond the bound."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from broker.protocol import protocol_pb2 as pb
from tests.broker.broker_testkit import Cluster, journal_spec

J = "revision/journal"


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    c = Cluster()
    try:
        yield c
    finally:
        await c.close()


async def read_first(cluster: Cluster, request: pb.ReadRequest) -> pb.ReadResponse:
    call = cluster.stub(cluster.brokers[0]).Read(request)
    try:
        response: pb.ReadResponse = await call.read()
        return response
    finally:
        call.cancel()


async def test_an_append_waits_for_its_revision_then_resolves_there(cluster: Cluster) -> None:
    broker = await cluster.start_broker("zone-a", "broker-a", revision_wait_s=30.0)
    await cluster.create(journal_spec(J), [broker])
    target = broker.ks.header.revision + 1
    appending = asyncio.ensure_future(
        cluster.append(broker, J, [b"hello"], min_etcd_revision=target)
    )
    # The revision comes about only now; the append's header reflects it.
    await cluster.put_spec(journal_spec("revision/other"))
    resp = await appending
    assert resp.status == pb.OK, resp
    assert resp.header.etcd.revision >= target
    assert resp.commit.end - resp.commit.begin == 5


async def test_an_append_beyond_reach_fails_unavailable_within_the_bound(
    cluster: Cluster,
) -> None:
    broker = await cluster.start_broker("zone-a", "broker-a", revision_wait_s=0.2)
    await cluster.create(journal_spec(J), [broker])
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await cluster.append(broker, J, [b"x"], min_etcd_revision=broker.ks.header.revision + 100)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    # Nothing was appended; a request at a revision already reached goes through at once.
    resp = await cluster.append(broker, J, [b"x"], min_etcd_revision=broker.ks.header.revision)
    assert (resp.status, resp.commit.begin, resp.commit.end) == (pb.OK, 0, 1)


async def test_a_read_waits_for_its_revision(cluster: Cluster) -> None:
    broker = await cluster.start_broker("zone-a", "broker-a", revision_wait_s=30.0)
    await cluster.create(journal_spec(J), [broker])
    await cluster.append(broker, J, [b"hello"])
    target = broker.ks.header.revision + 1
    reading = asyncio.ensure_future(
        read_first(cluster, pb.ReadRequest(journal=J, offset=0, min_etcd_revision=target))
    )
    await cluster.put_spec(journal_spec("revision/other"))
    resp = await reading
    assert resp.status == pb.OK, resp
    assert resp.header.etcd.revision >= target


async def test_a_read_beyond_reach_fails_unavailable(cluster: Cluster) -> None:
    broker = await cluster.start_broker("zone-a", "broker-a", revision_wait_s=0.2)
    await cluster.create(journal_spec(J), [broker])
    request = pb.ReadRequest(journal=J, offset=0, min_etcd_revision=broker.ks.header.revision + 100)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await read_first(cluster, request)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("rpc", ["append", "read"])
async def test_a_negative_revision_is_refused(cluster: Cluster, rpc: str) -> None:
    broker = await cluster.start_broker("zone-a", "broker-a")
    await cluster.create(journal_spec(J), [broker])
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        if rpc == "append":
            await cluster.append(broker, J, [b"x"], min_etcd_revision=-1)
        else:
            await read_first(cluster, pb.ReadRequest(journal=J, min_etcd_revision=-1))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "min_etcd_revision: must be >= 0 (got -1)" in (caught.value.details() or "")
