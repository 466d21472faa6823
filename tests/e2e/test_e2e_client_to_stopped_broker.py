"""Clients fail over from a SIGSTOPped broker: a reader blocked at the write head, an append in
flight, and an append that must open a new connection to it (docs/reliability.md, "A client's
call to a SIGSTOPped broker").

Real `gazette serve` processes over real etcd, a 3-s lease. A journal of replication 1 is
served by broker A; one JournalClient (default broker B, as a consumer shard's: it reads the
journal with a RetryReader, as the shard's read-ahead does, and appends through an
AppendService) has learnt the journal's route, naming A, and reads from A directly. A is
SIGSTOPped: its sockets stay open, so no connection is refused or reset and nothing arrives.

- A plain Reader's stalled stream ends with UNAVAILABLE (retried, by re-resolving the route)
  within one keepalive interval and ping timeout (client channels' HTTP/2 keepalive,
  broker/grpc_transport.py). Before keepalive it waited forever.
- An append through another client whose cached route names A, on a new connection (the old
  one is gone), fails over within the channels' connect timeout plus the lease: the handshake
  with the stopped broker gives up, the client asks its default broker. Before, gRPC's 20-s
  default.
- A's lease expires, the allocator moves the journal to B; the AppendService's append (sent to
  A on the stalled connection) commits through B, and the RetryReader (re-routed to B) delivers
  both appends, within keepalive + lease + a retry back-off of the stop.
- A RetryReader whose client knows no broker but A (its default endpoint) cannot fail over: out
  of attempts (the stalled call, then a new connection's handshake), it raises UNAVAILABLE.

Before client keepalive, the first check waited forever (the test fails at its bound); without
the connect timeout, the second took gRPC's 20 s.

The same at the consumer's level: a shard (the counting app, SQLite store, in this process)
whose source journal's broker is SIGSTOPped while the shard waits at its write head consumes
a message appended after the journal moved, within the same bound. Before, it never did.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import TypeVar

import grpc
import pytest
from e2e_workload import journal_spec, requires_etcd

from broker.client.append_service import AppendService
from broker.client.appender import append
from broker.client.reader import Reader
from broker.client.rerouting_reader import reroutes
from broker.client.retry_reader import RetryReader
from broker.client.retry_reader import backoff_max_s as read_backoff_max_s
from broker.client.route_cache import JournalClient
from broker.grpc_transport import (
    client_connect_timeout_s,
    client_keepalive_time_s,
    client_keepalive_timeout_s,
)
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import labels
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import OffsetNotYetAvailableError
from broker.testing.process_cluster import BrokerProcess, ProcessCluster
from gazette_consumer.message import CONTENT_TYPE_JSON_LINES
from gazette_consumer.shard_runner import ShardRunner
from tests.gazette_consumer.consumer_testkit import Group
from tests.gazette_consumer.shard_testkit import (
    CountingApp,
    Producer,
    read_counts,
    shard_spec,
    sqlite_engine,
)

pytestmark = [pytest.mark.etcd, requires_etcd]

T = TypeVar("T")

JOURNAL = "client/stopped"
SHARD = "shard-of-stopped"
TWO_BROKERS = [("zone-a", "broker-a1"), ("zone-b", "broker-b1")]
LEASE_TTL_S = 3
# Scheduling on a shared machine, an etcd round trip or two.
slack_s = 3.0
# A call stalled on the stopped broker fails within this: one keepalive interval, one ping
# timeout.
stalled_call_bound_s = client_keepalive_time_s + client_keepalive_timeout_s + slack_s
# An append that must connect to the stopped broker fails over within this: the handshake's
# timeout, then (if the journal has not moved yet) the lease.
new_connection_bound_s = client_connect_timeout_s + LEASE_TTL_S + slack_s
# From the stop, the reader delivers what was appended through the journal's new broker within
# this: the stalled read fails (keepalive), the lease expires and the journal moves, the reader
# retries after at most its longest back-off.
failover_bound_s = (
    client_keepalive_time_s
    + client_keepalive_timeout_s
    + LEASE_TTL_S
    + read_backoff_max_s
    + slack_s
)
# Attempts of a RetryReader whose client knows no broker but the stopped one: the stalled
# call, then a new connection that never completes its handshake. It gives up within this.
lone_attempts_max = 2
lone_bound_s = (
    client_keepalive_time_s
    + client_keepalive_timeout_s
    + client_connect_timeout_s
    + read_backoff_max_s
    + slack_s
)
# Waiting for the client's connection to A, before the stop.
connect_wait_s = 10.0


@pytest.fixture
async def cluster() -> AsyncIterator[ProcessCluster]:
    async with ProcessCluster(TWO_BROKERS, lease_ttl_s=LEASE_TTL_S) as c:
        yield c


async def _within(what: str, bound_s: float, awaitable: Awaitable[T]) -> T:
    """`awaitable`'s result, failing the test (rather than hanging) after `bound_s` (what is
    left of a bound: at once if it is spent)."""
    try:
        return await asyncio.wait_for(awaitable, max(0.0, bound_s))
    except TimeoutError:
        pytest.fail(f"{what}: still waiting after {bound_s:.1f} s")


async def _append_one(service: AppendService, data: bytes) -> pb.AppendResponse:
    aa = await service.start_append(JOURNAL)
    aa.write(data)
    aa.release()
    return await aa


async def _read_until(reader: RetryReader, end: int) -> bytes:
    out = bytearray()
    while reader.offset < end:
        out += (await reader.read_chunk()).content
    return bytes(out)


async def test_readers_and_appends_fail_over_from_a_stopped_broker(
    cluster: ProcessCluster,
) -> None:
    await cluster.apply([journal_spec(JOURNAL, 1, cluster.store_url)])
    await cluster.wait_until(cluster.journals_ready([JOURNAL], 1))
    stopped = cluster.primary(JOURNAL)
    assert stopped is not None
    survivor = next(b for b in cluster.brokers if b is not stopped)
    route_before = cluster.route(JOURNAL)
    loop = asyncio.get_running_loop()

    # The shard's client: its default broker is the survivor (any broker proxies; its answer
    # teaches the route, which names the stopped broker), then it reads from A directly.
    client = cluster.client(survivor)
    # The survivor may not have seen the journal yet (the mirror that found it ready is this
    # test's own): the first read carries the revision to read through, as a client that had
    # applied the journal would (the broker waits for it; without it, JOURNAL_NOT_FOUND).
    seen = cluster.ks.header
    through = pb.Header(
        route=pb.Route(primary=-1),
        etcd=pb.Header.Etcd(cluster_id=seen.cluster_id, revision=seen.revision),
    )
    with pytest.raises(OffsetNotYetAvailableError):
        await Reader(
            client, pb.ReadRequest(journal=JOURNAL, block=False, header=through)
        ).read_chunk()
    assert client.endpoint_for(JOURNAL, require_primary=False) == stopped.endpoint
    head = pb.ReadRequest(journal=JOURNAL, offset=0, block=True)
    plain = Reader(client, head)
    plain_read = asyncio.create_task(plain.read_chunk())
    retrying = RetryReader(client, head)
    first_chunks = asyncio.create_task(retrying.read_chunk())
    # Both Read calls are on the client's connection to A once it is up.
    await asyncio.wait_for(client.channels.get(stopped.endpoint).channel_ready(), connect_wait_s)

    # A client that knows no broker but A (its default): its RetryReader, out of attempts,
    # raises the stalled call's typed error instead of waiting.
    lone = JournalClient(stopped.endpoint)
    lone_reader = RetryReader(lone, head, attempts_max=lone_attempts_max)
    lone_read = asyncio.create_task(lone_reader.read_chunk())
    await asyncio.wait_for(lone.channels.get(stopped.endpoint).channel_ready(), connect_wait_s)

    # Another client, whose cached route names A, without a connection to it yet.
    fresh = JournalClient(survivor.endpoint)
    fresh.routes.update(JOURNAL, route_before)

    cluster.pause(stopped)  # SIGSTOP: sockets open, nothing answered, lease not renewed.
    stopped_at = loop.time()
    tasks = [plain_read, first_chunks, lone_read]
    try:
        async with AppendService(client) as service:
            # Sent to A (the route names it), on the connection the reads are stalled on.
            published = asyncio.create_task(_append_one(service, b"published after the stop\n"))
            tasks.append(published)

            # The plain Reader's stream ends, typed and retryable (by a new route).
            with pytest.raises(grpc.aio.AioRpcError) as stalled:
                await _within("the stalled Read", stalled_call_bound_s, plain_read)
            stalled_s = loop.time() - stopped_at
            assert stalled.value.code() is grpc.StatusCode.UNAVAILABLE, (
                f"{stalled.value.code()} after {stalled_s:.1f} s: {stalled.value.details()}"
            )
            assert reroutes(stalled.value)

            # A new connection to A never completes its handshake: the append gives up on it
            # and goes through the client's default broker, to wherever the journal is.
            started = loop.time()
            direct = await _within(
                "the append on a new connection",
                new_connection_bound_s,
                append(fresh, pb.AppendRequest(journal=JOURNAL), b"appended after the stop\n"),
            )
            assert direct.header.process_id.suffix == survivor.suffix, direct.header
            fresh_s = loop.time() - started

            publish = await _within(
                "the published append",
                failover_bound_s - (loop.time() - stopped_at),
                published,
            )
            assert publish.header.process_id.suffix == survivor.suffix, publish.header

            with pytest.raises(grpc.aio.AioRpcError) as exhausted:
                await _within(
                    "the lone RetryReader",
                    lone_bound_s - (loop.time() - stopped_at),
                    lone_read,
                )
            assert exhausted.value.code() is grpc.StatusCode.UNAVAILABLE, exhausted.value

        # The journal moved to the survivor; the RetryReader, re-routed there, delivers both.
        end = max(direct.commit.end, publish.commit.end)
        first = await _within(
            "the RetryReader's first chunk",
            failover_bound_s - (loop.time() - stopped_at),
            first_chunks,
        )
        assert first.offset == 0
        rest = await _within(
            "the RetryReader",
            failover_bound_s - (loop.time() - stopped_at),
            _read_until(retrying, end),
        )
        delivered_s = loop.time() - stopped_at
    finally:
        cluster.resume(stopped)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await retrying.close()
        await lone_reader.close()
        await lone.close()
        await fresh.close()

    content = first.content + rest
    for response, data in (
        (direct, b"appended after the stop\n"),
        (publish, b"published after the stop\n"),
    ):
        assert content[response.commit.begin : response.commit.end] == data
    assert retrying.restarts >= 1
    route = client.routes.get(JOURNAL)
    assert route is not None and route.members[route.primary].suffix == survivor.suffix, route
    print(
        f"stalled read failed after {stalled_s:.1f} s; new-connection append {fresh_s:.1f} s;"
        f" delivered {delivered_s:.1f} s after the stop"
    )


async def _learn_route(client: JournalClient, stopped: BrokerProcess) -> None:
    """`client` (whose default broker is not `stopped`) learns the journal's route, naming
    `stopped`, from a non-blocking read its default broker proxies; then it connects to it."""
    with pytest.raises(OffsetNotYetAvailableError):
        await Reader(client, pb.ReadRequest(journal=JOURNAL, block=False)).read_chunk()
    assert client.endpoint_for(JOURNAL, require_primary=False) == stopped.endpoint
    await asyncio.wait_for(client.channels.get(stopped.endpoint).channel_ready(), connect_wait_s)


async def test_a_shard_keeps_consuming_after_its_sources_broker_is_stopped(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    source = journal_spec(JOURNAL, 1, cluster.store_url)
    source.labels.CopyFrom(labels.label_set([(labels.CONTENT_TYPE, CONTENT_TYPE_JSON_LINES)]))
    await cluster.apply([source])
    await cluster.wait_until(cluster.journals_ready([JOURNAL], 1))
    stopped = cluster.primary(JOURNAL)
    assert stopped is not None
    survivor = next(b for b in cluster.brokers if b is not stopped)
    loop = asyncio.get_running_loop()
    # The consumer's client reads the source straight from A (as once it learnt the route).
    client = cluster.client(survivor)
    await _learn_route(client, stopped)
    group = await Group.open()
    try:
        async with sqlite_engine(tmp_path) as engine:
            app = CountingApp(engine)
            async with ShardRunner(app, client, root="/test/stopped-source") as runner:
                await group.join("zone-a", "consumer-a", start_shard=runner.start_shard)
                await group.put_shard(shard_spec(SHARD, [JOURNAL]))

                def serving() -> str | None:
                    status = runner.statuses().get(SHARD)
                    code = status.code if status is not None else None
                    return None if code == cpb.ReplicaStatus.PRIMARY else f"{SHARD}: {status}"

                # Primary: reading its source from offset 0, the empty journal's write head.
                await group.until(serving)
                cluster.pause(stopped)
                stopped_at = loop.time()
                try:
                    # A producer whose client has no route: its default broker proxies, then
                    # (once the journal moved to it) serves.
                    async with AppendService(cluster.client(survivor)) as appends:
                        await (await Producer(appends, "p").committed(JOURNAL, "after-the-stop"))
                    await _within(
                        "the shard consuming the message",
                        failover_bound_s - (loop.time() - stopped_at),
                        app.events.until(lambda: bool(app.consumed_total and app.finishes)),
                    )
                    await app.finishes[0]
                    consumed_s = loop.time() - stopped_at
                finally:
                    cluster.resume(stopped)
                assert await read_counts(engine, SHARD) == {"after-the-stop": 1}
                status = runner.statuses().get(SHARD)
                assert status is not None and status.code == cpb.ReplicaStatus.PRIMARY, status
                await group.nodes[0].member.stop(graceful=False)
    finally:
        await group.close()
    print(f"the shard consumed the message {consumed_s:.1f} s after the stop")
