"""A broker's graceful exit, in-process: ``Broker.hand_off`` announces a zero journal limit and
the allocator (run by every broker, as ``gazette serve`` does) moves each journal off it without
leaving it short of synchronised replicas, while appends go on without failing. Also: when no
broker can take its journals, the hand-off ends at once; without an allocator, it times out;
and ``gazette serve``'s exit sequence honours a second signal and allocator failures."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Sequence

import pytest
from broker_testkit import ROOT, Cluster, journal_spec

from broker.allocator import MemberId, broker_is_consistent
from broker.allocator import serve as allocate
from broker.client.appender import append
from broker.client.route_cache import JournalClient
from broker.keyspace.keyspace import KeySpace
from broker.protocol import protocol_pb2 as pb
from broker.serve_cli import _parse_args, _serve_until_exit
from broker.server import Broker
from broker.testing.cluster_state import journals_ready, route_of, wait_until
from broker.topology import (
    Decoded,
    assignment_of,
    journal_assignments,
    local_journals,
    member_key,
    new_keyspace,
)

# Upper bound on any wait (never a synchronisation device).
wait_s = 20.0


@contextlib.asynccontextmanager
async def allocating(brokers: Sequence[Broker]) -> AsyncIterator[list[asyncio.Task[None]]]:
    """Every broker runs the allocator over its own mirror, as ``gazette serve`` does."""
    tasks = [
        asyncio.create_task(
            allocate(
                b.backend,
                b.ks,
                MemberId(b.config.zone, b.config.suffix),
                is_consistent=broker_is_consistent,
                idle_wake_s=1.0,
            )
        )
        for b in brokers
    ]
    try:
        yield tasks
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@contextlib.asynccontextmanager
async def mirror(cluster: Cluster) -> AsyncIterator[KeySpace[Decoded]]:
    ks = new_keyspace(ROOT)
    await ks.load(cluster.admin)
    watch = asyncio.create_task(ks.watch(cluster.admin))
    try:
        yield ks
    finally:
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)


async def test_hand_off_moves_every_journal_keeping_synchronised_replicas(
    cluster: Cluster,
) -> None:
    names = [f"handoff/journal-{i}" for i in range(6)]
    brokers = [
        await cluster.start_broker(zone, suffix)
        for zone, suffix in [
            ("zone-a", "broker-a1"),
            ("zone-a", "broker-a2"),
            ("zone-b", "broker-b1"),
            ("zone-b", "broker-b2"),
        ]
    ]
    async with allocating(brokers), mirror(cluster) as ks:
        for name in names:
            await cluster.put_spec(journal_spec(name, replication=3))
        await wait_until(ks, journals_ready(ks, ROOT, names, 3, zones_min=2), wait_s)
        # The victim is the primary of the most journals.
        primaries = Counter((r := route_of(ks, ROOT, n)).members[r.primary].suffix for n in names)
        victim = next(b for b in brokers if b.config.suffix == primaries.most_common(1)[0][0])

        # Watch every revision: no journal ever has fewer than 3 members, and once the victim
        # has left a journal, every remaining assignment was synchronised (its value is a
        # route the primary advertised after syncing it) and one of them is the primary.
        violations: list[str] = []

        def check() -> None:
            for name in names:
                entries = journal_assignments(ks, ROOT, name)
                route = route_of(ks, ROOT, name)
                if len(route.members) < 3:
                    violations.append(f"{name}: {len(route.members)} members")
                if victim.id not in route.members and (
                    route.primary < 0 or any(assignment_of(e).route is None for e in entries)
                ):
                    violations.append(f"{name}: victim gone before its replacement synced")

        ks.observers.append(check)
        client = JournalClient(next(b for b in brokers if b is not victim).endpoint)
        committed: list[pb.AppendResponse] = []
        stop, progress = asyncio.Event(), [asyncio.Event()]

        async def write(writer: int) -> None:
            seq = 0
            while not stop.is_set():
                journal = names[(writer + seq) % len(names)]
                data = f"{writer}:{seq}\n".encode()
                committed.append(await append(client, pb.AppendRequest(journal=journal), data))
                seq += 1
                progress.append(asyncio.Event())
                progress.pop(0).set()

        async def committed_at_least(n: int) -> None:
            async with asyncio.timeout(wait_s):
                while len(committed) < n:
                    await progress[0].wait()

        async with asyncio.TaskGroup() as tg:  # A failed append fails the test.
            for w in range(4):
                tg.create_task(write(w))
            await committed_at_least(40)
            assert await victim.hand_off(wait_s)
            held_at_exit = local_journals(victim.ks, ROOT, victim.id)
            # Appends go on after the hand-off, to the new primaries.
            await committed_at_least(len(committed) + 40)
            stop.set()
        ks.observers.remove(check)

        assert held_at_exit == {}
        assert violations == []
        key = member_key(ROOT, victim.config.zone, victim.config.suffix).encode()
        (kv,) = (await cluster.admin.range(key)).kvs
        spec = pb.BrokerSpec.FromString(kv.value)
        assert spec.exiting and spec.journal_limit == 0 and kv.lease == victim.lease_id
        await cluster.stop_broker(victim)
        gone = [victim.config.suffix]
        await wait_until(ks, journals_ready(ks, ROOT, names, 3, zones_min=2, exclude=gone), wait_s)
    assert all(r.status == pb.OK for r in committed)
    await client.close()


async def test_hand_off_ends_at_once_when_no_broker_can_take_the_journals(
    cluster: Cluster,
) -> None:
    # Replication 3 over 3 brokers: losing one would leave each journal short of replicas.
    brokers = [await cluster.start_broker(f"zone-{i % 2}", f"broker-{i}") for i in range(3)]
    async with allocating(brokers), mirror(cluster) as ks:
        await cluster.put_spec(journal_spec("handoff/stuck", replication=3))
        await wait_until(ks, journals_ready(ks, ROOT, ["handoff/stuck"], 3), wait_s)
        # Well within the bound: a hand-off that waited for it would return False.
        assert await brokers[0].hand_off(timeout_s=wait_s)
        assert "handoff/stuck" in local_journals(brokers[0].ks, ROOT, brokers[0].id)


async def test_hand_off_times_out_when_nothing_moves_the_journals(cluster: Cluster) -> None:
    a = await cluster.start_broker("zone-a", "broker-a")
    await cluster.start_broker("zone-b", "broker-b")
    spec, _ = await cluster.create(journal_spec("handoff/pinned"), [a])  # No allocator runs.
    assert not await a.hand_off(timeout_s=0.3)
    assert spec.name in local_journals(a.ks, ROOT, a.id)


async def test_serve_exit_sequence(cluster: Cluster) -> None:
    a = await cluster.start_broker("zone-a", "broker-a")
    await cluster.start_broker("zone-b", "broker-b")
    await cluster.create(journal_spec("handoff/pinned"), [a])  # Nothing will move it.

    # A second signal cuts a hand-off that would otherwise wait out its bound.
    stop, hurry = asyncio.Event(), asyncio.Event()
    stop.set()
    hurry.set()
    async with asyncio.timeout(wait_s):
        await _serve_until_exit(a, None, stop, hurry, handoff_timeout_s=3600)

    # An allocator that fails ends serving with its error.
    class Boom(Exception):
        pass

    async def failing() -> None:
        raise Boom()

    allocator = asyncio.ensure_future(failing())
    with pytest.raises(Boom):
        await _serve_until_exit(a, allocator, asyncio.Event(), asyncio.Event(), 1.0)


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--lease-ttl", "0"),
        ("--lease-ttl", "2.5"),
        ("--handoff-timeout", "-1"),
        ("--handoff-timeout", "nan"),
    ],
)
def test_serve_refuses_bad_lease_and_handoff_bounds(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        _parse_args(["serve", flag, value])
    assert f"argument {flag}:" in capsys.readouterr().err


def test_serve_parses_lease_and_handoff_bounds() -> None:
    args = _parse_args(["serve", "--lease-ttl", "3", "--handoff-timeout", "0.5"])
    assert (args.lease_ttl_s, args.handoff_timeout_s) == (3, 0.5)
    defaults = _parse_args(["serve"])
    assert (defaults.lease_ttl_s, defaults.handoff_timeout_s) == (20, 60.0)
