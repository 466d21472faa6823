"""A conformance kit for keyspace backends: ``await check_keyspace(harness)``.

Any Backend (the embedded one, the etcd one, a fault-injecting wrapper) must pass every check
here, so that code tested against one behaves the same against another. Each check is a plain
async function named after what it checks; ``check_keyspace`` runs them all, in order, and a
failure raises ConformanceError (an AssertionError) naming the check and what differed.

The harness (``KeySpaceHarness``) gives the backend under test, a way to break its connection,
and further clients of the same store. Checks write under a fresh random prefix, so they may run
against a store holding other data, but they assume no other writer is active meanwhile (some
assert that a request did *not* advance the revision), and ``check_compaction`` compacts the
store's history. Keys are cleaned up on a best-effort basis only.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, Protocol

from broker.keyspace.backend import (
    Backend,
    CompactedError,
    Compare,
    CompareResult,
    CompareTarget,
    Event,
    EventType,
    FutureRevisionError,
    KeyValue,
    LeaseNotFoundError,
    OpDelete,
    OpGet,
    OpPut,
    WatchResponse,
    prefix_end,
)
from broker.keyspace.embedded import EmbeddedBackend
from broker.keyspace.keyspace import KeySpace

# Upper bound on waiting for a watch event or a mirror revision that should come promptly.
event_timeout_s = 10.0
# Lease TTL of the expiry check: etcd's minimum with default flags, so the check stays short.
lease_expiry_ttl_s = 2
# Upper bound on waiting for an expired lease's keys to be deleted (etcd revokes expired
# leases on a 500 ms tick, after the TTL).
lease_expiry_timeout_s = 15.0
# How often the expiry check refreshes the lease it keeps alive (well inside the TTL).
lease_refresh_interval_s = 0.5
# Keys both writers of the race check contend for (one race each).
race_rounds = 5


class KeySpaceHarness(Protocol):
    """What check_keyspace needs of the environment around a backend."""

    @property
    def backend(self) -> Backend:
        """The backend under test. The checks do not close it."""
        ...

    async def interrupt(self) -> None:
        """Break the backend's connection, so that its active watches fail with
        UnavailableError, and return once new requests can succeed again (embedded: break the
        watches; etcd: stop and restart the server)."""
        ...

    async def new_backend(self) -> Backend:
        """Another client of the same store. The checks close it."""
        ...


class EmbeddedHarness:
    """The harness for an EmbeddedBackend: interrupting breaks every watch of its store."""

    def __init__(self, backend: EmbeddedBackend | None = None) -> None:
        self._backend = backend if backend is not None else EmbeddedBackend()

    @property
    def backend(self) -> Backend:
        return self._backend

    async def interrupt(self) -> None:
        self._backend.break_watches()

    async def new_backend(self) -> Backend:
        return self._backend.new_client()


class ConformanceError(AssertionError):
    """A backend did not behave as the Backend contract (etcd v3's semantics) requires."""


Check = Callable[[KeySpaceHarness], Awaitable[None]]


def _expect(condition: bool, what: str) -> None:
    # Explicit, so that python -O does not strip the checks.
    if not condition:
        raise ConformanceError(what)


def _scope(check: str) -> bytes:
    """A fresh prefix for one check's keys: a clean path (no trailing '/'), usable as a
    KeySpace root."""
    return f"/gazette-conformance/{uuid.uuid4().hex[:12]}/{check}".encode()


async def _expect_raises(
    exc_type: type[BaseException], what: str, call: Awaitable[object]
) -> BaseException:
    try:
        await call
    except exc_type as exc:
        return exc
    raise ConformanceError(f"{what}: expected {exc_type.__name__}, but it succeeded")


async def _only(backend: Backend, key: bytes) -> KeyValue | None:
    kvs = (await backend.range(key)).kvs
    _expect(len(kvs) <= 1, f"range of the single key {key!r} returned {len(kvs)} keys")
    return kvs[0] if kvs else None


async def _aclose(stream: AsyncIterator[WatchResponse]) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()


async def _watch_until(
    backend: Backend, key: bytes, range_end: bytes | None, start: int, until: int
) -> list[WatchResponse]:
    """Watch responses from ``start`` until one carries an event of revision >= ``until``."""
    stream = backend.watch(key, range_end, start)
    responses: list[WatchResponse] = []
    try:
        async with asyncio.timeout(event_timeout_s):
            async for resp in stream:
                responses.append(resp)
                if any(e.kv.mod_revision >= until for e in resp.events):
                    return responses
    except TimeoutError:
        raise ConformanceError(
            f"watch of {key!r} from revision {start}: no event of revision {until} within "
            f"{event_timeout_s}s (got {responses})"
        ) from None
    finally:
        await _aclose(stream)
    raise ConformanceError(f"watch of {key!r} ended before revision {until}")


def _summary(events: list[Event]) -> list[tuple[str, bytes, bytes, int]]:
    return [(e.type.name, e.kv.key, e.kv.value, e.kv.mod_revision) for e in events]


# -- Key/value basics ---------------------------------------------------------------------------


async def check_kv_basics(harness: KeySpaceHarness) -> None:
    """Put, range (now and at a past revision), delete; revisions and versions."""
    b = harness.backend
    key = _scope("kv_basics") + b"/key"

    r0 = await b.range(key)
    _expect(r0.kvs == (), f"range of a fresh key returned {r0.kvs}")
    _expect(r0.header.revision >= 1, f"store revision is {r0.header.revision}, must be >= 1")

    h1 = await b.put(key, b"v1")
    _expect(h1.revision > r0.header.revision, "put did not advance the revision")
    kv1 = await _only(b, key)
    _expect(
        kv1 == KeyValue(key, b"v1", h1.revision, h1.revision, 1, 0),
        f"created key reads back as {kv1} (put at revision {h1.revision})",
    )

    h2 = await b.put(key, b"v2")
    kv2 = await _only(b, key)
    _expect(
        kv2 == KeyValue(key, b"v2", h1.revision, h2.revision, 2, 0),
        f"updated key reads back as {kv2} (created at {h1.revision}, updated at {h2.revision})",
    )
    past = await b.range(key, revision=h1.revision)
    _expect(past.kvs == (kv1,), f"range at revision {h1.revision} returned {past.kvs}")
    _expect(
        past.header.revision >= h2.revision,
        "a range at a past revision must report the store's current revision in its header",
    )

    hd, deleted = await b.delete(key)
    _expect(deleted == 1 and hd.revision > h2.revision, f"delete returned ({hd}, {deleted})")
    _expect(await _only(b, key) is None, "deleted key is still there")
    at_h2 = await b.range(key, revision=h2.revision)
    _expect(at_h2.kvs == (kv2,), f"range at {h2.revision} after the delete returned {at_h2.kvs}")

    hd2, deleted2 = await b.delete(key)
    _expect(deleted2 == 0, f"delete of an absent key deleted {deleted2}")
    _expect(
        hd2.revision == hd.revision,
        f"delete of an absent key moved the revision from {hd.revision} to {hd2.revision}",
    )

    h3 = await b.put(key, b"v3")
    kv3 = await _only(b, key)
    _expect(
        kv3 == KeyValue(key, b"v3", h3.revision, h3.revision, 1, 0),
        f"re-created key reads back as {kv3}: a new key starts at version 1",
    )
    await _expect_raises(
        FutureRevisionError,
        "range at a future revision",
        b.range(key, revision=h3.revision + 1000),
    )
    await b.delete(key)


async def check_prefix_ranges(harness: KeySpaceHarness) -> None:
    """Ranges over [key, range_end), prefixes, open ends, and range deletes."""
    b = harness.backend
    p = _scope("prefix_ranges")
    names = [b"/a", b"/a/1", b"/a/2", b"/a/3", b"/ab", b"/b"]
    for name in (b"/a/2", b"/b", b"/a", b"/a/3", b"/ab", b"/a/1"):  # not in key order
        await b.put(p + name, name)

    def keys(kvs: tuple[KeyValue, ...]) -> list[bytes]:
        return [kv.key for kv in kvs]

    got = keys((await b.range(p + b"/a/", prefix_end(p + b"/a/"))).kvs)
    _expect(got == [p + n for n in names[1:4]], f"prefix range of /a/ returned {got}")
    got = keys((await b.range(p + b"/a/1", p + b"/a/3")).kvs)
    _expect(got == [p + b"/a/1", p + b"/a/2"], f"range [/a/1, /a/3) returned {got}")
    got = keys((await b.range(p, prefix_end(p))).kvs)
    _expect(got == [p + n for n in names], f"prefix range of the scope returned {got}")
    got = keys((await b.range(p + b"/ab", b"\x00")).kvs)
    _expect(
        got[:2] == [p + b"/ab", p + b"/b"] and got == sorted(got) and got[0] == p + b"/ab",
        f"open-ended range from /ab returned {got[:5]}...",
    )
    got = keys((await b.range(p + b"/b", p + b"/a")).kvs)
    _expect(got == [], f"range with end before start returned {got}")

    _, deleted = await b.delete(p + b"/a/", prefix_end(p + b"/a/"))
    _expect(deleted == 3, f"prefix delete of /a/ deleted {deleted} keys, expected 3")
    got = keys((await b.range(p, prefix_end(p))).kvs)
    _expect(got == [p + b"/a", p + b"/ab", p + b"/b"], f"after prefix delete: {got}")
    await b.delete(p, prefix_end(p))


# -- Transactions -------------------------------------------------------------------------------


def _compare_table(present: KeyValue, absent: bytes) -> list[tuple[Compare, bool]]:
    """(compare, whether it holds) for a present key and an absent one."""
    k, eq, gt, lt, ne = (
        present.key,
        CompareResult.EQUAL,
        CompareResult.GREATER,
        CompareResult.LESS,
        CompareResult.NOT_EQUAL,
    )
    version, create, mod, value, lease = (
        CompareTarget.VERSION,
        CompareTarget.CREATE,
        CompareTarget.MOD,
        CompareTarget.VALUE,
        CompareTarget.LEASE,
    )
    v, c, m, val, ls = (
        present.version,
        present.create_revision,
        present.mod_revision,
        present.value,
        present.lease,
    )
    return [
        (Compare(k, version, eq, v), True),
        (Compare(k, version, eq, v - 1), False),
        (Compare(k, version, gt, v - 1), True),
        (Compare(k, version, gt, v), False),
        (Compare(k, version, lt, v + 1), True),
        (Compare(k, version, lt, v), False),
        (Compare(k, version, ne, v), False),
        (Compare(k, version, ne, v + 1), True),
        (Compare(k, create, eq, c), True),
        (Compare(k, create, gt, c), False),
        (Compare(k, create, lt, m), True),
        (Compare(k, create, ne, m), True),
        (Compare(k, mod, eq, m), True),
        (Compare(k, mod, lt, m), False),
        (Compare(k, mod, gt, c), True),
        (Compare(k, mod, ne, c), True),
        (Compare(k, value, eq, val), True),
        (Compare(k, value, eq, val + b"x"), False),
        (Compare(k, value, gt, b"a"), True),
        (Compare(k, value, gt, val), False),
        (Compare(k, value, lt, val + b"\x00"), True),
        (Compare(k, value, lt, val), False),
        (Compare(k, value, ne, b"other"), True),
        (Compare(k, value, ne, val), False),
        (Compare(k, value, gt, b""), True),
        (Compare(k, lease, eq, ls), True),
        (Compare(k, lease, eq, 0), False),
        (Compare(k, lease, ne, 0), True),
        (Compare(k, lease, gt, 0), True),
        # An absent key has version, revisions and lease 0, and no value at all: every VALUE
        # compare on it fails, even against b"".
        (Compare(absent, version, eq, 0), True),
        (Compare(absent, version, gt, 0), False),
        (Compare(absent, create, eq, 0), True),
        (Compare(absent, create, lt, 1), True),
        (Compare(absent, mod, eq, 0), True),
        (Compare(absent, mod, gt, 0), False),
        (Compare(absent, lease, eq, 0), True),
        (Compare(absent, lease, ne, 0), False),
        (Compare(absent, value, eq, b""), False),
        (Compare(absent, value, ne, b""), False),
        (Compare(absent, value, ne, b"x"), False),
        (Compare(absent, value, lt, b"z"), False),
        (Compare(absent, value, gt, b""), False),
    ]


async def check_txn_compares(harness: KeySpaceHarness) -> None:
    """Every compare target and result, on a present and an absent key."""
    b = harness.backend
    p = _scope("txn_compares")
    key, absent = p + b"/key", p + b"/absent"
    lease_id, _ = await b.lease_grant(60)
    try:
        await b.put(key, b"first")
        h2 = await b.put(key, b"m", lease_id)
        present = await _only(b, key)
        _expect(present is not None and present.version == 2, f"setup: key is {present}")
        assert present is not None
        for compare, holds in _compare_table(present, absent):
            resp = await b.txn([compare], [OpGet(key)], [])
            _expect(
                resp.succeeded == holds,
                f"{compare.target.name} {compare.result.name} {compare.value!r} on "
                f"{'absent' if compare.key == absent else 'present'} key {compare.key!r}: "
                f"succeeded={resp.succeeded}, expected {holds} (key is {present})",
            )
            expected_results = ((present,),) if holds else ()
            _expect(
                resp.results == expected_results,
                f"results of a txn whose branch is [OpGet] / []: {resp.results}",
            )
            _expect(
                resp.header.revision == h2.revision,
                f"a read-only txn moved the revision from {h2.revision} to {resp.header.revision}",
            )
        both = [
            Compare(key, CompareTarget.VERSION, CompareResult.EQUAL, 2),
            Compare(key, CompareTarget.VALUE, CompareResult.EQUAL, b"wrong"),
        ]
        resp = await b.txn(both, [OpPut(p + b"/never", b"x")], [])
        _expect(not resp.succeeded, "a txn succeeded with one of its two compares false")
    finally:
        await b.lease_revoke(lease_id)


async def check_txn_branches(harness: KeySpaceHarness) -> None:
    """A txn runs one branch, in order, as one revision; results match the ops."""
    b = harness.backend
    p = _scope("txn_branches")
    old, k2, k3, k4 = p + b"/old", p + b"/k2", p + b"/k3", p + b"/k4"
    h0 = await b.put(old, b"old")
    holds = Compare(old, CompareTarget.MOD, CompareResult.EQUAL, h0.revision)

    resp = await b.txn(
        [holds],
        [OpPut(k2, b"two"), OpPut(k3, b"three"), OpGet(k2), OpDelete(old)],
        [OpPut(k4, b"four")],
    )
    _expect(resp.succeeded, "txn with a true compare did not succeed")
    rev = resp.header.revision
    _expect(rev == h0.revision + 1, f"a mutating txn took revisions {h0.revision}..{rev}")
    kv2 = KeyValue(k2, b"two", rev, rev, 1, 0)
    _expect(
        resp.results == (None, None, (kv2,), 1),
        f"results of [put, put, get, delete]: {resp.results} (the get must see the put)",
    )
    kv3 = await _only(b, k3)
    _expect(kv3 is not None and kv3.mod_revision == rev, f"txn put {kv3}, expected rev {rev}")
    _expect(await _only(b, old) is None, "txn delete left the key")
    _expect(await _only(b, k4) is None, "the failure branch ran too")

    resp = await b.txn([holds], [OpPut(p + b"/never", b"x")], [OpPut(k4, b"four"), OpGet(k4)])
    _expect(not resp.succeeded, "txn with a false compare succeeded")
    kv4 = KeyValue(k4, b"four", resp.header.revision, resp.header.revision, 1, 0)
    _expect(resp.results == (None, (kv4,)), f"failure branch results: {resp.results}")
    _expect(await _only(b, p + b"/never") is None, "the success branch ran on failure")

    before = resp.header.revision
    resp = await b.txn([holds], [], [OpGet(k4), OpDelete(p + b"/absent")])
    _expect(
        resp.header.revision == before and resp.results == ((kv4,), 0),
        f"a txn that changed nothing: revision {before} -> {resp.header.revision}, "
        f"results {resp.results}",
    )
    await b.delete(p, prefix_end(p))


async def check_txn_race(harness: KeySpaceHarness) -> None:
    """Two clients racing to create one key with ``create_revision == 0``: exactly one wins."""
    b = harness.backend
    other = await harness.new_backend()
    p = _scope("txn_race")
    try:
        for i in range(race_rounds):
            key = p + f"/race-{i}".encode()

            async def attempt(client: Backend, name: bytes, key: bytes = key) -> tuple[bool, bytes]:
                resp = await client.txn(
                    [Compare(key, CompareTarget.CREATE, CompareResult.EQUAL, 0)],
                    [OpPut(key, name)],
                    [OpGet(key)],
                )
                return resp.succeeded, name

            outcomes = await asyncio.gather(attempt(b, b"one"), attempt(other, b"two"))
            winners = [name for won, name in outcomes if won]
            _expect(len(winners) == 1, f"race {i}: winners {winners}, expected exactly one")
            stored = await _only(b, key)
            _expect(
                stored is not None and stored.value == winners[0] and stored.version == 1,
                f"race {i}: {winners[0]!r} won but the key is {stored}",
            )
    finally:
        await other.close()
    await b.delete(p, prefix_end(p))


# -- Leases -------------------------------------------------------------------------------------


async def check_leases(harness: KeySpaceHarness) -> None:
    """Grant, attach keys, refresh, detach by a plain put, revoke; gone leases are errors."""
    b = harness.backend
    p = _scope("leases")
    lease_id, ttl = await b.lease_grant(60)
    _expect(lease_id != 0 and ttl >= 60, f"grant(60) returned ({lease_id}, {ttl})")
    await b.put(p + b"/a", b"a", lease_id)
    await b.put(p + b"/b", b"b", lease_id)
    await b.put(p + b"/c", b"c")
    await b.put(p + b"/d", b"d", lease_id)
    await b.put(p + b"/d", b"d2")  # A put without the lease detaches the key from it.
    kv = await _only(b, p + b"/a")
    _expect(kv is not None and kv.lease == lease_id, f"leased key reads back as {kv}")

    refreshed = await b.lease_keepalive_once(lease_id)
    _expect(refreshed == ttl, f"keepalive returned TTL {refreshed}, granted {ttl}")

    await b.lease_revoke(lease_id)
    left = [kv.key for kv in (await b.range(p, prefix_end(p))).kvs]
    _expect(left == [p + b"/c", p + b"/d"], f"after revoking the lease, keys left: {left}")

    await _expect_raises(LeaseNotFoundError, "revoke of a revoked lease", b.lease_revoke(lease_id))
    await _expect_raises(
        LeaseNotFoundError, "keepalive of a revoked lease", b.lease_keepalive_once(lease_id)
    )
    await _expect_raises(
        LeaseNotFoundError, "put with a revoked lease", b.put(p + b"/e", b"e", lease_id)
    )
    _expect(await _only(b, p + b"/e") is None, "a failed put with a gone lease wrote the key")
    await b.delete(p, prefix_end(p))


async def check_lease_expiry(harness: KeySpaceHarness) -> None:
    """A lease left alone expires and its keys are deleted (with DELETE events); a lease that
    is refreshed outlives it."""
    b = harness.backend
    p = _scope("lease_expiry")
    kept, _ = await b.lease_grant(lease_expiry_ttl_s)
    lapsed, _ = await b.lease_grant(lease_expiry_ttl_s)
    try:
        await b.put(p + b"/kept", b"k", kept)
        h = await b.put(p + b"/lapsed", b"l", lapsed)

        async def refresh() -> None:
            while True:
                await asyncio.sleep(lease_refresh_interval_s)  # pacing, not synchronisation
                await b.lease_keepalive_once(kept)

        stream = b.watch(p + b"/lapsed", None, h.revision + 1)
        deletion: Event | None = None
        try:
            async with _running(refresh()), asyncio.timeout(lease_expiry_timeout_s):
                async for resp in stream:
                    deletion = resp.events[0]
                    break
        except TimeoutError:
            raise ConformanceError(
                f"lease with TTL {lease_expiry_ttl_s}s: its key was not deleted within "
                f"{lease_expiry_timeout_s}s"
            ) from None
        finally:
            await _aclose(stream)
        _expect(
            deletion is not None
            and deletion.type == EventType.DELETE
            and deletion.kv.key == p + b"/lapsed",
            f"first event after the lapsed lease's key was written: {deletion}",
        )
        _expect(await _only(b, p + b"/lapsed") is None, "expired lease's key is still there")
        kv = await _only(b, p + b"/kept")
        _expect(kv is not None and kv.lease == kept, "a refreshed lease expired with the other one")
        await _expect_raises(
            LeaseNotFoundError, "keepalive of an expired lease", b.lease_keepalive_once(lapsed)
        )
    finally:
        with contextlib.suppress(LeaseNotFoundError):
            await b.lease_revoke(kept)
        with contextlib.suppress(LeaseNotFoundError):
            await b.lease_revoke(lapsed)


# -- Watches and compaction ---------------------------------------------------------------------


async def check_watch_replay(harness: KeySpaceHarness) -> None:
    """A watch from a past revision replays every event of its range, in order, a revision's
    events never split; then it delivers new ones."""
    b = harness.backend
    p = _scope("watch_replay")
    k1, k2, k3, k4 = p + b"/1", p + b"/2", p + b"/3", p + b"/4"
    h1 = await b.put(k1, b"a")
    h2 = await b.put(k2, b"b")
    await b.put(p + b"-outside", b"not in the watched range")
    h3 = await b.put(k1, b"c")
    h4, _ = await b.delete(k2)
    t5 = await b.txn([], [OpPut(k3, b"d"), OpPut(k4, b"e")])
    r1, r2, r3, r4, r5 = h1.revision, h2.revision, h3.revision, h4.revision, t5.header.revision

    responses = await _watch_until(b, p + b"/", prefix_end(p + b"/"), r1, r5)
    events = [e for resp in responses for e in resp.events]
    expected = [
        ("PUT", k1, b"a", r1),
        ("PUT", k2, b"b", r2),
        ("PUT", k1, b"c", r3),
        ("DELETE", k2, b"", r4),
        ("PUT", k3, b"d", r5),
        ("PUT", k4, b"e", r5),
    ]
    _expect(_summary(events) == expected, f"replayed events {_summary(events)} != {expected}")
    _expect(
        events[2].kv == KeyValue(k1, b"c", r1, r3, 2, 0),
        f"replayed update carries {events[2].kv}",
    )
    _expect(
        events[3].kv == KeyValue(k2, b"", 0, r4, 0, 0),
        f"a DELETE event carries the key and the deletion revision only: {events[3].kv}",
    )
    for resp in responses:
        _expect(
            all(e.kv.mod_revision <= resp.header.revision for e in resp.events),
            f"a response's header revision {resp.header.revision} is below its events'",
        )
    _expect(
        any(sum(e.kv.mod_revision == r5 for e in resp.events) == 2 for resp in responses),
        "the two events of one txn revision were split across responses",
    )

    later = await b.put(k1, b"f")
    responses = await _watch_until(b, p + b"/", prefix_end(p + b"/"), r5 + 1, later.revision)
    got = _summary([e for resp in responses for e in resp.events])
    _expect(got == [("PUT", k1, b"f", later.revision)], f"watch from {r5 + 1} delivered {got}")
    await b.delete(p + b"/", prefix_end(p + b"/"))
    await b.delete(p + b"-outside")


async def check_compaction(harness: KeySpaceHarness) -> None:
    """History before the compact revision is gone: reads and watches of it fail with
    CompactedError, which says so; the compact revision itself stays readable."""
    b = harness.backend
    key = _scope("compaction") + b"/key"
    h1 = await b.put(key, b"v1")
    h2 = await b.put(key, b"v2")
    h3 = await b.put(key, b"v3")
    await b.compact(h2.revision)

    exc = await _expect_raises(
        CompactedError, "range at a compacted revision", b.range(key, revision=h1.revision)
    )
    assert isinstance(exc, CompactedError)
    _expect(
        exc.requested == h1.revision and exc.compact_revision >= h2.revision,
        f"CompactedError of a range says requested={exc.requested}, "
        f"compact_revision={exc.compact_revision}",
    )
    at_h2 = await b.range(key, revision=h2.revision)
    _expect(
        [kv.value for kv in at_h2.kvs] == [b"v2"],
        f"range at the compact revision returned {at_h2.kvs}",
    )

    stream = b.watch(key, None, h1.revision)
    try:
        async with asyncio.timeout(event_timeout_s):
            exc = await _expect_raises(
                CompactedError, "watch from a compacted revision", anext(stream)
            )
    finally:
        await _aclose(stream)
    message = str(exc)
    _expect(
        str(h1.revision) in message and "compact" in message,
        f"the CompactedError of a watch should name the revision and compaction: {message!r}",
    )

    responses = await _watch_until(b, key, None, h2.revision, h3.revision)
    got = [e.kv.mod_revision for resp in responses for e in resp.events]
    _expect(
        got[-1] == h3.revision and all(r >= h2.revision for r in got),
        f"watch from the compact revision {h2.revision} delivered revisions {got}",
    )
    await _expect_raises(CompactedError, "compact at an older revision", b.compact(h1.revision))
    await _expect_raises(
        FutureRevisionError, "compact at a future revision", b.compact(h3.revision + 1000)
    )
    await b.delete(key)


# -- The KeySpace mirror ------------------------------------------------------------------------


def _decode_text(kv: KeyValue) -> str:
    if kv.value.startswith(b"bad"):
        raise ValueError(f"undecodable value {kv.value!r}")
    return kv.value.decode()


def _values(ks: KeySpace[str]) -> dict[bytes, str]:
    return {entry.kv.key[len(ks.root) :]: entry.decoded for entry in ks.kvs}


async def _reach(ks: KeySpace[str], revision: int) -> None:
    try:
        await ks.wait_for_revision(revision, event_timeout_s)
    except TimeoutError as exc:
        raise ConformanceError(f"the KeySpace mirror did not follow the writes: {exc}") from None


@contextlib.asynccontextmanager
async def _running(coro: Coroutine[Any, Any, object]) -> AsyncIterator[None]:
    """Run ``coro`` as a task for the body's duration, then cancel it; if it had failed, raise
    its error. (Not a TaskGroup: that would wrap the body's own failure in an ExceptionGroup.)"""
    task = asyncio.create_task(coro)
    try:
        yield
    finally:
        task.cancel()
        await asyncio.wait([task])
        error = None if task.cancelled() else task.exception()
        if error is not None:
            raise error


async def check_mirror_resume(harness: KeySpaceHarness) -> None:
    """A KeySpace mirror keeps running across interrupted connections and reflects writes made
    while its watch was broken and after."""
    b = harness.backend
    root = _scope("mirror_resume")
    await b.put(root + b"/k1", b"one")
    ks = KeySpace(root, _decode_text)
    await ks.load(b)
    async with _running(ks.watch(b)):
        h2 = await b.put(root + b"/k2", b"two")
        await _reach(ks, h2.revision)
        await harness.interrupt()
        await b.put(root + b"/k3", b"three")
        await harness.interrupt()
        h4 = await b.put(root + b"/k4", b"four")
        await _reach(ks, h4.revision)
        got = _values(ks)
        want = {b"/k1": "one", b"/k2": "two", b"/k3": "three", b"/k4": "four"}
        _expect(got == want, f"mirror after interruptions: {got}, expected {want}")
        hd, _ = await b.delete(root + b"/k1")
        await _reach(ks, hd.revision)
        _expect(ks.get(root + b"/k1") is None, "mirror kept a deleted key")
        try:
            await ks.wait_for_revision(hd.revision + 1000, 0.05)
        except TimeoutError:
            pass
        else:
            raise ConformanceError("wait_for_revision of a far revision did not time out")
    await b.delete(root, prefix_end(root))


async def check_mirror_reload_after_compaction(harness: KeySpaceHarness) -> None:
    """A mirror whose resume revision was compacted re-loads and carries on."""
    b = harness.backend
    root = _scope("mirror_reload")
    await b.put(root + b"/k1", b"one")
    ks = KeySpace(root, _decode_text)
    await ks.load(b)
    await b.put(root + b"/k2", b"two")
    await b.delete(root + b"/k1")
    h = await b.put(root + b"/k3", b"three")
    await b.compact(h.revision)
    async with _running(ks.watch(b)):
        await _reach(ks, h.revision)
        h4 = await b.put(root + b"/k4", b"four")
        await _reach(ks, h4.revision)
    got = _values(ks)
    want = {b"/k2": "two", b"/k3": "three", b"/k4": "four"}
    _expect(got == want, f"mirror re-loaded after compaction: {got}, expected {want}")
    await b.delete(root, prefix_end(root))


async def check_mirror_decode_failures(harness: KeySpaceHarness) -> None:
    """Values that fail to decode are left out, without stopping the watch; a later good
    value for the key is picked up."""
    b = harness.backend
    root = _scope("mirror_decode")
    await b.put(root + b"/good", b"ok")
    await b.put(root + b"/bad", b"bad-1")
    ks = KeySpace(root, _decode_text)
    await ks.load(b)
    _expect(_values(ks) == {b"/good": "ok"}, f"loaded {_values(ks)}")
    async with _running(ks.watch(b)):
        await b.put(root + b"/new-bad", b"bad-2")
        await b.put(root + b"/good", b"bad-3")  # The previous, good value is kept.
        h = await b.put(root + b"/good2", b"ok2")
        await _reach(ks, h.revision)
        got = _values(ks)
        want = {b"/good": "ok", b"/good2": "ok2"}
        _expect(got == want, f"after undecodable updates: {got}, expected {want}")

        await b.put(root + b"/bad", b"fixed")
        await b.delete(root + b"/new-bad")  # Never in the mirror: ignored.
        h = await b.put(root + b"/good", b"ok-again")
        await _reach(ks, h.revision)
        got = _values(ks)
        want = {b"/bad": "fixed", b"/good": "ok-again", b"/good2": "ok2"}
        _expect(got == want, f"after corrections: {got}, expected {want}")
    await b.delete(root, prefix_end(root))


async def check_mirror_observers(harness: KeySpaceHarness) -> None:
    """Observers run after each load and each applied batch, seeing the mirror updated; a
    txn's changes arrive as one batch."""
    b = harness.backend
    root = _scope("mirror_observers")
    await b.put(root + b"/a", b"a")
    ks = KeySpace(root, _decode_text)
    seen: list[tuple[int, dict[bytes, str]]] = []
    ks.observers.append(lambda: seen.append((ks.header.revision, _values(ks))))
    await ks.load(b)
    _expect(seen == [(ks.header.revision, {b"/a": "a"})], f"observer after load saw {seen}")
    async with _running(ks.watch(b)):
        t = await b.txn([], [OpPut(root + b"/b", b"b"), OpPut(root + b"/c", b"c")])
        await _reach(ks, t.header.revision)
    want = (t.header.revision, {b"/a": "a", b"/b": "b", b"/c": "c"})
    _expect(
        seen[1:] == [want],
        f"observer calls after one txn: {seen[1:]}, expected exactly {[want]}",
    )
    await b.delete(root, prefix_end(root))


CHECKS: tuple[Check, ...] = (
    check_kv_basics,
    check_prefix_ranges,
    check_txn_compares,
    check_txn_branches,
    check_txn_race,
    check_leases,
    check_lease_expiry,
    check_watch_replay,
    check_mirror_resume,
    check_mirror_decode_failures,
    check_mirror_observers,
    # Compacting checks last: they discard the history of everything before them.
    check_compaction,
    check_mirror_reload_after_compaction,
)


async def check_keyspace(harness: KeySpaceHarness) -> None:
    """Run every check in CHECKS against the harness's backend; the first failure raises,
    noting which check failed."""
    for check in CHECKS:
        try:
            await check(harness)
        except Exception as exc:
            exc.add_note(f"keyspace conformance check: {check.__name__}")
            raise
