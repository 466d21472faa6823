"""Servers accept client channels' keepalive pings (broker/grpc_transport.py): a call from a
client channel (route_cache.CHANNEL_OPTIONS, as every ChannelPool's) that exchanges no data for
many ping intervals is not cut, whether to a broker (a blocking read of an empty journal) or to
a consumer member (a Stat waiting for a shard that never becomes ready, as a Stat with
read_through may for minutes).

A server that allows pings less often than clients send them (gRPC's default: one per five
minutes) counts each early ping as a strike and answers GOAWAY "too_many_pings": the call fails
UNAVAILABLE "Too many pings" about 10 s in. The consumer member's server did, before it took the
brokers' ping policy. The stopped-broker side (pings unanswered) is
tests/e2e/test_e2e_client_to_stopped_broker.py."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from broker_testkit import Cluster, journal_spec

from broker.client.route_cache import JournalClient
from broker.grpc_transport import client_keepalive_time_s
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import protocol_pb2 as pb
from gazette_consumer.shard_client import ShardClient
from tests.gazette_consumer.consumer_testkit import Group, shard_spec

JOURNAL = "keepalive/client-idle"
SHARD = "shard-held"
# Long enough for a server that refuses the pings to have cut the call (seen at about 10 s
# with gRPC's default policy): six ping intervals.
idle_call_s = 6 * client_keepalive_time_s


async def _idle_read(client: JournalClient) -> grpc.StatusCode:
    call = client.channels.stub(client.endpoint).Read(
        pb.ReadRequest(journal=JOURNAL, offset=0, block=True), timeout=idle_call_s
    )
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        async for _ in call:
            pass
    code: grpc.StatusCode = ended.value.code()
    assert code is grpc.StatusCode.DEADLINE_EXCEEDED, (code, ended.value.details())
    return code


async def _idle_stat(shards: ShardClient) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        await shards.stat(SHARD)
    code: grpc.StatusCode = ended.value.code()
    assert code is grpc.StatusCode.DEADLINE_EXCEEDED, (code, ended.value.details())
    return code


async def test_idle_client_calls_outlive_many_keepalive_pings(cluster: Cluster) -> None:
    broker = await cluster.start_broker("zone-a", "broker-a")
    await cluster.create(journal_spec(JOURNAL), [broker])
    client = JournalClient(broker.endpoint)
    group = await Group.open()
    try:
        # A member whose replica stays in BACKFILL: a Stat of its shard waits for it.
        node = await group.join("zone-a", "consumer-a", hold=True)
        await group.put_shard(shard_spec(SHARD))

        def backfilling() -> str | None:
            held = group.assignments().get(SHARD, [])
            codes = [a.status.code for a in held]
            return None if codes == [cpb.ReplicaStatus.BACKFILL] else f"{SHARD}: {codes}"

        await group.until(backfilling)
        async with ShardClient(node.member.endpoint, timeout_s=idle_call_s) as shards:
            await asyncio.gather(_idle_read(client), _idle_stat(shards))
    finally:
        await client.close()
        await group.close()
