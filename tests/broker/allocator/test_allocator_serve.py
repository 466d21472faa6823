"""The allocator shell end to end: members announce themselves under leases (BrokerSpecs, over
the broker's own keyspace decoder), each runs ``serve``, and the leader converges 100 journals.
Against the embedded keyspace, and against a real etcd when one is installed."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import pytest
from google.protobuf.duration_pb2 import Duration

from broker.allocator import (
    Assignment,
    Item,
    MemberId,
    MemberNotFoundError,
    RoundReport,
    TooManyFailuresError,
    broker_is_consistent,
    serve,
)
from broker.keyspace.backend import (
    Backend,
    Compare,
    CompareResult,
    CompareTarget,
    LeaseNotFoundError,
    Op,
    OpPut,
    TxnResponse,
    UnavailableError,
)
from broker.keyspace.embedded import EmbeddedBackend, EmbeddedStore
from broker.keyspace.keyspace import Entry, KeySpace
from broker.protocol import protocol_pb2 as pb
from broker.topology import Assignment as TopologyAssignment
from broker.topology import (
    Decoded,
    advertised_value,
    assign_prefix,
    assignment_of,
    item_key,
    member_key,
    new_keyspace,
    route_from_assignments,
)

ROOT = "/gazette/cluster"
# Upper bound on any wait for convergence (never a synchronisation device).
wait_s = 30.0
poll_s = 0.01
polls_max = int(wait_s / poll_s)

Backends = Callable[[], Awaitable[Backend]]


def journal_spec(name: str, replication: int) -> pb.JournalSpec:
    return pb.JournalSpec(
        name=name,
        replication=replication,
        fragment=pb.JournalSpec.Fragment(
            length=1 << 20, compression_codec=pb.NONE, refresh_interval=Duration(seconds=1)
        ),
    )


def broker_spec(m: MemberId, limit: int, *, exiting: bool = False) -> pb.BrokerSpec:
    return pb.BrokerSpec(
        process_spec=pb.ProcessSpec(
            id=pb.ProcessSpec.ID(zone=m.zone, suffix=m.suffix), endpoint="http://127.0.0.1:8080"
        ),
        journal_limit=limit,
        exiting=exiting,
    )


@dataclass
class Node:
    """One member process: its own backend client, lease, keyspace mirror and allocator."""

    member: MemberId
    backend: Backend
    lease: int
    ks: KeySpace[Decoded]
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    reports: list[RoundReport] = field(default_factory=list)
    # Set when the test makes the member go (its allocator is then expected to stop).
    gone: bool = False

    @property
    def serving(self) -> asyncio.Task[None]:
        return self.tasks[1]


@dataclass
class Cluster:
    connect: Backends
    admin: Backend
    nodes: dict[MemberId, Node] = field(default_factory=dict)

    async def add_journals(self, n: int, replication: int) -> None:
        for i in range(n):
            name = f"example/journal-{i:03d}"
            spec = journal_spec(name, replication)
            await self.admin.put(item_key(ROOT, name).encode(), spec.SerializeToString())

    async def join(
        self,
        name: str,
        limit: int,
        is_consistent: Callable[[Item, Assignment, Sequence[Assignment]], bool],
    ) -> Node:
        zone, suffix = name.split("#")
        m = MemberId(zone, suffix)
        backend = await self.connect()
        lease, _ = await backend.lease_grant(60)
        header = await backend.put(
            member_key(ROOT, zone, suffix).encode(),
            broker_spec(m, limit).SerializeToString(),
            lease,
        )
        ks = new_keyspace(ROOT)
        await ks.load(backend)
        await ks.wait_for_revision(header.revision, wait_s)
        node = Node(m, backend, lease, ks)
        node.tasks.append(asyncio.create_task(ks.watch(backend)))
        node.tasks.append(
            asyncio.create_task(
                serve(
                    backend,
                    ks,
                    m,
                    is_consistent=is_consistent,
                    idle_wake_s=1.0,
                    observer=node.reports.append,
                )
            )
        )
        self.nodes[m] = node
        return node

    def raise_failures(self) -> None:
        """Fail fast if an allocator that should be running stopped."""
        for node in self.nodes.values():
            if node.serving.done() and not node.gone:
                node.serving.result()  # Raises its error, if any.
                raise AssertionError(f"{node.member}: serve returned unexpectedly")

    async def leave(self, node: Node) -> None:
        """The member's lease is revoked: its key and assignments vanish in one revision."""
        node.gone = True
        await self.admin.lease_revoke(node.lease)

    async def close(self) -> None:
        for node in self.nodes.values():
            for task in node.tasks:
                task.cancel()
            for task in node.tasks:
                with contextlib.suppress(asyncio.CancelledError, MemberNotFoundError):
                    await task
            await node.backend.close()
        await self.admin.close()


async def wait_until(check: Callable[[], str | None], cluster: Cluster) -> None:
    """Poll until ``check()`` finds nothing wrong (returns None); fail with what was wrong, or
    as soon as an allocator fails. Polling, because some conditions (a leader's idle round)
    come with no keyspace change to wait for."""
    problem: str | None = "never checked"
    for _ in range(polls_max):
        cluster.raise_failures()
        problem = check()
        if problem is None:
            return
        await asyncio.sleep(poll_s)
    raise AssertionError(f"after {wait_s}s: {problem}")


def journal_assignments(ks: KeySpace[Decoded]) -> dict[str, list[TopologyAssignment]]:
    out: dict[str, list[TopologyAssignment]] = {}
    for entry in ks.search(assign_prefix(ROOT)):
        a = entry.decoded
        assert isinstance(a, TopologyAssignment)
        out.setdefault(a.journal, []).append(a)
    return out


def converged(
    ks: KeySpace[Decoded], journals: int, replicas: int, zones: set[str]
) -> Callable[[], str | None]:
    def check() -> str | None:
        by_journal = journal_assignments(ks)
        if len(by_journal) != journals:
            return f"{len(by_journal)} of {journals} journals assigned"
        for name, group in by_journal.items():
            if len(group) != replicas:
                return f"{name}: {len(group)} replicas, want {replicas}"
            if {a.zone for a in group} != zones:
                return f"{name}: zones {sorted({a.zone for a in group})}"
            if sorted(a.slot for a in group) != list(range(replicas)):
                return f"{name}: slots {sorted(a.slot for a in group)}"
        return None

    return check


def primaries(ks: KeySpace[Decoded]) -> Counter[str]:
    return Counter(
        f"{a.zone}#{a.suffix}"
        for group in journal_assignments(ks).values()
        for a in group
        if a.slot == 0
    )


def always_consistent(item: Item, a: Assignment, all_assignments: Sequence[Assignment]) -> bool:
    del item, a, all_assignments
    return True


# --- Backends -------------------------------------------------------------------------------------


@pytest.fixture
async def embedded() -> AsyncIterator[Backends]:
    store = EmbeddedStore()

    async def connect() -> Backend:
        return EmbeddedBackend(store)

    yield connect


@pytest.fixture
async def etcd() -> AsyncIterator[Backends]:
    if shutil.which("etcd") is None:
        pytest.skip("etcd not installed: run `make system-deps`")
    from broker.keyspace.etcd import EtcdBackend
    from broker.testing.etcd_server import EtcdServer

    async with EtcdServer() as server:

        async def connect() -> Backend:
            return EtcdBackend([server.endpoint], dial_timeout_s=5, request_timeout_s=5)

        yield connect


async def run_hundred_journals_then_lose_the_leader(connect: Backends) -> None:
    cluster = Cluster(connect, await connect())
    try:
        a1 = await cluster.join("zone-a#broker-A1", 100, always_consistent)
        await cluster.join("zone-a#broker-A2", 100, always_consistent)
        b1 = await cluster.join("zone-b#broker-B1", 100, always_consistent)
        await cluster.add_journals(100, replication=3)

        # 300 replicas on 3 members of limit 100: every journal on every member, and the
        # primaries spread evenly (the leader picks each new primary on the member with fewest).
        await wait_until(converged(b1.ks, 100, 3, {"zone-a", "zone-b"}), cluster)
        assert sorted(primaries(b1.ks).values()) == [33, 33, 34]
        # Only the leader (the first member to announce) acted, and it went idle.
        leader = cluster.nodes[MemberId("zone-a", "broker-A1")]
        await wait_until(lambda: None if leader.reports[-1].idle else "leader busy", cluster)
        assert leader.reports[-1].applied == 0
        assert all(not n.reports for n in cluster.nodes.values() if n is not leader)

        # The leader goes: its key and assignments vanish; it stops, and the next member in
        # line (A2, the next to announce) re-establishes a primary for each of its journals.
        await cluster.leave(a1)
        with pytest.raises(MemberNotFoundError):
            async with asyncio.timeout(wait_s):
                await a1.serving
        await wait_until(converged(b1.ks, 100, 2, {"zone-a", "zone-b"}), cluster)
        assert sum(primaries(b1.ks).values()) == 100

        # A new member joins: every journal is back to three replicas across both zones.
        await cluster.join("zone-a#broker-A3", 100, always_consistent)
        await wait_until(converged(b1.ks, 100, 3, {"zone-a", "zone-b"}), cluster)
        assert not cluster.nodes[MemberId("zone-a", "broker-A2")].serving.done()
    finally:
        await cluster.close()


async def test_hundred_journals_converge_and_survive_losing_the_leader(embedded: Backends) -> None:
    await run_hundred_journals_then_lose_the_leader(embedded)


@pytest.mark.etcd
async def test_hundred_journals_against_real_etcd(etcd: Backends) -> None:
    await run_hundred_journals_then_lose_the_leader(etcd)


# --- Consistency end to end: simulated primaries advertise routes --------------------------------


async def advertise_routes(backend: Backend, ks: KeySpace[Decoded]) -> None:
    """Play every journal's primary: once its assignments change, write the new route into each
    of them (as a primary does after synchronising its replicas), guarded by the key's mod
    revision so that a stale write never lands."""
    while True:
        revision = ks.header.revision
        by_journal: dict[str, list[Entry[Decoded]]] = {}
        for entry in ks.search(assign_prefix(ROOT)):
            assert isinstance(entry.decoded, TopologyAssignment)
            by_journal.setdefault(entry.decoded.journal, []).append(entry)
        for group in by_journal.values():
            route = route_from_assignments(assignment_of(e) for e in group)
            if route.primary < 0:
                continue  # No primary, nobody to advertise.
            value = advertised_value(route)
            for entry in group:
                if entry.kv.value != value:
                    compare = Compare(
                        entry.kv.key, CompareTarget.MOD, CompareResult.EQUAL, entry.kv.mod_revision
                    )
                    # A lost race is fine: the next change brings another pass.
                    await backend.txn([compare], [OpPut(entry.kv.key, value, entry.kv.lease)])
        await ks.wait_for_revision(revision + 1, wait_s)


async def test_draining_member_hands_over_only_consistent_replicas(embedded: Backends) -> None:
    cluster = Cluster(embedded, await embedded())
    advertiser: asyncio.Task[None] | None = None

    async def stop_advertising() -> None:
        if advertiser is not None:
            advertiser.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await advertiser

    try:
        await cluster.add_journals(30, replication=2)
        await cluster.join("zone-a#broker-A1", 100, broker_is_consistent)
        a2 = await cluster.join("zone-a#broker-A2", 100, broker_is_consistent)
        b1 = await cluster.join("zone-b#broker-B1", 100, broker_is_consistent)
        leader = cluster.nodes[MemberId("zone-a", "broker-A1")]
        advertiser = asyncio.create_task(advertise_routes(cluster.admin, b1.ks))
        await wait_until(converged(b1.ks, 30, 2, {"zone-a", "zone-b"}), cluster)
        on_a2 = {
            j
            for j, g in journal_assignments(b1.ks).items()
            if any(a.suffix == "broker-A2" for a in g)
        }
        assert on_a2

        # The primaries stop advertising, then A2 announces it is exiting (limit zero).
        await stop_advertising()
        a2.gone = True  # Its allocator will return once drained.
        spec = broker_spec(a2.member, 100, exiting=True)
        await cluster.admin.put(
            member_key(ROOT, "zone-a", "broker-A2").encode(), spec.SerializeToString(), a2.lease
        )

        def replacements_added_and_leader_idle() -> str | None:
            by_journal = journal_assignments(b1.ks)
            for journal in on_a2:
                if {a.suffix for a in by_journal[journal]} != {
                    "broker-A1",
                    "broker-A2",
                    "broker-B1",
                }:
                    return f"{journal}: no replacement yet"
            return None if leader.reports and leader.reports[-1].idle else "leader busy"

        # A1 takes over each of A2's journals, but nothing of A2 goes: the new routes are not
        # advertised, so no journal has more consistent replicas than it needs.
        await wait_until(replacements_added_and_leader_idle, cluster)
        assert leader.reports[-1].plan.deferred_removals == len(on_a2)
        assert not a2.serving.done()

        # Advertising resumes: A2's replicas go, and once it holds nothing its allocator returns.
        advertiser = asyncio.create_task(advertise_routes(cluster.admin, b1.ks))
        async with asyncio.timeout(wait_s):
            await a2.serving  # Returns without error: drained.
        await wait_until(converged(b1.ks, 30, 2, {"zone-a", "zone-b"}), cluster)
        members = {a.suffix for g in journal_assignments(b1.ks).values() for a in g}
        assert members == {"broker-A1", "broker-B1"}
    finally:
        await stop_advertising()
        await cluster.close()


# --- Failures and bounds -------------------------------------------------------------------------


class RefusingBackend(EmbeddedBackend):
    """A backend whose transactions fail: their compares (``error`` None) or with an error,
    for the first ``failures`` attempts."""

    def __init__(self, store: EmbeddedStore, failures: int, error: Exception | None = None) -> None:
        super().__init__(store)
        self.failures = failures
        self.error = error
        self.attempts = 0

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResponse:
        self.attempts += 1
        if self.attempts <= self.failures:
            if self.error is not None:
                raise self.error
            never = Compare(b"/nonexistent", CompareTarget.VERSION, CompareResult.GREATER, 0)
            return await super().txn([never, *compares], success, failure)
        return await super().txn(compares, success, failure)


async def one_member(store: EmbeddedStore, backend: Backend, journals: int) -> KeySpace[Decoded]:
    m = MemberId("zone-a", "broker-A1")
    lease, _ = await backend.lease_grant(60)
    await backend.put(
        member_key(ROOT, m.zone, m.suffix).encode(), broker_spec(m, 10).SerializeToString(), lease
    )
    for i in range(journals):
        spec = journal_spec(f"example/j{i}", 1)
        await backend.put(item_key(ROOT, spec.name).encode(), spec.SerializeToString())
    ks = new_keyspace(ROOT)
    await ks.load(backend)
    return ks


async def test_persistent_transaction_failures_end_serve() -> None:
    store = EmbeddedStore()
    backend = RefusingBackend(store, failures=1000)
    ks = await one_member(store, backend, journals=2)
    reports: list[RoundReport] = []
    with pytest.raises(TooManyFailuresError, match="3 consecutive rounds"):
        await serve(
            backend,
            ks,
            MemberId("zone-a", "broker-A1"),
            is_consistent=always_consistent,
            txn_failures_max=3,
            idle_wake_s=0.01,
            observer=reports.append,
        )
    assert backend.attempts == 3
    assert [(r.failed, r.applied) for r in reports] == [(True, 0)] * 3
    await backend.close()


@pytest.mark.parametrize("error", [None, UnavailableError("etcd away"), LeaseNotFoundError(7)])
async def test_transient_transaction_failures_are_retried(error: Exception | None) -> None:
    store = EmbeddedStore()
    backend = RefusingBackend(store, failures=2, error=error)
    ks = await one_member(store, backend, journals=2)
    reports: list[RoundReport] = []
    async with asyncio.TaskGroup() as tg:
        watch = tg.create_task(ks.watch(backend))
        await serve(
            backend,
            ks,
            MemberId("zone-a", "broker-A1"),
            is_consistent=always_consistent,
            idle_wake_s=0.01,
            rounds_max=4,
            observer=reports.append,
        )
        watch.cancel()
    assert [r.failed for r in reports] == [True, True, False, False]
    assert reports[2].applied == 1 and reports[3].idle
    assert len(journal_assignments(ks)) == 2
    await backend.close()


async def test_serve_needs_the_member_key() -> None:
    store = EmbeddedStore()
    backend = EmbeddedBackend(store)
    ks = await one_member(store, backend, journals=0)
    with pytest.raises(MemberNotFoundError, match="zone-a#nobody"):
        await serve(backend, ks, MemberId("zone-a", "nobody"), is_consistent=always_consistent)
    with pytest.raises(ValueError, match="txn_failures_max"):
        await serve(
            backend,
            ks,
            MemberId("zone-a", "broker-A1"),
            is_consistent=always_consistent,
            txn_failures_max=0,
        )
    await backend.close()


async def test_a_member_that_is_not_leader_does_nothing() -> None:
    store = EmbeddedStore()
    backend = EmbeddedBackend(store)
    ks = await one_member(store, backend, journals=3)
    other = MemberId("zone-b", "broker-B1")
    lease, _ = await backend.lease_grant(60)
    header = await backend.put(
        member_key(ROOT, other.zone, other.suffix).encode(),
        broker_spec(other, 10).SerializeToString(),
        lease,
    )
    await ks.load(backend)
    assert ks.header.revision == header.revision
    reports: list[RoundReport] = []
    # Not the leader (broker-A1 announced first): no rounds, so rounds_max never ends it; the
    # idle wake-ups just re-check.
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await serve(
                backend,
                ks,
                other,
                is_consistent=always_consistent,
                idle_wake_s=0.01,
                rounds_max=1,
                observer=reports.append,
            )
    assert reports == []
    assert journal_assignments(ks) == {}
    await backend.close()
