"""A journal's max_append_rate, enforced by its primary on real in-process brokers.

The append machine and its stream reader (ChunkReceiver) run with a virtual clock whose sleeps
only advance it, so that the time an append takes is measured exactly, without wall time: a
journal limited to R bytes/s with a burst of B bytes needs at least (size - B) / R seconds for
an append of `size` bytes, and the bucket is the journal's, so a second append pays for the
first. One test goes through the Append RPC on the real clock and checks what the response
reports, not how long it took.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest
from broker_testkit import Cluster, journal_spec, local_content

from broker.append_fsm import AppendFSM, State
from broker.append_rate import burst_bytes_for
from broker.append_receive import ChunkReceiver, FlowControlUnderflowError
from broker.protocol import protocol_pb2 as pb
from broker.server import Broker

J = "rate/journal"
RATE = 1000  # Bytes per second.


class VirtualClock:
    """A monotonic clock that moves only when someone sleeps on it."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)  # Still a suspension point, as a real sleep is.


async def limited_journal(cluster: Cluster, rate: int) -> tuple[Broker, Broker]:
    a = await cluster.start_broker("zone-a", "broker-a", pulse_enabled=False)
    b = await cluster.start_broker("zone-b", "broker-b", pulse_enabled=False)
    spec = journal_spec(J, replication=2)
    spec.max_append_rate = rate
    await cluster.create(spec, [a, b])
    return a, b


async def _stream(chunks: Sequence[bytes]) -> AsyncIterator[pb.AppendRequest]:
    for chunk in chunks:
        yield pb.AppendRequest(content=chunk)
    yield pb.AppendRequest()  # Commit.


async def append_on(
    broker: Broker, clock: VirtualClock, chunks: Sequence[bytes]
) -> tuple[AppendFSM, ChunkReceiver]:
    """One append through ``broker``'s append machine, its stream read on ``clock``."""
    fsm = AppendFSM(broker.append_env, pb.AppendRequest(journal=J))
    receiver = ChunkReceiver(_stream(chunks), clock=clock, sleep=clock.sleep, throttle=fsm.throttle)
    await fsm.run(receiver.recv)
    assert fsm.state is State.FINISHED, (fsm.state, fsm.status, fsm.err)
    return fsm, receiver


async def test_an_append_takes_at_least_its_size_over_the_rate_beyond_the_burst(
    cluster: Cluster,
) -> None:
    a, b = await limited_journal(cluster, RATE)
    burst = burst_bytes_for(RATE)
    chunks = [bytes([i]) * 500 for i in range(10)]
    size = sum(map(len, chunks))
    clock = VirtualClock()

    fsm, receiver = await append_on(a, clock, chunks)

    assert clock.now == pytest.approx((size - burst) / RATE)  # 4 s: exactly the bound.
    assert receiver.delayed_chunks == len(clock.sleeps) == 8  # The burst passed 2 at once.
    commit = fsm.client_fragment
    assert commit is not None and commit.end - commit.begin == size
    # Held back, not dropped: every replica holds exactly the content.
    assert local_content(a, J)[1] == local_content(b, J)[1] == b"".join(chunks)


async def test_the_bucket_is_the_journals_so_the_next_append_pays_for_this_one(
    cluster: Cluster,
) -> None:
    a, _ = await limited_journal(cluster, RATE)
    clock = VirtualClock()
    await append_on(a, clock, [b"x" * burst_bytes_for(RATE)])
    assert clock.now == 0.0  # Exactly the burst: no wait.

    await append_on(a, clock, [b"y" * 1500])
    # A new append does not start with a new bucket: all of it waits.
    assert clock.now == pytest.approx(1500 / RATE)


async def test_rate_zero_means_unlimited(cluster: Cluster) -> None:
    a, b = await limited_journal(cluster, 0)
    clock = VirtualClock()
    chunks = [b"z" * (64 << 10)] * 16  # 1 MiB, far past any burst a rate would allow.
    _, receiver = await append_on(a, clock, chunks)
    assert (clock.now, clock.sleeps, receiver.delayed_chunks) == (0.0, [], 0)
    assert local_content(b, J)[1] == b"".join(chunks)


async def test_throttled_time_is_not_charged_to_the_clients_minimum_rate() -> None:
    clock = VirtualClock()
    receiver = ChunkReceiver(
        _stream([b"x" * 100] * 5),
        min_rate_bytes_per_s=1000,
        burst_s=0.2,  # 200 bytes of credit: 0.2 s of a client's silence would exhaust it.
        clock=clock,
        sleep=clock.sleep,
        throttle=lambda size, now: 5.0,  # The broker holds every chunk back 5 s.
    )
    for _ in range(5):
        req, err = await receiver.recv()
        assert err is None and req is not None and len(req.content) == 100
    assert clock.now == 25.0 and receiver.delayed_chunks == 5

    req, err = await receiver.recv()  # The commit marker (no content: never held back).
    assert err is None and req is not None and not req.content
    assert len(clock.sleeps) == 5
    # A client that is itself slow still runs out of credit.
    clock.now += 0.3
    req, err = await receiver.recv()
    assert req is None and isinstance(err, FlowControlUnderflowError)


async def test_the_append_rpc_reports_its_delayed_chunks(cluster: Cluster) -> None:
    # Real time here, so a small wait: 64 KiB/s with a 64 KiB burst, and 96 KiB appended.
    rate = 64 << 10
    a, b = await limited_journal(cluster, rate)
    chunks = [b"p" * (32 << 10)] * 3
    # Through the replica, which proxies to the primary: the primary enforces the rate.
    for via in (b, a):
        resp = await cluster.append(via, J, chunks)
        assert resp.status == pb.OK
        assert resp.commit.end - resp.commit.begin == 96 << 10
        assert resp.total_chunks == 4  # Three content chunks and the commit marker.
        assert resp.delayed_chunks >= 1
