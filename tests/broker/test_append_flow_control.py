"""The minimum append rate on a real in-process broker, at its default settings: a bursty client
well above the minimum rate is admitted, a stalled one is still cut.

The bursty client streams 1 MiB every 1.5 s: ten times the default minimum rate (64 KiB/s), in
bursts further apart than one second. Its credit must cover the gaps (the burst window); before,
the credit was capped at one second of the minimum rate, and such a client was aborted with
RESOURCE_EXHAUSTED at its first gap.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from broker_testkit import Cluster, journal_spec, local_content

from broker.append_receive import min_append_rate_bytes_per_s_default
from broker.protocol import protocol_pb2 as pb

J = "flow/journal"
CHUNK = 1 << 20
GAP_S = 1.5


async def test_a_bursty_client_ten_times_the_minimum_rate_is_admitted(cluster: Cluster) -> None:
    assert CHUNK / GAP_S >= 10 * min_append_rate_bytes_per_s_default
    broker = await cluster.start_broker("zone-a", "broker-a")
    await cluster.create(journal_spec(J, length=16 << 20), [broker])
    chunks = [bytes([index]) * CHUNK for index in range(3)]

    call = cluster.stub(broker).Append()
    await call.write(pb.AppendRequest(journal=J))
    for index, chunk in enumerate(chunks):
        if index:
            await asyncio.sleep(GAP_S)  # The client's own pace: this is what is under test.
        await call.write(pb.AppendRequest(content=chunk))
    await call.write(pb.AppendRequest())
    await call.done_writing()
    resp = await call
    assert (resp.status, resp.commit.begin, resp.commit.end) == (pb.OK, 0, 3 * CHUNK)
    assert local_content(broker, J) == (0, b"".join(chunks))


async def test_a_client_stalled_after_a_large_burst_is_still_cut(cluster: Cluster) -> None:
    """However much a client sent, the credit is capped at the burst window: a stall holds the
    journal for at most that long, and the append is rolled back."""
    broker = await cluster.start_broker(
        "zone-a", "broker-a", min_append_rate_bytes_per_s=1 << 20, flow_control_burst_s=0.1
    )
    await cluster.create(journal_spec(J, length=16 << 20), [broker])
    call = cluster.stub(broker).Append()
    await call.write(pb.AppendRequest(journal=J))
    await call.write(pb.AppendRequest(content=b"x" * (8 << 20)))  # 8 s of the minimum rate.
    # ... then nothing: cut after the burst window (0.1 s), not after 8 s.
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await asyncio.wait_for(call, timeout=4.0)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    resp = await cluster.append(broker, J, [b"after"])
    assert (resp.status, resp.commit.begin) == (pb.OK, 0)
