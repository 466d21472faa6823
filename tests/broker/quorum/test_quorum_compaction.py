"""A quorum leader's log compacts from the fragment store: the persisted end of the replica's
fragment index (or, for a leader with no replica on its broker, of the store's listing) is told
to the core (CommitApplier.report_stored), so appends keep going past `log_bytes_max`
(in-process brokers, a file:// store, a small bound)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import grpc
from broker_testkit import Cluster, journal_spec

from broker.fragment.index import FragmentIndex, IndexedFragment
from broker.fragment.spool import LocalFragment
from broker.fragment.spool_file import MemorySpoolFile
from broker.fragment.stores.base import Content, StoreError
from broker.fragment.stores.file_store import FileStore
from broker.fragment.stores.registry import new_registry
from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set
from broker.quorum.register import TermRecord
from broker.quorum_shell.apply import persisted_end
from broker.quorum_shell.node import broker_quorum_config
from broker.server import Broker
from tests.broker.quorum.quorum_brokers_testkit import (
    append_until_ok,
    broker_name,
    term_record,
    until,
)

log_bytes_max = 64 << 10
append_bytes = 4 << 10
# A full log waits for the next store report (every stored_poll_interval_s) and upload.
retry_backoff_max_s = 0.4
retries_max = 60


def test_persisted_end_chains_from_the_floor() -> None:
    def remote(begin: int, end: int) -> IndexedFragment:
        return IndexedFragment(pb.Fragment(journal="j", begin=begin, end=end))

    fragments = [remote(0, 10), remote(10, 30), remote(25, 40), remote(50, 60)]
    assert persisted_end(fragments, 0) == 40  # The gap at 40 stops it.
    assert persisted_end(fragments, 45) == 45  # Nothing chains from 45.
    assert persisted_end(fragments, 50) == 60
    assert persisted_end([], 7) == 7


def test_a_wider_local_fragment_does_not_hide_what_the_store_holds() -> None:
    """Found by audit (2026-11-30): a member re-applying its log from the base rolled one local
    fragment over stored ones; the index's set (which serves reads) keeps the wider fragment
    only, and the persisted end read from it stopped at that fragment's begin: the leader's
    log, never compacted, refused every append as full. The index's persisted fragments hold
    them all."""
    index = FragmentIndex("j")
    stored = [
        pb.Fragment(journal="j", begin=b, end=b + 100, backing_store="file:///s/", mod_time=1)
        for b in range(0, 1000, 100)
    ]
    index.replace_remote(stored)
    index.spool_commit(
        LocalFragment(pb.Fragment(journal="j", begin=450, end=1000), MemorySpoolFile())
    )
    assert [(f.begin, f.end) for f in index.snapshot()][-1] == (450, 1000)  # Serves reads.
    assert persisted_end(index.snapshot(), 400) == 500  # What the set shows: hidden.
    assert persisted_end(index.persisted_fragments(), 400) == 1000
    # A fragment this broker persists joins them, and a listing replaces them.
    index.add_persisted(
        pb.Fragment(journal="j", begin=1000, end=1100, backing_store="file:///s/", mod_time=2)
    )
    assert persisted_end(index.persisted_fragments(), 400) == 1100
    index.replace_remote(stored[:5])
    assert persisted_end(index.persisted_fragments(), 0) == 500


async def _append_with_retry(cluster: Cluster, broker: Broker, journal: str, data: bytes) -> int:
    """Append; a full log (RESOURCE_EXHAUSTED) is retried with a bounded backoff. Returns how
    many refusals it took."""
    delay = 0.02
    for refused in range(retries_max):
        try:
            resp = await cluster.append(broker, journal, [data])
        except grpc.aio.AioRpcError as err:
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
            await asyncio.sleep(delay)  # A client's backoff, not a synchronisation.
            delay = min(delay * 2, retry_backoff_max_s)
            continue
        assert resp.status == pb.OK, pb.Status.Name(resp.status)
        return refused
    raise AssertionError(f"append refused {retries_max} times: the log never compacted")


async def test_appends_go_past_log_bytes_max_as_the_store_catches_up(
    cluster: Cluster, tmp_path: Path
) -> None:
    (tmp_path / "frags").mkdir()
    cluster.stores = new_registry(file_root=tmp_path)
    brokers = [await cluster.start_broker(f"zone-{i}", f"broker-{i}") for i in range(3)]
    small = replace(broker_quorum_config(), log_bytes_max=log_bytes_max)
    for b in brokers:
        b.quorum.quorum_config = small
    spec = journal_spec(
        "quorum/compacting", replication=3, length=16 << 10, stores=["file:///frags/"]
    )
    spec.labels.CopyFrom(label_set([(gl.REPLICATION_MODE, gl.REPLICATION_MODE_QUORUM)]))
    await cluster.create(spec, brokers)
    leader = brokers[0]
    first = None
    async with asyncio.timeout(15):
        while first is None or first.status != pb.OK:
            first = await cluster.append(leader, spec.name, [b"x" * append_bytes])
            # The header names the leader, whether the append was redirected or (from a
            # follower) proxied to it: the appends and checks below are the leader's.
            route = first.header.route
            if route.primary >= 0:
                primary = route.members[route.primary]
                leader = next(b for b in brokers if b.config.suffix == primary.suffix)
    total = append_bytes
    while total <= 4 * log_bytes_max:
        await _append_with_retry(cluster, leader, spec.name, b"y" * append_bytes)
        total += append_bytes
    log = leader.quorum.nodes[spec.name].member.log
    assert log.base.end > 0  # Compacted: the store holds what it dropped.
    assert log.held_bytes <= log_bytes_max
    assert leader.quorum.nodes[spec.name].commit_offset == total


async def test_a_leader_without_a_replica_here_compacts_and_appends_go_on(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The allocator takes the leader's replica away and has no broker to put it on (the route
    is not whole: no ensemble change), so the leader keeps its node, and leads, with no replica
    on its broker (journals.py, `kept`). Its log still compacts: it lists the store itself, and
    the route's primary uploads at once what the leader would have. Before, its log never
    compacted (no index to learn the store's progress from, and followers upload only after
    the persister's 120 s replica delay): appends were refused RESOURCE_EXHAUSTED for good."""
    (tmp_path / "frags").mkdir()
    cluster.stores = new_registry(file_root=tmp_path)
    brokers = [await cluster.start_broker(f"zone-{i}", f"broker-{i}") for i in range(3)]
    spec, record = await _small_log_journal(cluster, brokers, "quorum/kept-leader")
    leader = next(b for b in brokers if broker_name(b) == record.leader)
    await cluster.assign(spec.name, [b for b in brokers if b is not leader])
    assert spec.name in leader.quorum.kept and spec.name not in leader.resolver.replicas

    total = append_bytes
    while total <= 4 * log_bytes_max:
        await _append_with_retry(cluster, leader, spec.name, b"y" * append_bytes)
        total += append_bytes
    node = leader.quorum.nodes[spec.name]
    assert node.is_leader  # the appends above were its own
    assert node.member.log.base.end > 0  # compacted: the store holds what it dropped
    assert node.member.log.held_bytes <= log_bytes_max
    assert node.commit_offset == total


async def _small_log_journal(
    cluster: Cluster, brokers: list[Broker], name: str
) -> tuple[pb.JournalSpec, TermRecord]:
    """A quorum journal of `brokers` (whose logs hold at most `log_bytes_max`) in the
    file:// store, with one append committed: its spec, and its settled term's record."""
    small = replace(broker_quorum_config(), log_bytes_max=log_bytes_max)
    for b in brokers:
        b.quorum.quorum_config = small
    spec = journal_spec(name, replication=3, length=16 << 10, stores=["file:///frags/"])
    spec.labels.CopyFrom(label_set([(gl.REPLICATION_MODE, gl.REPLICATION_MODE_QUORUM)]))
    await cluster.create(spec, brokers)
    await append_until_ok(cluster, brokers[0], spec.name, b"x" * append_bytes)
    await until(
        "the register settled with a leader",
        lambda: (
            (r := term_record(brokers[0], spec.name)) is not None and bool(r.leader) and r.settled
        ),
    )
    record = term_record(brokers[0], spec.name)
    assert record is not None
    return spec, record


class OutageFileStore(FileStore):
    """The file:// store as one broker reaches it: its uploads fail while `down`."""

    down = False

    async def _put(self, key: str, content: Content, content_encoding: str) -> None:
        if self.down:
            raise StoreError(f"{self.url}: down (test)")
        await super()._put(key, content, content_encoding)


async def test_a_new_leader_uploads_what_it_completed_as_a_follower(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Found by audit (2026-11-30; chaos: kill -9 and SIGSTOP of `gazette serve` brokers with
    --data-dir): the leader died before uploading what it had committed; the member elected
    next held that content in fragments it had completed as a follower's, which its persister
    holds for the replica delay (120 s), and nothing made them due when it led (an
    all-replicas primary's pulse expedites them; a quorum journal's pulse does not). The
    store lacked them, the log could not compact past them, and once full it refused every
    append RESOURCE_EXHAUSTED until the delay passed; under restarts (each restart re-applies
    the log as a follower's and starts the delay again) for good."""
    (tmp_path / "frags").mkdir()
    registries = []
    brokers = []
    for i in range(3):
        registry = new_registry(file_root=tmp_path)
        registry.register("file", lambda url: OutageFileStore(url, root=tmp_path))
        registries.append(registry)
        cluster.stores = registry
        brokers.append(await cluster.start_broker(f"zone-{i}", f"broker-{i}", persist_drain_s=1.0))
    spec, record = await _small_log_journal(cluster, brokers, "quorum/new-leader")
    i_old = next(i for i, b in enumerate(brokers) if broker_name(b) == record.leader)
    old = brokers[i_old]
    # The leader's uploads fail from here: the followers hold the only copies outside it.
    store = registries[i_old].get("file:///frags/")
    assert isinstance(store, OutageFileStore)
    store.down = True
    total = append_bytes
    while total < log_bytes_max // 2:
        await _append_with_retry(cluster, old, spec.name, b"y" * append_bytes)
        total += append_bytes
    others = [b for b in brokers if b is not old]
    # Both followers completed fragments of it (held for the replica delay).
    await until(
        "the followers applied it",
        lambda: all(b.quorum.appliers[spec.name].applied == total for b in others),
    )
    await cluster.stop_broker(old)  # Gone with its copy (its drain fails: the store is down).

    await append_until_ok(cluster, others[0], spec.name, b"z" * append_bytes)
    total += append_bytes
    await until(
        "a new leader",
        lambda: (
            (r := term_record(others[0], spec.name)) is not None
            and bool(r.leader)
            and r.leader != record.leader
        ),
    )
    new_record = term_record(others[0], spec.name)
    assert new_record is not None
    leader = next(b for b in others if broker_name(b) == new_record.leader)
    while total <= 4 * log_bytes_max:
        await _append_with_retry(cluster, leader, spec.name, b"w" * append_bytes)
        total += append_bytes
    node = leader.quorum.nodes[spec.name]
    assert node.member.log.base.end > 0  # Compacted: the store holds what it dropped.
    assert node.member.log.held_bytes <= log_bytes_max
    assert node.commit_offset == total
