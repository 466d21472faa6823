"""ReadCommittedIter, unchanged, on a quorum journal (issue #16): three in-process brokers, a
journal labelled gazette.dev/replication-mode=quorum, transactions appended through a Gazette
client (which any broker proxies to the term's leader). The iterator reads through the
ordinary Read RPC and delivers exactly the committed, acknowledged messages, as it does on an
all-replicas journal."""

from __future__ import annotations

import asyncio
from typing import Any

from read_iter_testkit import ACK, CONTINUE, MARKER, OUTSIDE, P1, P2, Msg, frames, msg, texts

from broker.client.appender import append
from broker.client.route_cache import JournalClient
from broker.protocol import labels
from broker.protocol import protocol_pb2 as pb
from gazette_consumer.message import Envelope
from gazette_consumer.sequencer.read_iter import ReadCommittedIter
from tests.broker.broker_testkit import Cluster, journal_spec

J = "quorum/messages"
TIMEOUT_S = 30.0


async def test_read_committed_iter_on_a_quorum_journal() -> None:
    cluster = Cluster()
    client: JournalClient | None = None
    try:
        brokers = [await cluster.start_broker(f"zone-{i}", f"broker-{i}") for i in range(3)]
        spec = journal_spec(J, replication=3)
        spec.labels.CopyFrom(
            labels.label_set(
                [
                    (labels.CONTENT_TYPE, labels.CONTENT_TYPE_JSON_LINES),
                    (labels.REPLICATION_MODE, labels.REPLICATION_MODE_QUORUM),
                ]
            )
        )
        await cluster.create(spec, brokers)
        client = JournalClient(brokers[0].endpoint)

        async def write(*messages: Msg) -> None:
            # Retries ride out the election.
            resp = await append(
                client, pb.AppendRequest(journal=J), frames(*messages), attempts_max=50
            )
            assert resp.status == pb.OK

        await write(
            msg(P1, 10, CONTINUE, "a1"), msg(P2, 50, OUTSIDE, "b1"), msg(P1, 11, CONTINUE, "a2")
        )
        await write(msg(P1, 12, ACK), msg(P1, 13, CONTINUE, "rolled back"))
        await write(msg(P1, 12, ACK), msg(P2, 50, OUTSIDE, "b1"))  # Re-sent ACK, a duplicate.
        await write(msg(MARKER, 1, OUTSIDE, "marker"))

        it = ReadCommittedIter(client, {J: 0}, message_type=lambda _: Msg)
        got: list[Envelope[Any]] = []
        async with asyncio.timeout(TIMEOUT_S):
            while "marker" not in texts(got):
                got.append(await it.next())
        # b1 outside any transaction at once; a1, a2 at their ACK; nothing rolled back or
        # duplicated.
        assert texts(got) == ["b1", "a1", "a2", "marker"]
        assert it.try_next() is None
        await it.close()
    finally:
        if client is not None:
            await client.close()
        await cluster.close()
