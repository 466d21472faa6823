"""A consumer shard on quorum journals served by real broker processes over real etcd, with the
recovery log's quorum leader killed (kill -9) mid-run (issue #16).

Three `gazette serve` processes; the source journal and the shard's recovery log are both
labelled gazette.dev/replication-mode=quorum. The shard (examples/word_count: a JSONFileStore
recorded into the log, which its recorder fences with registers) runs in this process. Texts
are published, and while the shard works on a batch the broker leading the recovery log's
term is killed -9: the two others elect a new leader, and the counts stay exactly once, in the
shard's store and in what the log replays to."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_workload import journal_spec, requires_etcd

from broker.client.append_service import AppendService
from broker.protocol import labels
from broker.protocol import protocol_pb2 as pb
from broker.testing.process_cluster import BrokerProcess, ProcessCluster
from broker.topology import QuorumTerm
from examples.word_count import WordCount, counts_of
from gazette_consumer.shard_runner import LocalShard, ShardRunner
from gazette_consumer.shard_spec import recovery_log
from gazette_consumer.stores.jsonfile import JSONFileStore
from tests.gazette_consumer.recovery_testkit import Texts, logged_counts, words_spec
from tests.gazette_consumer.shard_testkit import Notifier

pytestmark = [pytest.mark.etcd, requires_etcd]

ROOT = "/test/e2e-quorum-shard"
LEASE_TTL_S = 3
THREE_BROKERS = [("zone-a", "broker-a1"), ("zone-a", "broker-a2"), ("zone-b", "broker-b1")]
QUORUM = (labels.REPLICATION_MODE, labels.REPLICATION_MODE_QUORUM)


def quorum_journal(name: str, store: str, content_type: str) -> pb.JournalSpec:
    spec = journal_spec(name, 3, store)
    spec.labels.CopyFrom(labels.label_set([(labels.CONTENT_TYPE, content_type), QUORUM]))
    return spec


def quorum_leader(cluster: ProcessCluster, journal: str) -> BrokerProcess | None:
    """The broker named leader of `journal`'s term in the term register (etcd), if any."""
    entry = cluster.ks.get(f"{cluster.root}/quorum/{journal}")
    if entry is None or not isinstance(entry.decoded, QuorumTerm):
        return None
    leader = entry.decoded.record.leader
    return next((b for b in cluster.brokers if f"{b.zone}#{b.suffix}" == leader), None)


def store_of(handle: LocalShard) -> JSONFileStore:
    primary = handle.primary
    assert primary is not None
    store = primary.store
    assert isinstance(store, JSONFileStore)
    return store


async def test_exactly_once_with_the_recovery_log_leader_killed(tmp_path: Path) -> None:
    async with ProcessCluster(THREE_BROKERS, lease_ttl_s=LEASE_TTL_S) as cluster:
        source = "in/quorum-words"
        spec = words_spec("shard-e2e-quorum", source)
        log = recovery_log(spec)
        await cluster.apply(
            [
                quorum_journal(source, cluster.store_url, labels.CONTENT_TYPE_JSON_LINES),
                quorum_journal(log, cluster.store_url, labels.CONTENT_TYPE_RECOVERY_LOG),
            ]
        )
        await cluster.wait_until(cluster.journals_ready([source, log], 3, zones_min=2))
        client = cluster.client()
        changed = Notifier()
        async with (
            AppendService(client) as appends,
            ShardRunner(WordCount(), client, root=ROOT, data_dir=tmp_path / "shard") as runner,
        ):
            texts = Texts(appends)
            handle = runner.start(spec, on_change=changed.notify)
            end = await texts.send(source, ["the quick fox", "the lazy dog"])
            await changed.read_through(handle, source, end)
            assert counts_of(store_of(handle)) == texts.expected
            await cluster.wait_until(
                lambda: None if quorum_leader(cluster, log) else f"{log}: no leader registered"
            )
            leader = quorum_leader(cluster, log)
            assert leader is not None

            # A batch the shard is working on when the log's leader dies.
            await texts.send(source, ["fox " * 20, "dog " * 20])
            await cluster.kill(leader)  # kill -9: no hand-off
            end = await texts.send(source, ["after the kill", "fox dog"])
            await changed.read_through(handle, source, end)
            assert counts_of(store_of(handle)) == texts.expected
            new_leader = quorum_leader(cluster, log)
            assert new_leader is not None and new_leader is not leader

        assert await logged_counts(client, log, tmp_path / "check") == texts.expected
