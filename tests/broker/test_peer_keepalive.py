"""A broker's server accepts its peers' keepalive pings (grpc_transport.py): a call from a peer
channel that exchanges no data for many ping intervals (a blocking read of an empty journal,
an idle Replicate stream, a proxied append waiting for its commit) is not cut.

A server that allows pings less often than peers send them counts each early ping as a strike
and, after two, answers GOAWAY "too_many_pings": every call on the connection fails
UNAVAILABLE. With the server's old 10-s minimum and the peers' 2-s pings that happened about
10 s into the call. The stopped-peer side (pings unanswered) is
tests/e2e/test_e2e_proxy_to_stopped_broker.py."""

from __future__ import annotations

import grpc
import pytest
from broker_testkit import Cluster, journal_spec

from broker.grpc_transport import peer_keepalive_time_s
from broker.peer_dialer import Dialer
from broker.protocol import protocol_pb2 as pb

JOURNAL = "keepalive/idle"
# Long enough for a server that refuses the pings to have cut the call (seen at about 10 s
# with the old minimum): six ping intervals.
idle_call_s = 6 * peer_keepalive_time_s


async def test_an_idle_peer_call_outlives_many_keepalive_pings(cluster: Cluster) -> None:
    broker = await cluster.start_broker("zone-a", "broker-a")
    await cluster.create(journal_spec(JOURNAL), [broker])
    dialer = Dialer()
    try:
        call = dialer.stub(broker.endpoint).Read(
            pb.ReadRequest(journal=JOURNAL, offset=0, block=True), timeout=idle_call_s
        )
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            async for _ in call:
                pass
        code, details = ended.value.code(), ended.value.details()
        assert code is grpc.StatusCode.DEADLINE_EXCEEDED, (code, details)
    finally:
        await dialer.close()
