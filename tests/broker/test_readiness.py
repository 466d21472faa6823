"""Readiness (broker.readiness): a broker or consumer started while a predecessor with its ID
still holds the member key answers every RPC UNAVAILABLE ("starting") and is not ready, never
from an empty view of the cluster; once the predecessor's lease is gone it serves, ready.
In-process, over the embedded keyspace (tests/e2e/test_e2e_readiness_restart.py does the same
with real processes, etcd and kill -9)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import aiohttp
import grpc
import grpc.aio
import pytest
from broker_testkit import FAST_CONFIG, Cluster, journal_spec

from broker.client.list_apply import list_journals
from broker.client.route_cache import JournalClient
from broker.http_gateway import HttpGateway
from broker.keyspace.embedded import EmbeddedStore
from broker.keyspace.keyspace import KeySpace
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import consumer_pb2_grpc as cpbg
from broker.protocol import protocol_pb2 as pb
from broker.protocol import protocol_pb2_grpc as pbg
from broker.readiness import MemberKeyError, check_own_member
from broker.server import Broker
from broker.topology import member_key
from gazette_consumer.member import ConsumerConfig, ConsumerMember
from gazette_consumer.metrics import serve_metrics
from gazette_consumer.runner import Readiness
from gazette_consumer.topology import member_key as consumer_member_key
from tests.gazette_consumer.consumer_testkit import FakeShards

J = "ready/journal"
# Bound on any one wait of these tests (each takes milliseconds).
wait_s = 10.0


def _starting(err: grpc.aio.AioRpcError) -> bool:
    return err.code() == grpc.StatusCode.UNAVAILABLE and "is starting" in (err.details() or "")


async def _refused(call: object) -> grpc.aio.AioRpcError:
    """The error an RPC (an awaitable call, or a streaming one read through) fails with."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        if hasattr(call, "__aiter__"):
            async for _ in call:  # type: ignore[attr-defined]
                pass
        else:
            await call  # type: ignore[misc]
    return info.value


async def _status(url: str) -> int:
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        return resp.status


async def _ready_status(gw: HttpGateway) -> int:
    return await _status(f"http://127.0.0.1:{gw.port}/debug/ready")


async def test_a_broker_answers_unavailable_until_its_predecessor_is_gone(
    cluster: Cluster,
) -> None:
    a = await cluster.start_broker("zone-a", "broker-a")
    await cluster.create(journal_spec(J), [a])
    assert (await cluster.append(a, J, [b"hello"])).status == pb.OK
    # A predecessor of broker-b, crashed: its member key waits for its lease to expire.
    lease, _ = await cluster.admin.lease_grant(60)
    await cluster.admin.put(
        member_key(a.config.root, "zone-a", "broker-b").encode(), b"", lease=lease
    )

    b = Broker(cluster.store.connect(), replace(FAST_CONFIG, zone="zone-a", suffix="broker-b"))
    gateway = HttpGateway(ready=b.is_ready)  # As `gazette serve` wires it.
    await gateway.start("127.0.0.1", 0)
    starting = asyncio.create_task(b.start())
    await asyncio.wait_for(b.bound.wait(), wait_s)
    client = JournalClient(b.endpoint)
    try:
        stub = pbg.JournalStub(client.channels.get(b.endpoint))
        append = stub.Append()
        await append.write(pb.AppendRequest(journal=J))
        await append.write(pb.AppendRequest())
        await append.done_writing()
        refusals = [
            await _refused(stub.List(pb.ListRequest())),
            await _refused(stub.Read(pb.ReadRequest(journal=J, offset=0, block=False))),
            await _refused(stub.ListFragments(pb.FragmentsRequest(journal=J))),
            await _refused(stub.Apply(pb.ApplyRequest())),
            await _refused(append),
        ]
        assert all(_starting(err) for err in refusals), [err.details() for err in refusals]
        assert not b.is_ready() and not starting.done()
        assert await _ready_status(gateway) == 503
        assert b.gate.refused == len(refusals)

        await cluster.admin.lease_revoke(lease)  # The predecessor's lease expires.
        await asyncio.wait_for(starting, wait_s)
        cluster.brokers.append(b)
        assert b.is_ready()
        assert await _ready_status(gateway) == 200
        listing = await list_journals(client)
        assert [j.spec.name for j in listing.journals] == [J]
        assert (await cluster.append(b, J, [b" again"])).status == pb.OK
        await cluster.stop_broker(b)
        assert not b.is_ready()
        assert await _ready_status(gateway) == 503
    finally:
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        await client.close()
        await gateway.stop()
        if b in cluster.brokers:
            await cluster.stop_broker(b)


async def test_a_consumer_answers_unavailable_until_its_predecessor_is_gone() -> None:
    store = EmbeddedStore()
    admin = store.connect()
    root = "/gazette/consumers/ready"
    lease, _ = await admin.lease_grant(60)
    await admin.put(consumer_member_key(root, "zone-a", "consumer-a").encode(), b"", lease=lease)
    member = ConsumerMember(
        store.connect(),
        ConsumerConfig(zone="zone-a", suffix="consumer-a", root=root, stop_grace_s=0.0),
        FakeShards(),
    )
    readiness = Readiness()  # What `gazette-consumer serve --http-port` wires.
    http, port = await serve_metrics("127.0.0.1", 0, ready=readiness)
    ready_url = f"http://127.0.0.1:{port}/debug/ready"
    assert await _status(ready_url) == 503  # No member yet.
    readiness.member = member
    starting = asyncio.create_task(member.start())
    channel: grpc.aio.Channel | None = None
    try:
        await asyncio.wait_for(member.bound.wait(), wait_s)
        channel = grpc.aio.insecure_channel(member.endpoint.removeprefix("http://"))
        stub = cpbg.ShardStub(channel)  # type: ignore[no-untyped-call]
        refusals = [
            await _refused(stub.List(cpb.ListRequest())),
            await _refused(stub.Stat(cpb.StatRequest(shard="shard-000"))),
            await _refused(stub.GetHints(cpb.GetHintsRequest(shard="shard-000"))),
        ]
        assert all(_starting(err) for err in refusals), [err.details() for err in refusals]
        assert not member.is_ready()
        assert await _status(ready_url) == 503

        await admin.lease_revoke(lease)
        await asyncio.wait_for(starting, wait_s)
        assert member.is_ready()
        assert await _status(ready_url) == 200
        listing = await stub.List(cpb.ListRequest())
        assert listing.status == cpb.OK
        await member.stop(graceful=False)
        assert not member.is_ready()
        assert await _status(ready_url) == 503
    finally:
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        if channel is not None:
            await channel.close()
        await http.cleanup()
    await member.backend.close()
    await admin.close()


async def test_check_own_member_names_what_is_wrong() -> None:
    store = EmbeddedStore()
    admin = store.connect()
    key = b"/root/members/zone-a#broker-a"
    ours, _ = await admin.lease_grant(60)
    theirs, _ = await admin.lease_grant(60)
    ks: KeySpace[bytes] = KeySpace(b"/root", lambda kv: kv.value)
    await ks.load(admin)
    with pytest.raises(MemberKeyError, match="missing"):
        check_own_member(ks, key, ours, 0)
    announced = (await admin.put(key, b"", lease=theirs)).revision
    with pytest.raises(MemberKeyError, match="before the announcement"):
        check_own_member(ks, key, ours, announced)
    await ks.load(admin)
    with pytest.raises(MemberKeyError, match="held by lease"):
        check_own_member(ks, key, ours, announced)
    announced = (await admin.put(key, b"", lease=ours)).revision
    await ks.load(admin)
    check_own_member(ks, key, ours, announced)
    await admin.close()
