"""A consumer shard on quorum journals (issue #16): three in-process brokers, the source journal
and the shard's recovery log both labelled gazette.dev/replication-mode=quorum. The recovery
log fences with registers (the recorder checks its author register on every append; a new
primary's hand-off unions its own), which quorum journals now carry in their entries.

Exactly-once counts across a primary restart, and a hot standby that takes over and fences
the old primary, as on all-replicas journals (test_shard_recovery_log.py); then the quorum
leader of the recovery log is stopped mid-run and the shard still counts exactly once."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from broker.client.append_service import AppendService
from broker.client.route_cache import JournalClient
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import labels
from broker.server import Broker
from examples.word_count import WordCount, counts_of
from gazette_consumer.shard_handle import ShardRole
from gazette_consumer.shard_runner import LocalShard, ShardRunner
from gazette_consumer.shard_spec import recovery_log
from gazette_consumer.stores.jsonfile import JSONFileStore
from tests.broker.broker_testkit import Cluster, journal_spec
from tests.gazette_consumer.recovery_testkit import Texts, logged_counts, words_spec
from tests.gazette_consumer.shard_testkit import WAIT_S, Notifier

ROOT = "/test/quorum-shard"
Code = cpb.ReplicaStatus.Code
QUORUM = (labels.REPLICATION_MODE, labels.REPLICATION_MODE_QUORUM)


class QuorumEnv:
    def __init__(self, cluster: Cluster, brokers: list[Broker], client: JournalClient) -> None:
        self.cluster = cluster
        self.brokers = brokers
        self.client = client

    async def journal(self, name: str, content_type: str) -> str:
        spec = journal_spec(name, replication=3)
        spec.labels.CopyFrom(labels.label_set([(labels.CONTENT_TYPE, content_type), QUORUM]))
        await self.cluster.create(spec, self.brokers)
        await self.leader_of(name)
        return name

    async def leader_of(self, journal: str) -> Broker:
        """The broker whose node leads `journal`'s current term, once one does."""
        async with asyncio.timeout(WAIT_S):
            while True:
                nodes = [
                    (b, b.quorum.nodes[journal]) for b in self.brokers if journal in b.quorum.nodes
                ]
                for broker, node in nodes:
                    if node.is_leader and node.coordinator.leader == node.name:
                        return broker
                for _, node in nodes:
                    node.progress.clear()
                waits = [asyncio.ensure_future(n.progress.wait()) for _, n in nodes]
                try:
                    await asyncio.wait(waits, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waits:
                        w.cancel()


@contextlib.asynccontextmanager
async def quorum_env() -> AsyncIterator[QuorumEnv]:
    cluster = Cluster()
    brokers = [await cluster.start_broker(f"zone-{i}", f"broker-{i}") for i in range(3)]
    client = JournalClient(brokers[0].endpoint)
    try:
        yield QuorumEnv(cluster, brokers, client)
    finally:
        await client.close()
        await cluster.close()


def store_of(handle: LocalShard) -> JSONFileStore:
    primary = handle.primary
    assert primary is not None
    store = primary.store
    assert isinstance(store, JSONFileStore)
    return store


async def test_exactly_once_with_a_quorum_source_and_recovery_log(tmp_path: Path) -> None:
    async with quorum_env() as env, AppendService(env.client) as appends:
        source = await env.journal("in/quorum-words", labels.CONTENT_TYPE_JSON_LINES)
        spec = words_spec("shard-quorum", source)
        log = await env.journal(recovery_log(spec), labels.CONTENT_TYPE_RECOVERY_LOG)
        texts, changed = Texts(appends), Notifier()

        async with ShardRunner(WordCount(), env.client, root=ROOT, data_dir=tmp_path) as runner:
            handle = runner.start(spec, on_change=changed.notify)
            end = await texts.send(source, ["the quick fox", "The lazy dog"])
            await changed.read_through(handle, source, end)
            assert counts_of(store_of(handle)) == texts.expected
            await texts.send(source, ["fox again", "and again"])
            await runner.stop(spec.id)
            assert handle.status().code != Code.FAILED

        more = await texts.send(source, ["dog"])
        # A new primary recovers from the quorum recovery log alone.
        async with ShardRunner(WordCount(), env.client, root=ROOT) as runner:
            handle = runner.start(spec, on_change=changed.notify)
            await changed.read_through(handle, source, more)
            assert counts_of(store_of(handle)) == texts.expected

        assert await logged_counts(env.client, log, tmp_path / "check") == texts.expected


async def test_a_standby_takes_over_and_fences_the_old_primary_on_a_quorum_log(
    tmp_path: Path,
) -> None:
    async with quorum_env() as env, AppendService(env.client) as appends:
        source = await env.journal("in/quorum-standby", labels.CONTENT_TYPE_JSON_LINES)
        spec = words_spec("shard-quorum-standby", source)
        spec.hot_standbys = 1
        log = await env.journal(recovery_log(spec), labels.CONTENT_TYPE_RECOVERY_LOG)
        texts, changed = Texts(appends), Notifier()
        async with (
            ShardRunner(WordCount(), env.client, root=ROOT, data_dir=tmp_path / "a") as runner_a,
            ShardRunner(WordCount(), env.client, root=ROOT, data_dir=tmp_path / "b") as runner_b,
        ):
            a = runner_a.start(spec, on_change=changed.notify)
            end = await texts.send(source, ["one two", "two three three"])
            await changed.read_through(a, source, end)
            b = runner_b.start(spec, role=ShardRole.STANDBY, on_change=changed.notify)
            await changed.until(lambda: b.status().code == Code.STANDBY)
            b.promote()  # while the old primary still runs: a zombie
            await changed.until(lambda: b.status().code == Code.PRIMARY)
            assert counts_of(store_of(b)) == texts.expected

            # Both read the next texts; the old primary's commit is fenced by the log's
            # registers, checked by the quorum leader.
            end = await texts.send(source, ["three four"])
            await changed.until(lambda: a.status().code == Code.FAILED)
            assert "FencedError" in a.status().errors[0], a.status().errors
            await changed.read_through(b, source, end)
            assert counts_of(store_of(b)) == texts.expected

            # The recovery log's leader stops mid-run: the two other members elect a new one,
            # whose registers are those of the committed log (the fence holds), and the shard
            # goes on counting exactly once.
            leader = await env.leader_of(log)
            await env.cluster.stop_broker(leader)
            env.brokers.remove(leader)
            new_leader = await env.leader_of(log)
            assert new_leader is not leader
            end = await texts.send(source, ["five five", "six"])
            await changed.read_through(b, source, end)
            assert counts_of(store_of(b)) == texts.expected

        assert await logged_counts(env.client, log, tmp_path / "check") == texts.expected
