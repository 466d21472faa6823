"""A consumer *process* killed -9 on quorum journals (issue #16, docs/design/quorum.md).

Three `gazette serve` broker processes on a real etcd; the source journal and the shard's
recovery log are both labelled gazette.dev/replication-mode=quorum. A real `gazette-consumer
serve` process runs the word count (examples/word_count: a JSONFileStore recorded into the
log, which its recorder fences with registers). Texts are published; while the shard works
through a batch (Stat says it read part of it) the consumer process is killed -9, more is
published while it is down, and it is restarted: the log is replayed and the shard goes on.

Exactly once, three ways: the counts the restarted process serves (its committed store), an
independent read-committed count of the source journal, and the counts the recovery log
replays to in a fresh directory all equal what was published.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest
from e2e_workload import journal_spec, requires_etcd

from broker.client.append_service import AppendService
from broker.client.route_cache import JournalClient
from broker.protocol import labels
from broker.protocol import protocol_pb2 as pb
from broker.testing.process_cluster import ProcessCluster
from examples.word_count import Text
from examples.word_count.queries import query_counts
from gazette_consumer.sequencer.read_iter import ReadCommittedIter
from gazette_consumer.shard_client import ShardClient
from gazette_consumer.shard_client import upsert as shard_upsert
from gazette_consumer.shard_spec import recovery_log
from tests.gazette_consumer.consumer_testkit import ConsumerProcess, stat_through
from tests.gazette_consumer.recovery_testkit import Texts, logged_counts, words_spec

pytestmark = [pytest.mark.etcd, requires_etcd]

ROOT = "/gazette/consumers/e2e-quorum-kill"
LEASE_TTL_S = 3
THREE_BROKERS = [("zone-a", "broker-a1"), ("zone-a", "broker-a2"), ("zone-b", "broker-b1")]
SHARD = "quorum-kill"
SOURCE = "in/quorum-kill-words"
QUORUM = (labels.REPLICATION_MODE, labels.REPLICATION_MODE_QUORUM)
# Texts per batch: enough that the shard works through several transactions of one.
texts_per_batch = 40
read_s_max = 60.0


def quorum_journal(name: str, store: str, content_type: str) -> pb.JournalSpec:
    spec = journal_spec(name, 3, store)
    spec.labels.CopyFrom(labels.label_set([(labels.CONTENT_TYPE, content_type), QUORUM]))
    return spec


def batch(tag: str) -> list[str]:
    return [f"{tag} word{i % 7} fox{'' if i % 3 else ' dog'}" for i in range(texts_per_batch)]


async def read_committed_counts(client: JournalClient, journal: str, end: int) -> Counter[str]:
    """Word counts of `journal`'s committed texts through `end`, read independently of the
    consumer (read-committed, from offset 0)."""
    counts: Counter[str] = Counter()
    async with ReadCommittedIter(client, {journal: 0}, message_type=Text) as it:
        async with asyncio.timeout(read_s_max):
            while True:
                envelope = await it.next()
                counts.update(envelope.message.text.lower().split())
                if envelope.end >= end:
                    return counts


@pytest.mark.timeout(180)
async def test_a_consumer_process_killed_9_on_quorum_journals_counts_exactly_once(
    tmp_path: Path,
) -> None:
    async with ProcessCluster(THREE_BROKERS, lease_ttl_s=LEASE_TTL_S) as cluster:
        spec = words_spec(SHARD, SOURCE)
        log = recovery_log(spec)
        await cluster.apply(
            [
                quorum_journal(SOURCE, cluster.store_url, labels.CONTENT_TYPE_JSON_LINES),
                quorum_journal(log, cluster.store_url, labels.CONTENT_TYPE_RECOVERY_LOG),
            ]
        )
        await cluster.wait_until(cluster.journals_ready([SOURCE, log], 3, zones_min=2))
        broker = cluster.brokers[0].endpoint.removeprefix("http://")
        consumer = ConsumerProcess(
            [
                *("--app", "examples.word_count:WordCount", "--etcd", cluster.etcd.endpoint),
                *("--root", ROOT, "--zone", "zone-a", "--id", "consumer-1", "--port", "0"),
                *("--broker", broker, "--lease-ttl", str(LEASE_TTL_S)),
                *("--data-dir", str(tmp_path / "consumer")),
            ],
            tmp_path / "consumer.log",
        )
        await consumer.start()
        client = cluster.client()
        try:
            async with ShardClient(consumer.endpoint) as shards:
                await shards.apply([shard_upsert(spec)])
            async with AppendService(client) as appends:
                texts = Texts(appends)
                end = await texts.send(SOURCE, batch("first"))
                await stat_through(consumer, SHARD, {SOURCE: end})

                # Mid-work: the shard has read into this batch, not through it.
                begin = end
                end = await texts.send(SOURCE, batch("second"))
                progress = await stat_through(consumer, SHARD, {SOURCE: (begin + end) // 2})
                print(f"killed at {progress.read_through[SOURCE]} of [{begin}, {end})")
                await consumer.kill()  # kill -9
                end = await texts.send(SOURCE, batch("while-down"))
                await consumer.start()
                end = await texts.send(SOURCE, batch("after"))
            await stat_through(consumer, SHARD, {SOURCE: end})
            served = await query_counts(consumer.endpoint, SHARD, sorted(texts.expected))
            assert served == texts.expected
            assert await read_committed_counts(client, SOURCE, end) == texts.expected
            assert await consumer.terminate() == 0
        finally:
            await consumer.kill()
        assert await logged_counts(client, log, tmp_path / "replayed") == texts.expected
