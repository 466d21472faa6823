"""A restarted broker serves nothing before it knows the cluster (issue #12): real etcd, two
``gazette serve`` processes; one is killed with SIGKILL and restarted at once with the same ID,
on the same gRPC port, with an HTTP port.

Until its predecessor's lease has expired, the restarted broker cannot announce itself, so it
has not loaded the keyspace: every RPC to it must answer UNAVAILABLE saying it is starting (a
client retries that), and ``/debug/ready`` answers 503. It must never answer as a broker that
knows no journal (an empty List, JOURNAL_NOT_FOUND), nor refuse a request proxied to it by the
other broker with "etcd cluster ID ... is not ours (0)". Meanwhile appends through the other
broker to a journal whose primary (by the old lease) is the restarted one are retried until
the journal has moved, and none fails. Once ready, List through it shows every journal.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import aiohttp
import grpc
import grpc.aio
import pytest
from e2e_workload import journal_spec, requires_etcd

from broker.client.appender import Appender, append
from broker.client.list_apply import list_journals
from broker.client.route_cache import JournalClient
from broker.protocol import protocol_pb2 as pb
from broker.protocol import protocol_pb2_grpc as pbg
from broker.protocol.status import GazetteError, JournalNotFoundError
from broker.testing.ports import free_port
from broker.testing.process_cluster import BrokerProcess, ProcessCluster, ProcessClusterError

pytestmark = [pytest.mark.etcd, requires_etcd]

# Long enough that the restarted process binds its port well before its predecessor's lease
# expires (the window under test), short enough for a quick test.
LEASE_TTL_S = 6
BROKERS = [("z1", "broker-1"), ("z1", "broker-2")]
NAMES = [f"ready/journal-{i}" for i in range(6)]
# How long the restarted process may take to bind its port, and then to become ready.
bind_wait_s = 30.0
ready_bound_s = LEASE_TTL_S + 30.0
# Appends through the surviving broker while the victim restarts: attempts each, with
# append()'s own backoff, enough to outlast the predecessor's lease and the re-assignment.
append_attempts_max = 25
STARTING = "starting"
# Pause between two rounds of probes of the starting broker.
probe_interval_s = 0.2


class FixedPortCluster(ProcessCluster):
    """A ProcessCluster whose brokers can be (re)started on ports the test chooses."""

    def __init__(self, brokers: list[tuple[str, str]], **kwargs: object) -> None:
        super().__init__(brokers, **kwargs)  # type: ignore[arg-type]
        self.base_args = list(self.extra_args)
        self.ports: dict[str, tuple[int, int]] = {}

    async def start_broker(self, b: BrokerProcess) -> None:
        ports = self.ports.get(b.suffix)
        extra = ["--port", str(ports[0]), "--http-port", str(ports[1])] if ports else []
        # Read by the base class before its first await: only this broker gets them.
        self.extra_args = [*self.base_args, *extra]
        await super().start_broker(b)


@pytest.fixture
async def cluster() -> AsyncIterator[FixedPortCluster]:
    async with FixedPortCluster(BROKERS, lease_ttl_s=LEASE_TTL_S) as c:
        yield c


def _is_starting(err: BaseException) -> bool:
    return (
        isinstance(err, grpc.aio.AioRpcError)
        and err.code() == grpc.StatusCode.UNAVAILABLE
        and STARTING in (err.details() or "")
    )


async def _probe(stub: pbg.JournalStub, client: JournalClient) -> bool:
    """Probe every kind of RPC once; True if each answered "starting", False if each answered
    as a broker that is ready. Anything else fails the test."""
    answers: list[bool] = []
    try:
        listing = await list_journals(client, timeout_s=10)
    except grpc.aio.AioRpcError as err:
        assert _is_starting(err), f"List: {err.code()} {err.details()}"
        answers.append(True)
    else:
        assert sorted(j.spec.name for j in listing.journals) == NAMES
        answers.append(False)
    try:
        responses = [r async for r in stub.Read(pb.ReadRequest(journal=NAMES[0], block=False))]
    except grpc.aio.AioRpcError as err:
        assert _is_starting(err), f"Read: {err.code()} {err.details()}"
        answers.append(True)
    else:
        assert responses and responses[0].status != pb.JOURNAL_NOT_FOUND, responses
        answers.append(False)
    fragments = pb.FragmentsRequest(journal=NAMES[0])
    try:
        listed = await stub.ListFragments(fragments, timeout=10)
    except grpc.aio.AioRpcError as err:
        assert _is_starting(err), f"ListFragments: {err.code()} {err.details()}"
        answers.append(True)
    else:
        assert listed.status == pb.OK, pb.Status.Name(listed.status)
        answers.append(False)
    appender = Appender(client, pb.AppendRequest(journal=NAMES[0]))
    try:
        await appender.commit()  # An empty append: it writes nothing.
    except grpc.aio.AioRpcError as err:
        assert _is_starting(err), f"Append: {err.code()} {err.details()}"
        answers.append(True)
    except GazetteError as err:
        # Ready, the journal not yet re-assigned its second replica: a retriable answer.
        assert err.retriable and not isinstance(err, JournalNotFoundError), err
        answers.append(False)
    else:
        answers.append(False)
    # The broker turns ready between two probes at most once.
    assert answers == sorted(answers, reverse=True), answers
    return answers[-1]


async def _ready_status(http: aiohttp.ClientSession, url: str) -> int:
    async with http.get(f"{url}/debug/ready") as resp:
        return resp.status


async def test_restarted_broker_answers_unavailable_until_it_knows_the_cluster(
    cluster: FixedPortCluster,
) -> None:
    await cluster.apply(journal_spec(n, 2, cluster.store_url) for n in NAMES)
    await cluster.wait_until(cluster.journals_ready(NAMES, 2))
    victim = cluster.broker("broker-2")
    survivor = cluster.broker("broker-1")
    # Journals whose primary is the victim: the survivor proxies their appends to it.
    proxied = [n for n in NAMES if cluster.primary(n) is victim]
    assert proxied, "the allocator gave broker-2 no primary"

    port = int(victim.endpoint.rsplit(":", 1)[1])
    http_port = free_port()
    cluster.ports[victim.suffix] = (port, http_port)
    await cluster.kill(victim)
    restart = asyncio.create_task(cluster.start_broker(victim))

    # Appends through the survivor, to the victim's journals, all along the restart.
    via_survivor = cluster.client(survivor)
    appended: list[pb.AppendResponse] = []

    async def append_through_survivor() -> None:
        for seq in range(4):
            for journal in proxied:
                appended.append(
                    await append(
                        via_survivor,
                        pb.AppendRequest(journal=journal),
                        f"{journal} {seq}\n".encode(),
                        attempts_max=append_attempts_max,
                    )
                )

    appending = asyncio.create_task(append_through_survivor())
    restarted = JournalClient(f"127.0.0.1:{port}")
    channel = grpc.aio.insecure_channel(
        f"127.0.0.1:{port}",
        options=[("grpc.initial_reconnect_backoff_ms", 50), ("grpc.max_reconnect_backoff_ms", 200)],
    )
    stub = pbg.JournalStub(channel)
    gateway = f"http://127.0.0.1:{http_port}"
    starting_seen = 0
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            # The new process binds its port (the gateway's first) long before it can announce.
            await asyncio.wait_for(channel.channel_ready(), bind_wait_s)
            deadline = time.monotonic() + ready_bound_s
            while not restart.done():
                assert time.monotonic() < deadline, "the restarted broker never turned ready"
                ready_before = await _ready_status(http, gateway)
                starting = await _probe(stub, restarted)
                ready_after = await _ready_status(http, gateway)
                if starting:
                    starting_seen += 1
                    # Not ready before the RPCs were refused as starting.
                    assert ready_before == 503
                else:
                    # Serving: ready by now.
                    assert ready_after == 200
                # Paces the probes; the loop ends on the restart's own event (it serves).
                await asyncio.wait([restart], timeout=probe_interval_s)
            await restart  # It printed "serving on": ready.
            assert await _ready_status(http, gateway) == 200
        assert starting_seen >= 1, "never caught the restarted broker starting"
        assert not await _probe(stub, restarted)
        await cluster.wait_until(cluster.journals_ready(NAMES, 2), ready_bound_s)
        listing = await list_journals(restarted)
        assert sorted(j.spec.name for j in listing.journals) == NAMES
        await asyncio.wait_for(appending, ready_bound_s)
        assert len(appended) == 4 * len(proxied)
        assert all(r.status == pb.OK for r in appended)
        for journal in NAMES:
            response = await append(restarted, pb.AppendRequest(journal=journal), b"after\n")
            assert response.status == pb.OK
    finally:
        appending.cancel()
        restart.cancel()
        await asyncio.gather(appending, restart, return_exceptions=True)
        await channel.close()
        await restarted.close()


# The lease the restarted broker waits out in the next test: far longer than it may take to exit.
LONG_LEASE_TTL_S = 60
exit_bound_s = 15.0


async def test_a_broker_asked_to_exit_while_it_starts_exits_at_once() -> None:
    async with ProcessCluster([("z1", "broker-1")], lease_ttl_s=LONG_LEASE_TTL_S) as cluster:
        victim = cluster.broker("broker-1")
        port = int(victim.endpoint.rsplit(":", 1)[1])
        cluster.extra_args = ["--port", str(port)]  # The same port: we know when it binds.
        await cluster.kill(victim)
        restart = asyncio.create_task(cluster.start_broker(victim))
        channel = grpc.aio.insecure_channel(
            f"127.0.0.1:{port}",
            options=[
                ("grpc.initial_reconnect_backoff_ms", 50),
                ("grpc.max_reconnect_backoff_ms", 200),
            ],
        )
        try:
            # Bound, and waiting out its predecessor's lease (a minute) before it can announce.
            await asyncio.wait_for(channel.channel_ready(), bind_wait_s)
            assert not restart.done()
            code, took_s = await cluster.terminate(victim, timeout_s=exit_bound_s)
            assert code == 0, victim.log_tail()
            assert took_s < exit_bound_s
            with pytest.raises(ProcessClusterError):
                await restart  # It never served.
            assert "stopped while starting" in victim.log_tail()
        finally:
            restart.cancel()
            await asyncio.gather(restart, return_exceptions=True)
            await channel.close()
