"""EtcdBackend against a real etcd process: error mapping, watch headers and breaks, leases,
endpoint fail-over, and the keep-alive loop."""

from __future__ import annotations

import asyncio
import shutil
import socket
from collections.abc import AsyncIterator

import grpc
import pytest

from broker.keyspace.backend import (
    Backend,
    CompactedError,
    Compare,
    CompareResult,
    CompareTarget,
    EventType,
    FutureRevisionError,
    LeaseNotFoundError,
    OpDelete,
    OpGet,
    OpPut,
    UnavailableError,
    WatchResponse,
    prefix_end,
)
from broker.keyspace.conformance import check_keyspace
from broker.keyspace.etcd import EndpointError, EtcdBackend, EtcdError, parse_endpoint
from broker.keyspace.lease import keep_lease_alive
from broker.testing.etcd_server import EtcdServer

pytestmark = pytest.mark.etcd

# Upper bound on any single wait in these tests (never a synchronisation device).
wait_s = 15.0


@pytest.fixture
async def etcd() -> AsyncIterator[EtcdServer]:
    if shutil.which("etcd") is None:
        pytest.skip("etcd not installed: run `make system-deps`")
    async with EtcdServer() as server:
        yield server


@pytest.fixture
async def backend(etcd: EtcdServer) -> AsyncIterator[EtcdBackend]:
    be = EtcdBackend([etcd.endpoint], dial_timeout_s=5, request_timeout_s=5)
    yield be
    await be.close()


def _unused_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


async def _next(it: AsyncIterator[WatchResponse]) -> WatchResponse:
    async with asyncio.timeout(wait_s):
        return await anext(it)


# -- Endpoints --------------------------------------------------------------------------------


def test_parse_endpoint() -> None:
    assert parse_endpoint("http://10.0.0.1:2379/") == "10.0.0.1:2379"
    assert parse_endpoint("localhost:2379") == "localhost:2379"
    assert parse_endpoint("https://10.0.0.1:2379") == "10.0.0.1:2379"
    with pytest.raises(EndpointError, match="expected host:port, http:// or https://"):
        parse_endpoint("unix:///run/etcd.sock")
    with pytest.raises(EndpointError, match="expected host:port"):
        parse_endpoint("10.0.0.1")
    assert parse_endpoint("http://[::1]:2379") == "[::1]:2379"
    # A malformed host or port is refused here, naming it, rather than dialled (it ended as
    # "cannot reach etcd" seconds later).
    for bad in ("http://[::1", "::1:2379", "[::1:2379", "[]:2379", "a b:2379"):
        with pytest.raises(EndpointError, match="expected host:port"):
            parse_endpoint(bad)
    with pytest.raises(EndpointError, match=r"port must be in \[0, 65535\]"):
        parse_endpoint("localhost:65536")
    with pytest.raises(EndpointError, match="non-empty list"):
        EtcdBackend([])
    with pytest.raises(EndpointError, match="non-empty list"):
        EtcdBackend("127.0.0.1:2379")


async def test_fails_over_from_a_dead_endpoint(etcd: EtcdServer) -> None:
    be = EtcdBackend([_unused_endpoint(), etcd.endpoint], dial_timeout_s=0.3)
    try:
        header = await be.put(b"k", b"v")
        assert (await be.range(b"k")).kvs[0].value == b"v"
        it = be.watch(b"k", start_revision=header.revision)
        assert (await _next(it)).events[0].kv.value == b"v"
        await it.aclose()
        # Once on the live endpoint, calls stay there.
        assert be.preferred_endpoint == etcd.endpoint
    finally:
        await be.close()


async def test_watch_fails_over_from_a_dead_endpoint(etcd: EtcdServer) -> None:
    be = EtcdBackend([_unused_endpoint(), etcd.endpoint], dial_timeout_s=0.3)
    writer = EtcdBackend([etcd.endpoint])
    try:
        header = await writer.put(b"k", b"v")
        it = be.watch(b"k", start_revision=header.revision)
        assert (await _next(it)).events[0].kv.value == b"v"
        await it.aclose()
        assert be.preferred_endpoint == etcd.endpoint
    finally:
        await be.close()
        await writer.close()


async def test_unavailable_when_every_endpoint_is_dead() -> None:
    be = EtcdBackend([_unused_endpoint(), _unused_endpoint()], dial_timeout_s=0.2)
    try:
        with pytest.raises(UnavailableError, match=r"not connected within 0\.2s"):
            await be.range(b"k")
        with pytest.raises(UnavailableError):
            await be.put(b"k", b"v")
        with pytest.raises(UnavailableError):
            await anext(be.watch(b"k"))
    finally:
        await be.close()


async def test_reconnects_after_restart(etcd: EtcdServer, backend: EtcdBackend) -> None:
    await backend.put(b"k", b"1")
    await etcd.restart()
    # The channel re-dials within the dial timeout; the data survived in the data dir.
    assert (await backend.range(b"k")).kvs[0].value == b"1"
    await backend.put(b"k", b"2")


async def test_mutation_during_outage_raises_unavailable(etcd: EtcdServer) -> None:
    be = EtcdBackend([etcd.endpoint], dial_timeout_s=0.2)
    try:
        await be.put(b"k", b"1")
        await etcd.kill()
        with pytest.raises(UnavailableError):
            await be.put(b"k", b"2")
        await etcd.start()
        assert (await be.range(b"k")).kvs[0].value == b"1"
    finally:
        await be.close()


# -- KV and errors ----------------------------------------------------------------------------


async def test_put_range_delete_and_headers(backend: EtcdBackend) -> None:
    h1 = await backend.put(b"a/1", b"x")
    h2 = await backend.put(b"a/2", b"y")
    h3 = await backend.put(b"a/1", b"z")
    assert h2.revision == h1.revision + 1 and h3.revision == h2.revision + 1
    assert h1.cluster_id != 0 and h1.member_id != 0 and h1.raft_term >= 1

    resp = await backend.range(b"a/", prefix_end(b"a/"))
    assert resp.header.revision == h3.revision
    assert [(kv.key, kv.value, kv.version) for kv in resp.kvs] == [
        (b"a/1", b"z", 2),
        (b"a/2", b"y", 1),
    ]
    first = resp.kvs[0]
    assert (first.create_revision, first.mod_revision) == (h1.revision, h3.revision)

    old = await backend.range(b"a/1", revision=h1.revision)
    assert old.kvs[0].value == b"x"
    assert (await backend.range(b"a/3")).kvs == ()

    header, deleted = await backend.delete(b"a/", prefix_end(b"a/"))
    assert (header.revision, deleted) == (h3.revision + 1, 2)
    # Deleting nothing does not advance the revision.
    header, deleted = await backend.delete(b"a/1")
    assert (header.revision, deleted) == (h3.revision + 1, 0)


async def test_txn_branches_and_results(backend: EtcdBackend) -> None:
    h = await backend.put(b"t/a", b"1")
    ok = await backend.txn(
        [Compare(b"t/a", CompareTarget.MOD, CompareResult.EQUAL, h.revision)],
        [OpPut(b"t/b", b"2"), OpGet(b"t/", prefix_end(b"t/")), OpDelete(b"t/a")],
        [OpPut(b"t/failed", b"")],
    )
    assert ok.succeeded and ok.header.revision == h.revision + 1
    assert ok.results[0] is None
    got = ok.results[1]
    assert isinstance(got, tuple) and [kv.key for kv in got] == [b"t/a", b"t/b"]
    assert ok.results[2] == 1

    failed = await backend.txn(
        [Compare(b"t/b", CompareTarget.VALUE, CompareResult.NOT_EQUAL, b"2")],
        [OpPut(b"t/x", b"")],
        [OpGet(b"t/b")],
    )
    assert not failed.succeeded and failed.header.revision == ok.header.revision
    got = failed.results[0]
    assert isinstance(got, tuple) and got[0].value == b"2"


async def test_bad_requests_are_typed_errors(backend: EtcdBackend) -> None:
    with pytest.raises(TypeError, match=r"compares\[0\].value: VALUE compares take bytes"):
        await backend.txn([Compare(b"k", CompareTarget.VALUE, CompareResult.EQUAL, 1)], [])
    with pytest.raises(TypeError, match=r"compares\[0\].value: MOD compares take int"):
        await backend.txn([Compare(b"k", CompareTarget.MOD, CompareResult.EQUAL, b"1")], [])
    with pytest.raises(EtcdError, match="key is not provided") as info:
        await backend.put(b"", b"v")
    assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT


async def test_revision_errors(backend: EtcdBackend) -> None:
    for i in range(5):
        header = await backend.put(b"r", str(i).encode())
    current = header.revision
    with pytest.raises(FutureRevisionError):
        await backend.range(b"r", revision=current + 10)
    with pytest.raises(FutureRevisionError):
        await backend.compact(current + 10)

    await backend.compact(current - 1)
    with pytest.raises(CompactedError) as info:
        await backend.range(b"r", revision=current - 2)
    assert (info.value.requested, info.value.compact_revision) == (current - 2, current - 1)
    # Reading at the compact revision itself is still allowed.
    assert (await backend.range(b"r", revision=current - 1)).kvs[0].value == b"3"
    with pytest.raises(CompactedError) as info:
        await backend.compact(current - 1)
    assert info.value.compact_revision == current - 1


# -- Watches ----------------------------------------------------------------------------------


async def test_watch_groups_events_by_revision(backend: EtcdBackend) -> None:
    start = (await backend.put(b"w/a", b"1")).revision
    txn = await backend.txn([], [OpPut(b"w/b", b"2"), OpPut(b"w/c", b"3")])
    deleted, _ = await backend.delete(b"w/a")
    await backend.put(b"other", b"ignored")

    it = backend.watch(b"w/", prefix_end(b"w/"), start_revision=start)
    seen: list[tuple[EventType, bytes, int]] = []
    revisions_per_response: list[set[int]] = []
    while len(seen) < 4:
        resp = await _next(it)
        # Catching up, etcd reports its current revision in the header.
        assert resp.header.revision >= deleted.revision
        seen += [(e.type, e.kv.key, e.kv.mod_revision) for e in resp.events]
        revisions_per_response.append({e.kv.mod_revision for e in resp.events})
    await it.aclose()

    assert seen == [
        (EventType.PUT, b"w/a", start),
        (EventType.PUT, b"w/b", txn.header.revision),
        (EventType.PUT, b"w/c", txn.header.revision),
        (EventType.DELETE, b"w/a", deleted.revision),
    ]
    # Both puts of the txn arrive in the same response.
    assert any({txn.header.revision} <= revs for revs in revisions_per_response)


async def test_watch_from_compacted_revision(backend: EtcdBackend) -> None:
    for i in range(4):
        header = await backend.put(b"c", str(i).encode())
    await backend.compact(header.revision)
    it = backend.watch(b"c", start_revision=header.revision - 2)
    with pytest.raises(CompactedError) as info:
        await _next(it)
    assert (info.value.requested, info.value.compact_revision) == (
        header.revision - 2,
        header.revision,
    )
    # From the compact revision itself, the watch works.
    it = backend.watch(b"c", start_revision=header.revision)
    assert (await _next(it)).events[0].kv.value == b"3"
    await it.aclose()


async def test_watch_breaks_on_restart_and_resumes(etcd: EtcdServer, backend: EtcdBackend) -> None:
    start = (await backend.put(b"k", b"1")).revision
    it = backend.watch(b"k", start_revision=start)
    last = (await _next(it)).header.revision
    await etcd.restart()
    with pytest.raises(UnavailableError, match="etcd Watch"):
        await _next(it)
    await backend.put(b"k", b"2")
    it = backend.watch(b"k", start_revision=last + 1)
    assert (await _next(it)).events[0].kv.value == b"2"
    await it.aclose()


async def test_watch_ends_when_backend_closes(etcd: EtcdServer) -> None:
    be = EtcdBackend([etcd.endpoint])
    start = (await be.put(b"k", b"1")).revision
    it = be.watch(b"k", start_revision=start)
    await _next(it)

    async def drain() -> int:
        return len([resp async for resp in it])

    reader = asyncio.create_task(drain())
    await be.close()
    async with asyncio.timeout(wait_s):
        assert await reader == 0
    # Watches on a closed backend end at once; other calls fail.
    assert [resp async for resp in be.watch(b"k")] == []
    with pytest.raises(UnavailableError, match="backend is closed"):
        await be.range(b"k")


# -- Leases -----------------------------------------------------------------------------------


async def test_lease_keepalive_and_revoke(backend: EtcdBackend) -> None:
    lease, ttl = await backend.lease_grant(30)
    assert ttl == 30
    assert await backend.lease_keepalive_once(lease) == 30
    await backend.put(b"leased", b"v", lease=lease)
    assert (await backend.range(b"leased")).kvs[0].lease == lease

    await backend.lease_revoke(lease)
    assert (await backend.range(b"leased")).kvs == ()
    with pytest.raises(LeaseNotFoundError) as info:
        await backend.lease_keepalive_once(lease)
    assert info.value.lease_id == lease
    with pytest.raises(LeaseNotFoundError):
        await backend.lease_revoke(lease)
    with pytest.raises(LeaseNotFoundError):
        await backend.put(b"leased", b"v", lease=lease)
    with pytest.raises(LeaseNotFoundError):
        await backend.txn([], [OpPut(b"leased", b"v", lease=lease)])
    with pytest.raises(LeaseNotFoundError):
        await backend.lease_time_to_live(lease)


async def test_lease_expiry_deletes_keys(backend: EtcdBackend) -> None:
    lease, _ = await backend.lease_grant(1)
    header = await backend.put(b"ephemeral", b"v", lease=lease)
    it = backend.watch(b"ephemeral", start_revision=header.revision + 1)
    resp = await _next(it)
    assert [(e.type, e.kv.key) for e in resp.events] == [(EventType.DELETE, b"ephemeral")]
    await it.aclose()
    with pytest.raises(LeaseNotFoundError):
        await backend.lease_keepalive_once(lease)


async def test_keep_lease_alive_outlives_ttl_then_fails_on_revoke(backend: EtcdBackend) -> None:
    lease, ttl = await backend.lease_grant(1)
    await backend.put(b"member", b"v", lease=lease)
    sleeps = 0
    outlived = asyncio.Event()

    async def counting_sleep(s: float) -> None:
        nonlocal sleeps
        sleeps += 1
        # 3 refreshes per TTL: after 7 intervals over two TTLs have passed.
        if sleeps == 8:
            outlived.set()
        await asyncio.sleep(s)

    keeper = asyncio.create_task(keep_lease_alive(backend, lease, ttl, sleep=counting_sleep))
    async with asyncio.timeout(wait_s):
        await outlived.wait()
    assert (await backend.range(b"member")).kvs != ()
    assert await backend.lease_time_to_live(lease) >= 0

    await backend.lease_revoke(lease)
    with pytest.raises(LeaseNotFoundError):
        async with asyncio.timeout(wait_s):
            await keeper


async def test_keep_lease_alive_gives_up_when_unreachable_past_expiry(etcd: EtcdServer) -> None:
    be = EtcdBackend([etcd.endpoint], dial_timeout_s=0.1)
    try:
        lease, _ = await be.lease_grant(30)
        await etcd.kill()
        now = 0.0
        attempts = 0

        def clock() -> float:
            return now

        async def virtual_sleep(s: float) -> None:
            nonlocal now, attempts
            now += s
            attempts += 1

        with pytest.raises(UnavailableError):
            async with asyncio.timeout(wait_s):
                await keep_lease_alive(be, lease, 3, sleep=virtual_sleep, clock=clock)
        # It kept retrying (every 0.5 s after the first refresh at 1 s) until the 3 s TTL was up.
        assert now >= 3
        assert attempts == 5
    finally:
        await be.close()


async def test_keep_lease_alive_rejects_bad_ttl(backend: EtcdBackend) -> None:
    with pytest.raises(ValueError, match="ttl_s must be > 0"):
        await keep_lease_alive(backend, 1, 0)


# -- Conformance ------------------------------------------------------------------------------


class EtcdHarness:
    """check_keyspace's view of a real etcd: interrupting it restarts the server."""

    def __init__(self, server: EtcdServer) -> None:
        self._server = server
        self._backend = EtcdBackend([server.endpoint])

    @property
    def backend(self) -> Backend:
        return self._backend

    async def interrupt(self) -> None:
        await self._server.restart()
        # The restart broke the backend's connection; an (idempotent, retried) read returns
        # once it has re-dialled, so the caller's next request, even a put, goes through.
        await self._backend.range(b"\x00")

    async def new_backend(self) -> Backend:
        return EtcdBackend([self._server.endpoint])

    async def close(self) -> None:
        await self._backend.close()


async def test_keyspace_conformance(etcd: EtcdServer) -> None:
    harness = EtcdHarness(etcd)
    try:
        await check_keyspace(harness)
    finally:
        await harness.close()


# -- A stream that cannot be written -----------------------------------------------------------


async def test_a_message_grpc_could_not_send_is_retried_not_fatal(backend: EtcdBackend) -> None:
    # Found by the soak: etcd restarted while a consumer re-opened its Watch stream; writing
    # the create request failed on the broken connection, which grpc.aio reports as INTERNAL
    # "Internal error from Core", and the watch, then the consumer process, failed for good.
    # (That failure is a race of etcd's restart with a stream's first write: it is raised here
    # by the call itself, through the backend's one path for every RPC.)
    calls = 0

    async def write_fails_once(_conn: object) -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.INTERNAL,
                grpc.aio.Metadata(),
                grpc.aio.Metadata(),
                details="Internal error from Core",
            )
        return "opened"

    assert await backend._call("Watch", write_fails_once, idempotent=True) == "opened"
    assert calls == 2
    # Not idempotent: not re-sent, but retriable for the caller (unavailable, not an answer).
    calls = 0
    with pytest.raises(UnavailableError):
        await backend._call("Txn", write_fails_once)
    # An INTERNAL status etcd sends is its answer, as before.

    async def etcd_says_internal(_conn: object) -> str:
        raise grpc.aio.AioRpcError(
            grpc.StatusCode.INTERNAL, grpc.aio.Metadata(), grpc.aio.Metadata(), details="boom"
        )

    with pytest.raises(EtcdError):
        await backend._call("Range", etcd_says_internal, idempotent=True)


async def test_a_write_on_a_stream_that_already_ended_is_retried_not_fatal(
    backend: EtcdBackend,
) -> None:
    # Found by the 30-minute soak: etcd restarted as a consumer re-opened its Watch; grpc.aio
    # refused to write the create request on the stream that had already ended
    # (InvalidStateError "RPC already finished"), the keyspace watch died of it, and so did
    # the consumer process.
    calls = 0

    async def stream_already_ended_once(_conn: object) -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise asyncio.InvalidStateError("RPC already finished.")
        return "opened"

    assert await backend._call("Watch", stream_already_ended_once, idempotent=True) == "opened"
    assert calls == 2
    calls = 0
    with pytest.raises(UnavailableError, match="stream ended before its request was written"):
        await backend._call("Txn", stream_already_ended_once)  # Not re-sent; retriable.
