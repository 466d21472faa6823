"""The embedded backend: the conformance kit, plus what only the embedded backend has (fault
injection, a bounded watch queue, an injectable clock, several clients of one store)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence

import pytest

from broker.keyspace import conformance, conformance_kit, conformance_leases
from broker.keyspace.backend import (
    CompactedError,
    Compare,
    EventType,
    Header,
    LeaseNotFoundError,
    Op,
    OpPut,
    TxnResponse,
    UnavailableError,
    WatchResponse,
)
from broker.keyspace.conformance import CHECKS, Check, EmbeddedHarness, check_keyspace
from broker.keyspace.embedded import BackendClosedError, EmbeddedBackend, EmbeddedStore
from broker.keyspace.mvcc import InvalidRequestError

wait_s = 5.0  # upper bound on waits that should end promptly


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
async def test_conformance_check(check: Check) -> None:
    backend = EmbeddedBackend()
    try:
        await check(EmbeddedHarness(backend))
    finally:
        await backend.close()


async def test_check_keyspace_runs_every_check() -> None:
    backend = EmbeddedBackend()
    started = time.monotonic()
    try:
        await check_keyspace(EmbeddedHarness(backend))
    finally:
        await backend.close()
    assert time.monotonic() - started < 20


# -- The checks can fail: backends that break the contract -----------------------------------


class IgnoresCompares(EmbeddedBackend):
    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResponse:
        return await super().txn([], success, failure)


class RevokeKeepsKeys(EmbeddedBackend):
    async def lease_revoke(self, lease_id: int) -> None:
        keys = self.store.core.lease_keys(lease_id)
        kvs = [(await self.range(k)).kvs[0] for k in keys]
        await super().lease_revoke(lease_id)
        for kv in kvs:
            await self.put(kv.key, kv.value)


class DropsFirstResponse(EmbeddedBackend):
    def watch(
        self, key: bytes, range_end: bytes | None = None, start_revision: int = 0
    ) -> AsyncIterator[WatchResponse]:
        inner = super().watch(key, range_end, start_revision)

        async def skip_first() -> AsyncIterator[WatchResponse]:
            first = True
            async for resp in inner:
                if not first:
                    yield resp
                first = False

        return skip_first()


class SplitsRevisions(EmbeddedBackend):
    """Delivers each event of a watch response in a response of its own: a txn's changes no
    longer arrive as one batch. (A backend that drops a response instead is no longer caught
    by the mirror's checks: the mirror, behind, asks for progress and reads what it missed.)"""

    def watch(
        self, key: bytes, range_end: bytes | None = None, start_revision: int = 0
    ) -> AsyncIterator[WatchResponse]:
        inner = super().watch(key, range_end, start_revision)

        async def split() -> AsyncIterator[WatchResponse]:
            async for resp in inner:
                if not resp.events:
                    yield resp
                for event in resp.events:
                    yield WatchResponse(resp.header, (event,))

        return split()


class DeleteBumpsRevision(EmbeddedBackend):
    async def delete(self, key: bytes, range_end: bytes | None = None) -> tuple[Header, int]:
        header, deleted = await super().delete(key, range_end)
        if deleted == 0:
            await self.put(b"/unrelated", b"")
            header = Header(self.store.core.revision)
        return header, deleted


@pytest.mark.parametrize(
    ("backend_type", "check"),
    [
        (IgnoresCompares, conformance.check_txn_compares),
        (IgnoresCompares, conformance.check_txn_race),
        (RevokeKeepsKeys, conformance.check_leases),
        (DropsFirstResponse, conformance.check_watch_replay),
        (SplitsRevisions, conformance.check_mirror_observers),
        (DeleteBumpsRevision, conformance.check_kv_basics),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
async def test_checks_catch_broken_backends(
    backend_type: type[EmbeddedBackend], check: Check, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A lost event shows as a wait that times out; don't wait the full bound for it.
    monkeypatch.setattr(conformance_kit, "event_timeout_s", 0.5)
    backend = backend_type()
    try:
        with pytest.raises(conformance.ConformanceError):
            await check(EmbeddedHarness(backend))
    finally:
        await backend.close()


async def test_lease_expiry_check_catches_leases_that_never_expire(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(conformance_leases, "lease_expiry_timeout_s", 0.5)
    backend = EmbeddedBackend(EmbeddedStore(lease_ttl_min_s=3600))
    try:
        with pytest.raises(conformance.ConformanceError, match="was not deleted within"):
            await conformance.check_lease_expiry(EmbeddedHarness(backend))
    finally:
        await backend.close()


async def test_check_keyspace_names_the_failed_check() -> None:
    backend = IgnoresCompares()
    try:
        with pytest.raises(conformance.ConformanceError) as info:
            await check_keyspace(EmbeddedHarness(backend))
    finally:
        await backend.close()
    assert "keyspace conformance check: check_txn_compares" in (info.value.__notes__ or [])


# -- Watches ------------------------------------------------------------------------------------


async def test_watch_from_zero_starts_at_the_next_revision() -> None:
    backend = EmbeddedBackend()
    await backend.put(b"k", b"old")
    stream = backend.watch(b"k")
    h = await backend.put(b"k", b"new")
    resp = await asyncio.wait_for(anext(stream), wait_s)
    assert resp.header.revision == h.revision
    assert [e.kv.value for e in resp.events] == [b"new"]
    await backend.close()


async def test_watch_from_a_future_revision_skips_the_revisions_before_it() -> None:
    # etcd delivers only events >= start_revision, even when it is not reached yet.
    backend = EmbeddedBackend()
    h = await backend.put(b"k", b"0")
    stream = backend.watch(b"k", None, h.revision + 2)
    waiter = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)  # A yield, no wait: the ready waiter runs and registers the watch.
    await backend.put(b"k", b"1")  # h + 1: before the start
    await backend.put(b"k", b"2")  # h + 2
    resp = await asyncio.wait_for(waiter, wait_s)
    assert (resp.header.revision, [e.kv.value for e in resp.events]) == (h.revision + 2, [b"2"])
    await backend.close()


async def test_watch_rejects_bad_arguments() -> None:
    backend = EmbeddedBackend()
    with pytest.raises(InvalidRequestError):
        backend.watch(b"")
    with pytest.raises(InvalidRequestError):
        backend.watch(b"k", None, -1)
    await backend.close()


async def test_slow_watcher_is_ended_and_resumes_without_loss() -> None:
    backend = EmbeddedBackend(EmbeddedStore(watch_queue_responses_max=2))
    h = await backend.put(b"k", b"0")
    stream = backend.watch(b"k", None, h.revision)
    first = await anext(stream)  # registers; the replay delivers revision h
    assert first.header.revision == h.revision
    for i in range(1, 4):  # nobody reads: the third overflows the queue of two
        await backend.put(b"k", str(i).encode())
    with pytest.raises(UnavailableError, match="fell 2 responses behind"):
        await anext(stream)
    with pytest.raises(StopAsyncIteration):
        await anext(stream)  # ended for good

    resumed = backend.watch(b"k", None, first.header.revision + 1)
    resp = await anext(resumed)  # caught up from the log, in one replay batch
    assert [e.kv.value for e in resp.events] == [b"1", b"2", b"3"]
    await backend.close()


async def test_replay_is_batched_without_splitting_revisions() -> None:
    backend = EmbeddedBackend(EmbeddedStore(watch_batch_events_max=2))
    h = await backend.put(b"a", b"")
    await backend.txn([], [OpPut(b"b", b""), OpPut(b"c", b""), OpPut(b"d", b"")])
    last = await backend.put(b"e", b"")
    stream = backend.watch(b"a", b"z", h.revision)
    batches = [await anext(stream), await anext(stream)]
    assert [[e.kv.key for e in r.events] for r in batches] == [[b"a", b"b", b"c", b"d"], [b"e"]]
    assert batches[-1].header.revision == last.revision
    await backend.close()


async def test_compaction_during_replay_ends_the_watch() -> None:
    backend = EmbeddedBackend(EmbeddedStore(watch_batch_events_max=1))
    h = await backend.put(b"k", b"1")
    await backend.put(b"k", b"2")
    last = await backend.put(b"k", b"3")
    stream = backend.watch(b"k", None, h.revision)
    await anext(stream)
    await backend.compact(last.revision)
    with pytest.raises(CompactedError):
        await anext(stream)


async def test_break_watches_fails_every_client_watch() -> None:
    backend = EmbeddedBackend()
    other = backend.new_client()
    h = await backend.put(b"k", b"v")
    streams = [backend.watch(b"k", None, h.revision), other.watch(b"k", None, h.revision)]
    for stream in streams:
        await anext(stream)
    backend.break_watches()
    for stream in streams:
        with pytest.raises(UnavailableError, match="fault injection"):
            await anext(stream)
    h2 = await other.put(b"k", b"after")
    resumed = backend.watch(b"k", None, h.revision + 1)
    assert [e.kv.value for e in (await anext(resumed)).events] == [b"after"]
    assert h2.revision == h.revision + 1
    await other.close()
    await backend.close()


async def _blocked_next(
    stream: AsyncIterator[WatchResponse], started: asyncio.Event
) -> WatchResponse:
    started.set()
    return await anext(stream)


async def test_close_ends_its_watches_only() -> None:
    backend = EmbeddedBackend()
    other = backend.new_client()
    mine = asyncio.create_task(_blocked_next(backend.watch(b"k"), started := asyncio.Event()))
    await started.wait()  # `mine` now waits inside the watch: it ran up to its first suspension
    theirs = asyncio.create_task(_blocked_next(other.watch(b"k"), asyncio.Event()))
    await backend.close()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(mine, wait_s)
    h = await other.put(b"k", b"v")
    assert (await asyncio.wait_for(theirs, wait_s)).header.revision == h.revision
    with pytest.raises(BackendClosedError):
        await backend.put(b"k", b"v")
    await backend.close()  # idempotent
    await other.close()


# -- Leases and the clock -----------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_leases_follow_an_injected_clock() -> None:
    clock = FakeClock()
    backend = EmbeddedBackend(EmbeddedStore(clock=clock, lease_ttl_min_s=0))
    lease, ttl = await backend.lease_grant(10)
    h = await backend.put(b"k", b"v", lease)
    stream = backend.watch(b"k", None, h.revision + 1)
    clock.now += 9
    assert await backend.lease_keepalive_once(lease) == ttl  # deadline now 1019
    clock.now += 9.5
    backend.store.expire_leases()
    assert (await backend.range(b"k")).kvs != ()
    clock.now += 0.5
    backend.store.expire_leases()
    resp = await asyncio.wait_for(anext(stream), wait_s)
    assert [(e.type, e.kv.key) for e in resp.events] == [(EventType.DELETE, b"k")]
    with pytest.raises(LeaseNotFoundError):
        await backend.lease_keepalive_once(lease)
    await backend.close()


async def test_requests_see_leases_due_by_the_clock_without_the_timer() -> None:
    clock = FakeClock()
    backend = EmbeddedBackend(EmbeddedStore(clock=clock, lease_ttl_min_s=0))
    lease, _ = await backend.lease_grant(10)
    await backend.put(b"k", b"v", lease)
    clock.now += 10
    assert (await backend.range(b"k")).kvs == ()
    with pytest.raises(LeaseNotFoundError):
        await backend.lease_revoke(lease)
    await backend.close()


async def test_the_timer_expires_leases_in_real_time() -> None:
    backend = EmbeddedBackend(EmbeddedStore(lease_ttl_min_s=1))
    lease, ttl = await backend.lease_grant(1)
    assert ttl == 1
    h = await backend.put(b"k", b"v", lease)
    started = time.monotonic()
    resp = await asyncio.wait_for(anext(backend.watch(b"k", None, h.revision + 1)), wait_s)
    assert resp.events[0].type == EventType.DELETE
    assert time.monotonic() - started >= 0.9
    await backend.close()
