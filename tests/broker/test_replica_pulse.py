"""The primary's pulse daemon: a failed pulse is retried after a short, bounded back-off, not
at the next pulse interval (60 s). Found by the soak: after a broker restarted, a primary whose
pulse had failed against it (the peer still starting, "replica stopping") left its journal's
new route unadvertised for a minute, so the allocator could not finish moving the journal and
consumers waited on it."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable

from broker_testkit import ROOT, Cluster, journal_spec

from broker.append_pulse import pulse
from broker.fragment.spool_file import MemorySpoolFile
from broker.protocol import protocol_pb2 as pb
from broker.replica import (
    PulseResult,
    Replica,
    ReplicaEnv,
    pulse_retry_backoff_initial_s,
    pulse_retry_backoff_max_s,
    pulse_retry_delay_s,
)
from broker.topology import assignment_key, member_key

# Far below the pulse interval, far above the back-off of the first few retries.
prompt_s = 5.0


def _replica(pulse: Callable[[str], Awaitable[PulseResult]], interval_s: float) -> Replica:
    return Replica(
        "a/journal",
        ReplicaEnv(
            lookup_spec=lambda _: None,
            new_spool_file=MemorySpoolFile,
            stores=None,
            persister=None,
            pulse=pulse,
            clock=time.time,
            pulse_interval_s=interval_s,
        ),
    )


async def test_a_failed_pulse_is_retried_before_the_next_interval() -> None:
    calls: list[float] = []
    third = asyncio.Event()

    async def pulse(journal: str) -> PulseResult:
        assert journal == "a/journal"
        calls.append(time.monotonic())
        if len(calls) == 3:
            third.set()
        return PulseResult(ok=len(calls) >= 3, invalidated=None)  # Two failures, then ok.

    replica = _replica(pulse, interval_s=60.0)
    serving = asyncio.create_task(replica.serve())
    try:
        async with asyncio.timeout(prompt_s):
            await third.wait()
        assert len(calls) == 3
    finally:
        replica.stop()
        await serving


async def test_a_pulse_that_timed_out_is_retried_before_the_next_interval() -> None:
    calls = 0
    second = asyncio.Event()
    hang = asyncio.Event()

    async def pulse(_: str) -> PulseResult:
        nonlocal calls
        calls += 1
        if calls == 1:
            await hang.wait()  # Abandoned at the interval.
        second.set()
        return PulseResult(ok=True, invalidated=None)

    replica = _replica(pulse, interval_s=1.0)
    serving = asyncio.create_task(replica.serve())
    try:
        started = time.monotonic()
        async with asyncio.timeout(prompt_s):
            await second.wait()
        # The interval (the timeout), then a short back-off: not a second interval on top.
        assert time.monotonic() - started < 1.0 + pulse_retry_backoff_initial_s * 2 + 0.5
    finally:
        replica.stop()
        await serving


def test_the_retry_delay_doubles_up_to_its_bound_and_never_past_the_interval() -> None:
    assert pulse_retry_delay_s(0, 60.0) == 60.0
    assert pulse_retry_delay_s(1, 60.0) == pulse_retry_backoff_initial_s
    assert pulse_retry_delay_s(2, 60.0) == 2 * pulse_retry_backoff_initial_s
    assert pulse_retry_delay_s(50, 60.0) == pulse_retry_backoff_max_s
    assert pulse_retry_delay_s(50, 1.0) == 1.0


async def test_a_pulse_fails_against_an_unreachable_peer_and_waits_for_nothing_else() -> None:
    cluster = Cluster()
    try:
        a = await cluster.start_broker("zone-a", "broker-a", pulse_enabled=False)
        b = await cluster.start_broker("zone-b", "broker-b", pulse_enabled=False)
        await cluster.create(journal_spec("x/ok", replication=2), [a, b])
        await cluster.create(journal_spec("x/short", replication=3), [a, b])
        assert (await pulse(a.append_env, "x/ok")).ok  # Committed.
        assert (await pulse(b.append_env, "x/ok")).ok  # Not the primary.
        # Too few brokers: only a route change helps, and it invalidates the resolution.
        short = await pulse(a.append_env, "x/short")
        assert short.ok and short.invalidated is not None

        # A peer whose member key says it listens where nothing does (a broker restarting).
        lease, _ = await cluster.admin.lease_grant(30)
        ghost = pb.BrokerSpec(
            process_spec=pb.ProcessSpec(
                id=pb.ProcessSpec.ID(zone="zone-c", suffix="ghost"),
                endpoint=f"http://127.0.0.1:{_closed_port()}",
            ),
            journal_limit=100,
        )
        await cluster.admin.put(
            member_key(ROOT, "zone-c", "ghost").encode(), ghost.SerializeToString(), lease=lease
        )
        await cluster.put_spec(journal_spec("x/peer-down", replication=2))
        revision = 0
        for slot, (zone, suffix, lease_id) in enumerate(
            [("zone-a", "broker-a", a.lease_id), ("zone-c", "ghost", lease)]
        ):
            key = assignment_key(ROOT, "x/peer-down", zone, suffix, slot).encode()
            revision = (await cluster.admin.put(key, b"", lease=lease_id)).revision
        await cluster.sync(revision)
        failed = await pulse(a.append_env, "x/peer-down")
        assert not failed.ok
    finally:
        await cluster.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
