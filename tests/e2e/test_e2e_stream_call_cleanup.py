"""Client-streaming calls leave nothing pending when their peer dies (kill -9, then restart).

grpc.aio feeds a stream call made through an interceptor (auth, etcd's token) from an async
generator consumed by a task of its own. A call that ends on the peer's side (a broker or etcd
killed) leaves that task waiting for a request forever unless the caller finishes the request
side: garbage-collected, asyncio then logs "Task was destroyed but it is pending!" and
"aclose(): asynchronous generator is already running", and nothing reaches the caller.
These tests run the affected APIs (Appender, AppendService, the etcd keyspace's watch and lease
keep-alive) against real processes killed with -9, then collect garbage and assert that no
request-consuming task is left and the loop's exception handler heard nothing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from e2e_workload import journal_spec, requires_etcd

from broker.auth import ForwardingAuthorizer, client_interceptors
from broker.client.append_errors import AppendRetriesExhaustedError
from broker.client.append_service import AppendService
from broker.client.appender import Appender, append
from broker.client.route_cache import ChannelPool, JournalClient
from broker.keyspace.backend import UnavailableError
from broker.keyspace.etcd import EtcdBackend
from broker.protocol import protocol_pb2 as pb
from broker.testing.etcd_server import EtcdServer
from broker.testing.process_cluster import ProcessCluster
from tests.broker.stream_call_testkit import assert_nothing_left, reported_to_loop

pytestmark = [pytest.mark.etcd, requires_etcd]

JOURNAL = "cleanup/appends"
ONE_BROKER = [("zone-a", "broker-a1")]


@pytest.fixture
async def loop_reports() -> AsyncIterator[list[dict[str, Any]]]:
    with reported_to_loop() as reports:
        yield reports


@pytest.fixture
async def cluster() -> AsyncIterator[ProcessCluster]:
    async with ProcessCluster(ONE_BROKER, lease_ttl_s=2) as c:
        await c.apply([journal_spec(JOURNAL, 1, c.store_url)])
        await c.wait_until(c.journals_ready([JOURNAL], 1))
        yield c


def intercepted_client(cluster: ProcessCluster) -> JournalClient:
    # An interceptor that adds nothing still makes grpc.aio feed stream calls from its own
    # async generator, as an authorizing one (GAZETTE_AUTH_TOKEN) does.
    channels = ChannelPool(interceptors=client_interceptors(ForwardingAuthorizer()))
    return JournalClient(cluster.brokers[0].endpoint, channels=channels)


async def test_appends_through_broker_kill_leave_no_pending_stream(
    cluster: ProcessCluster, loop_reports: list[dict[str, Any]]
) -> None:
    broker = cluster.brokers[0]
    client = intercepted_client(cluster)
    try:
        await append(client, pb.AppendRequest(journal=JOURNAL), b"before\n")
        # Appends caught mid-stream by the kill: their calls end on the broker's side.
        open_appenders = [Appender(client, pb.AppendRequest(journal=JOURNAL)) for _ in range(3)]
        for appender in open_appenders:
            await appender.write(b"torn")
        service = AppendService(client, retry_s_max=0.5, backoff_max_s=0.1)
        await cluster.kill(broker)
        for appender in open_appenders:
            with pytest.raises((grpc.aio.AioRpcError, asyncio.InvalidStateError)):
                await appender.write(b" more")
                await appender.commit()
        with pytest.raises(Exception):  # noqa: B017  Any typed failure: the broker is gone.
            await append(client, pb.AppendRequest(journal=JOURNAL), b"lost\n", attempts_max=2)
        async with service:  # Its one failure is awaited here: not raised again at the exit.
            batch = await service.start_append(JOURNAL)
            batch.write(b"service\n")
            batch.release()
            with pytest.raises(AppendRetriesExhaustedError):
                await batch
        assert service.failures == {JOURNAL: 1}
        del open_appenders, service
        await assert_nothing_left(loop_reports)

        await cluster.start_broker(broker)
        await cluster.wait_until(cluster.journals_ready([JOURNAL], 1))
        restarted = JournalClient(broker.endpoint, channels=client.channels)
        await append(restarted, pb.AppendRequest(journal=JOURNAL), b"after\n")
        await assert_nothing_left(loop_reports)
    finally:
        await client.close()


async def test_etcd_watch_and_keepalive_through_etcd_kill_leave_no_pending_stream(
    loop_reports: list[dict[str, Any]],
) -> None:
    async with EtcdServer() as etcd:
        backend = EtcdBackend([etcd.endpoint], dial_timeout_s=0.5, request_timeout_s=1.0)
        try:
            lease, _ = await backend.lease_grant(30)
            assert await backend.lease_keepalive_once(lease) > 0
            put = await backend.put(b"/cleanup/a", b"1", lease=lease)
            watch = backend.watch(b"/cleanup/", b"/cleanup0", start_revision=put.revision)
            first = await anext(watch)
            assert [e.kv.key for e in first.events] == [b"/cleanup/a"]
            reading = asyncio.ensure_future(anext(watch))

            await etcd.kill()
            with pytest.raises(UnavailableError):
                await reading  # The watch's stream broke: a typed error, and the watch ends.
            with pytest.raises(UnavailableError):
                await backend.lease_keepalive_once(lease)
            del watch, reading
            await assert_nothing_left(loop_reports)

            await etcd.start()  # Same ports, same data.
            assert await _keepalive_once_back(backend, lease) > 0
            put = await backend.put(b"/cleanup/b", b"2")
            again = backend.watch(b"/cleanup/", b"/cleanup0", start_revision=put.revision)
            assert [e.kv.key for e in (await anext(again)).events] == [b"/cleanup/b"]
            await again.aclose()
            await assert_nothing_left(loop_reports)
        finally:
            await backend.close()


# How long a caller retries after etcd is back: the channel reconnects on its own back-off
# (etcd_conn.reconnect_backoff_max_ms, 2 s, grown while etcd was down), so the first calls
# may still find it down (found by CI: a 0.5 s dial timeout, two rounds, missed it).
reconnect_wait_s = 15.0


async def _keepalive_once_back(backend: EtcdBackend, lease: int) -> int:
    """`lease_keepalive_once`, retried (bounded) while the backend is UnavailableError, as a
    caller retries it."""
    async with asyncio.timeout(reconnect_wait_s):
        while True:
            try:
                return await backend.lease_keepalive_once(lease)
            except UnavailableError:
                await asyncio.sleep(0.1)  # a caller's back-off, not a synchronisation
