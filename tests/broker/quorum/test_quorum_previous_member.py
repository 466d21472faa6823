"""The way back of a blocked ensemble change on real brokers (docs/design/quorum.md, "Built
(branch f16-prev)"): four in-process brokers over loopback gRPC, each with its data directory,
on one keyspace (embedded, and a real etcd server); assignments are written as the allocator
writes them.

The double fault the simulation survives since f16-live: a remove-first step {L,X,Y} -> {L,Y}
is claimed (X silent, its replica moved to a fourth broker), and before its election Y, which
stays, loses its disk. {L,Y} then has one voter, so the next claim goes back to {L,X,Y}, which
elects with L and X, but only if X's broker runs a node of the journal, though the journal is
no longer assigned to it. Before this branch it ran none (a broker ran nodes only for its
assigned journals): the journal never elected again. Now X's node runs while the register
names X (the way back settles on {L,X,Y} with X in it), its wish is the allocator's route, and
the move completes ({L,X,Y,spare}, then {L,Y,spare}); then X's node stops, its files kept.

The claim is written into the term register as the leader's coordinator computes it
(`Rules.next_ensemble`) with the three members' brokers down: the state a coordinator leaves
when its broker crashes right after the claim. With the brokers up the same state arises only
through a race (the step decided before Y's loss is known: seeds 5533, 7949, 9439), which a
test cannot order.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from broker_testkit import Cluster

from broker import metrics
from broker.client.route_cache import JournalClient
from broker.keyspace.backend import prefix_end
from broker.keyspace.etcd import EtcdBackend
from broker.protocol import protocol_pb2 as pb
from broker.quorum.register import TermRecord
from broker.quorum.rules import CORRECT_RULES
from broker.quorum_shell.log_file import log_path
from broker.quorum_shell.node import COORDINATOR_SUFFIX, QuorumNode
from broker.quorum_shell.status import decode_response, encode_response, journal_status
from broker.quorum_shell.term_register import KeyspaceTermRegister
from broker.server import Broker
from broker.testing.append_ledger import AppendLedger
from broker.testing.etcd_server import EtcdServer
from broker.topology import DEFAULT_ROOT, assignment_key, format_id, lookup_item
from tests.broker.quorum.quorum_brokers_testkit import (
    broker_name,
    create_quorum_journal,
    start_broker,
    start_brokers,
    term_record,
    until,
)


class EtcdStore:
    """What a test Cluster needs of its store, on a real etcd: a backend per connection."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    def connect(self) -> EtcdBackend:
        return EtcdBackend([self.endpoint], dial_timeout_s=5, request_timeout_s=5)


class AnyCluster(Cluster):
    """broker_testkit's Cluster on any keyspace backend (its `assign` reads the embedded
    store's revision)."""

    async def assign(
        self, journal: str, members: Sequence[Broker], *, value: pb.Route | None = None
    ) -> int:
        prefix = f"{ROOT}/assign/{journal}#".encode()
        existing = await self.admin.range(prefix, prefix_end(prefix))
        wanted = {
            assignment_key(ROOT, journal, b.config.zone, b.config.suffix, slot).encode(): b
            for slot, b in enumerate(members)
        }
        revision = existing.header.revision
        for key in sorted({kv.key for kv in existing.kvs} - set(wanted)):
            header, _ = await self.admin.delete(key)
            revision = header.revision
        for key, broker in wanted.items():
            if key not in {kv.key for kv in existing.kvs}:
                header = await self.admin.put(key, b"", lease=broker.lease_id)
                revision = header.revision
        await self.sync(revision)
        return revision


@pytest.fixture(params=["embedded", pytest.param("etcd", marks=pytest.mark.etcd)])
async def cluster(request: pytest.FixtureRequest) -> AsyncIterator[Cluster]:
    """In-process brokers on the embedded keyspace, or on a real etcd server."""
    async with AsyncExitStack() as stack:
        if request.param == "embedded":
            c = AnyCluster()
        else:
            if shutil.which("etcd") is None:
                pytest.skip("etcd not installed")
            server = await stack.enter_async_context(EtcdServer())
            c = AnyCluster(store=EtcdStore(server.endpoint))  # type: ignore[arg-type]
        try:
            yield c
        finally:
            await c.close()


J = "quorum/previous"
ROOT = DEFAULT_ROOT
# Bound of each wait for the cluster (elections take a few 1-s election timeouts).
wait_s = 30.0
# Attempts of one append while the journal elects, the backoff doubling up to the max.
append_attempts_max = 200
append_backoff_initial_s = 0.02
append_backoff_max_s = 0.2


async def _watch_register(
    b: Broker,
    seen: list[tuple[tuple[str, ...], tuple[str, ...]]],
    records: list[TermRecord],
) -> None:
    """Append each (ensemble, previous) the term register takes, in order, as `b` mirrors it
    (every revision: a register write is one), and each record naming a leader."""
    while True:
        record = term_record(b, J)
        if record is not None and (not seen or seen[-1] != (record.ensemble, record.previous)):
            seen.append((record.ensemble, record.previous))
        if record is not None and record.leader and (not records or records[-1] != record):
            records.append(record)
        await b.ks.wait_for_revision(b.ks.header.revision + 1, wait_s)


@dataclass
class Appends(AppendLedger):
    """The ledger (each attempt a new record, tried once: a failed one may still commit, and a
    retry could commit it twice), and the leader each acknowledgement's header names."""

    served_by: list[str] = field(default_factory=list)

    async def one(self, via: Broker, tag: str) -> None:
        """Append one record of `tag` as a client of broker `via` (any broker: the append is
        proxied to the leader, or the client follows the route it is answered), each attempt
        a new record, until one is acknowledged (an election may be under way)."""
        client = JournalClient(via.endpoint)
        delay = append_backoff_initial_s
        try:
            for _ in range(append_attempts_max):
                resp = await self.try_once(client, self.next_record(tag, width=4))
                if resp is None:
                    await asyncio.sleep(delay)  # a client's backoff, not a synchronisation
                    delay = min(delay * 2, append_backoff_max_s)
                    continue
                route = resp.header.route
                self.served_by.append(format_id(route.members[route.primary]))
                return
        finally:
            await client.close()
        raise AssertionError(f"{tag}: not acknowledged in {append_attempts_max} attempts")


async def test_a_removed_member_keeps_its_node_for_the_way_back(
    cluster: Cluster, tmp_path: Path
) -> None:
    brokers = await start_brokers(cluster, tmp_path, 4)
    spare = brokers[3]
    await create_quorum_journal(cluster, J, brokers[:3])
    appends = Appends(J)
    for b in brokers[:3]:
        await appends.one(b, "before")
    await until(
        "the register settled with a leader",
        lambda: (r := term_record(spare, J)) is not None and bool(r.leader) and r.settled,
    )
    settled = term_record(spare, J)
    assert settled is not None
    index = {broker_name(b): i for i, b in enumerate(brokers)}
    # X is removed, Y loses its disk, L claimed the change. X has the first name: with a log
    # as long as L's it wins the way back's election (ties go to the first name), so the
    # leader is then usually a broker the journal is not assigned to, which appends must
    # still reach and which must move the ensemble on itself.
    x, leader, y = (broker_name(b) for b in brokers[:3])
    item = lookup_item(spare.ks, ROOT, J)
    assert item is not None
    revision = item.kv.create_revision

    # The three members' brokers go down; L's coordinator, leading, had just claimed the
    # remove-first step (X silent, its replica moved to the spare).
    for name in (leader, x, y):
        await cluster.stop_broker(brokers[index[name]])
    wanted = tuple(sorted((leader, y, broker_name(spare))))
    ensemble, previous = CORRECT_RULES.next_ensemble(settled, wanted, frozenset({x}))
    assert (ensemble, previous) == (tuple(sorted((leader, y))), settled.ensemble)
    register = KeyspaceTermRegister(cluster.admin, ROOT, J, settled.ensemble, revision)
    current = await register.read()
    claim = TermRecord(current.record.term + 1, leader + COORDINATOR_SUFFIX, ensemble, "", previous)
    assert (await register.compare_and_swap(current.revision, claim)).ok
    # ... and Y lost its disk.
    shutil.rmtree(tmp_path / f"b{index[y]}")
    for name in (leader, x, y):
        brokers[index[name]] = await start_broker(cluster, tmp_path, index[name])
    b_leader, b_x, b_y = (brokers[index[n]] for n in (leader, x, y))
    seen: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
    leaders: list[TermRecord] = []
    watcher = asyncio.create_task(_watch_register(spare, seen, leaders))
    try:
        await cluster.assign(J, [b_leader, b_y, spare])  # X's replica moved to the spare
        assert J not in b_x.resolver.replicas  # not assigned to X's broker

        # {L,Y} cannot elect (Y is back from a lost disk: no vote until caught up): the next
        # claim goes back to {L,X,Y}, which needs X's node.
        await until(
            "the register went back to the ensemble the change left",
            lambda: (
                (r := term_record(spare, J)) is not None
                and r.ensemble == settled.ensemble
                and r.previous == ensemble
            ),
        )
        await until(
            f"{x}'s broker runs a node of {J}, though not assigned", lambda: J in b_x.quorum.nodes
        )
        node_x = b_x.quorum.nodes[J]
        assert J in b_x.quorum.kept
        labels = {"journal": J, "member": x}
        assert metrics.value_of("gazette_quorum_kept_unassigned", labels) == 1
        status = journal_status(b_x.ks, ROOT, J, node_x)
        assert status.member == x and status.kept
        assert decode_response(encode_response([status]))[J].kept  # as Status answers it

        # The way back elects: appends through any broker the journal is assigned to commit
        # again, after every byte acknowledged before (X may lead: not in the assigned route,
        # it is added to the route the members tell, so appends reach it).
        for b in (b_leader, b_y, spare):
            await appends.one(b, f"after-the-way-back-via-{broker_name(b)}")
        way_back_leader = next(
            (r.leader for r in leaders if r.ensemble == settled.ensemble and r.leader), ""
        )
        if way_back_leader == x:
            # X led while the appends ran (not only once the move had moved the leadership
            # to a broker in the route): an append through an assigned broker reached X.
            assert x in appends.served_by[-3:], (appends.served_by, leaders)

        # The move then completes (the spare in, X out: X is live, so the spare is added first),
        # X's node stops once the register no longer names X, and X's member files stay (an
        # operator removes them).
        moved = tuple(sorted((leader, y, broker_name(spare))))
        await until(
            "the register settled on the moved ensemble",
            lambda: (r := term_record(spare, J)) is not None and r.ensemble == moved and r.settled,
        )
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    # The change went back, then the move went on, one member per term, never a third
    # ensemble beside two that must meet.
    went_back = (settled.ensemble, ensemble)
    assert seen[0] == (ensemble, previous) and went_back in seen, seen
    assert all(set(e) <= {*settled.ensemble, broker_name(spare)} for e, _ in seen), seen
    assert all(len(set(e) ^ set(p)) == 1 for e, p in seen if p), seen
    # Its series go once the node has stopped (after it left `nodes`).
    await until(
        f"{x}'s node stopped",
        lambda: (
            J not in b_x.quorum.nodes
            and metrics.value_of("gazette_quorum_kept_unassigned", labels) == 0
        ),
    )
    assert J not in b_x.quorum.kept
    assert log_path(str(tmp_path / f"b{index[x]}"), J).exists()
    await appends.one(spare, "after-the-move")
    for b in (b_leader, b_y, spare):
        node = b.quorum.nodes[J]

        def knows_commit(n: QuorumNode = node) -> bool:
            return n.commit_offset >= appends.end

        await until(f"{broker_name(b)} knows the commit", knows_commit)
        appends.check(node.read_committed(0), broker_name(b))
