"""A quorum journal's metrics, read as Prometheus scrapes them (the HTTP gateway's
/debug/metrics) from three in-process brokers: term, leadership, commit lag, elections started
and won, log-full refusals; a stopped node's series are gone (docs/design/quorum.md,
Built (f16-snap))."""

from __future__ import annotations

import dataclasses

import aiohttp
import grpc
import pytest
from broker_testkit import Cluster, journal_spec
from prometheus_client.parser import text_string_to_metric_families

from broker.http_gateway import HttpGateway
from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set
from broker.quorum_shell.node_config import broker_quorum_config
from broker.server import Broker
from broker.topology import format_id
from tests.broker.quorum.test_quorum_append_dispatch import _leader_of

LOG_BYTES_MAX = 4096
CHUNK = b"x" * 1000
JOURNAL = "mode/metrics"

Series = dict[tuple[str, str], float]  # (sample name, member) -> value, for JOURNAL


async def _scrape(session: aiohttp.ClientSession, port: int) -> Series:
    async with session.get(f"http://127.0.0.1:{port}/debug/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    out: Series = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("gazette_quorum_") and sample.labels.get("journal") == (
                JOURNAL
            ):
                out[(sample.name, sample.labels["member"])] = sample.value
    return out


def _name(broker: Broker) -> str:
    return format_id(broker.id)


async def test_quorum_metrics_after_an_election_and_a_refusal(cluster: Cluster) -> None:
    brokers = [await cluster.start_broker(f"zone-{i}", f"broker-{i}") for i in range(3)]
    for broker in brokers:  # nothing reaches the store: the fifth append fills the log
        broker.quorum.quorum_config = dataclasses.replace(
            broker_quorum_config(), log_bytes_max=LOG_BYTES_MAX
        )
    spec = journal_spec(JOURNAL, replication=3)
    spec.labels.CopyFrom(label_set([(gl.REPLICATION_MODE, gl.REPLICATION_MODE_QUORUM)]))
    await cluster.create(spec, brokers)
    leader = await _leader_of(brokers, JOURNAL)
    term = leader.quorum.nodes[JOURNAL].member.term

    gateway = HttpGateway(None)
    port = await gateway.start("127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(LOG_BYTES_MAX // len(CHUNK)):
                assert (await cluster.append(leader, JOURNAL, [CHUNK])).status == pb.OK
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await cluster.append(leader, JOURNAL, [CHUNK])
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

            got = await _scrape(session, port)
            lead = _name(leader)
            members = [_name(b) for b in brokers]
            assert got[("gazette_quorum_term", lead)] == term >= 1
            assert got[("gazette_quorum_leading", lead)] == 1
            assert sum(got[("gazette_quorum_leading", m)] for m in members) == 1
            assert got[("gazette_quorum_elections_won_total", lead)] >= 1
            started = sum(got[("gazette_quorum_elections_started_total", m)] for m in members)
            assert started >= 1  # at least the term that elected the leader was claimed
            assert got[("gazette_quorum_log_full_total", lead)] == 1
            assert sum(got[("gazette_quorum_log_full_total", m)] for m in members) == 1
            # Every acknowledged append committed: the leader holds nothing uncommitted.
            assert got[("gazette_quorum_commit_lag_bytes", lead)] == 0
            assert got[("gazette_quorum_snapshots_sent_total", lead)] == 0

            # The leader's broker stops: another member wins a later term, and the stopped
            # node's series are gone.
            await cluster.stop_broker(leader)
            rest = [b for b in brokers if b is not leader]
            successor = await _leader_of(rest, JOURNAL)
            new_term = successor.quorum.nodes[JOURNAL].member.term
            assert new_term > term
            after = await _scrape(session, port)
            new = _name(successor)
            assert after[("gazette_quorum_term", new)] == new_term
            assert after[("gazette_quorum_leading", new)] == 1
            won = ("gazette_quorum_elections_won_total", new)
            assert after[won] == got[won] + 1
            started_after = sum(
                after[("gazette_quorum_elections_started_total", _name(b))] for b in rest
            )
            assert started_after >= 1
            assert not [key for key in after if key[1] == lead]
    finally:
        await gateway.stop()
