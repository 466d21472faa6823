"""A mirror of one prefix reaches a revision made by writes outside it (another prefix in the
same store: a consumer group's keys in the brokers' etcd) through progress notifications, on a
real etcd and on the embedded keyspace. Found by the soak: a broker asked to wait for a revision
its prefix never saw timed every request out ("revision N not reached within 10.0s")."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator

import pytest
from structlog.testing import capture_logs

from broker.keyspace.backend import Backend
from broker.keyspace.embedded import EmbeddedStore
from broker.keyspace.etcd import EtcdBackend
from broker.keyspace.keyspace import KeySpace
from broker.testing.etcd_server import EtcdServer

# Far below the wait that failed (10 s), far above a progress round trip.
wait_s = 5.0


@pytest.fixture(params=["embedded", "etcd"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    if request.param == "embedded":
        be: Backend = EmbeddedStore().connect()
        yield be
        await be.close()
        return
    if shutil.which("etcd") is None:
        pytest.skip("etcd not installed: run `make system-deps`")
    async with EtcdServer() as server:
        be = EtcdBackend([server.endpoint], dial_timeout_s=5, request_timeout_s=5)
        yield be
        await be.close()


async def test_a_revision_made_outside_the_prefix_is_reached(backend: Backend) -> None:
    ks: KeySpace[bytes] = KeySpace("/cluster", lambda kv: kv.value)
    first = await backend.put(b"/cluster/a", b"1")
    watching = asyncio.create_task(ks.watch(backend))
    try:
        await ks.wait_for_revision(first.revision, wait_s)  # Loaded.
        assert ks.get("/cluster/a") is not None
        # Writes in another prefix move the store's revision on; the mirror sees no event.
        for i in range(3):
            header = await backend.put(b"/consumers/k%d" % i, b"x")
        assert ks.header.revision < header.revision
        await ks.wait_for_revision(header.revision, wait_s)
        assert ks.header.revision >= header.revision
        assert [e.decoded for e in ks.kvs] == [b"1"]  # Entries unchanged.
        # And events of the prefix still apply after a progress notification.
        later = await backend.put(b"/cluster/b", b"2")
        await ks.wait_for_revision(later.revision, wait_s)
        assert [e.decoded for e in ks.kvs] == [b"1", b"2"]
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)


async def test_concurrent_progress_requests_never_break_the_watch(backend: Backend) -> None:
    # Waiters ask at the same moments: a stream written concurrently fails ("Internal error
    # from Core" on etcd), and every such break restarts the watch.
    ks: KeySpace[bytes] = KeySpace("/cluster", lambda kv: kv.value)
    first = await backend.put(b"/cluster/a", b"1")
    watching = asyncio.create_task(ks.watch(backend))

    async def ask() -> None:
        for _ in range(100):
            await backend.request_watch_progress()
            await asyncio.sleep(0)

    async def write() -> None:
        for i in range(100):
            await backend.put(b"/cluster/k%d" % (i % 5), b"x")
            await backend.put(b"/consumers/k%d" % (i % 5), b"x")

    try:
        await ks.wait_for_revision(first.revision, wait_s)
        with capture_logs() as logs:
            await asyncio.gather(ask(), ask(), ask(), write())
            last = await backend.put(b"/consumers/last", b"x")
            await asyncio.gather(*(ks.wait_for_revision(last.revision, wait_s) for _ in range(50)))
        assert not [log for log in logs if "watch interrupted" in log["event"]]
        assert not watching.done()
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)


async def test_a_waiter_cancelled_while_asking_for_progress_never_breaks_the_watch(
    backend: Backend,
) -> None:
    # grpc.aio cancels a whole stream when a write to it is cancelled: a waiter whose own
    # timeout (or cancellation) landed while its progress request was being written ended the
    # watch of every waiter of the process (found by the soak: the mirror stopped, "watch ended
    # at revision N, before revision N+1").
    ks: KeySpace[bytes] = KeySpace("/cluster", lambda kv: kv.value)
    first = await backend.put(b"/cluster/a", b"1")
    watching = asyncio.create_task(ks.watch(backend))
    try:
        await ks.wait_for_revision(first.revision, wait_s)
        # An event through the watch: its stream is open.
        opened = await backend.put(b"/cluster/open", b"0")
        await ks.wait_for_revision(opened.revision, wait_s)
        for turns in range(4):
            asking = asyncio.create_task(backend.request_watch_progress())
            for _ in range(turns):
                await asyncio.sleep(0)  # The request is being written ...
            asking.cancel()  # ... when its caller goes.
            await asyncio.gather(asking, return_exceptions=True)
        later = await backend.put(b"/cluster/b", b"2")
        await ks.wait_for_revision(later.revision, wait_s)
        assert [e.decoded for e in ks.kvs] == [b"1", b"2", b"0"]
        assert not watching.done()
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
