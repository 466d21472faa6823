"""Keyspace conformance checks of keys, prefix ranges and transactions (see conformance.py)."""

from __future__ import annotations

import asyncio

from broker.keyspace.backend import (
    Backend,
    Compare,
    CompareResult,
    CompareTarget,
    FutureRevisionError,
    KeyValue,
    OpDelete,
    OpGet,
    OpPut,
    prefix_end,
)
from broker.keyspace.conformance_kit import (
    Check as Check,
)
from broker.keyspace.conformance_kit import (
    KeySpaceHarness,
    _expect,
    _expect_raises,
    _only,
    _scope,
)

# Keys both writers of the race check contend for (one race each).
race_rounds = 5


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


async def check_range_since(harness: KeySpaceHarness) -> None:
    """A range with ``min_mod_revision`` answers only keys modified since, at the revision
    asked, and counts every key of the range (how a mirror checks a progress notification)."""
    b = harness.backend
    p = _scope("range_since")
    end = prefix_end(p)
    await b.put(p + b"/a", b"1")
    await b.put(p + b"/b", b"1")
    base = (await b.put(p + b"/c", b"1")).revision
    await b.put(p + b"/b", b"2")
    await b.delete(p + b"/c")
    at = (await b.put(p + b"/d", b"1")).revision
    await b.put(p + b"/e", b"1")  # After the revision asked: not seen.

    since = await b.range(p, end, at, min_mod_revision=base + 1)
    got = [(kv.key[len(p) :], kv.value) for kv in since.kvs]
    _expect(got == [(b"/b", b"2"), (b"/d", b"1")], f"keys modified since {base} at {at}: {got}")
    _expect(since.count == 3, f"count at {at} is {since.count}, expected 3 (/a, /b, /d)")
    whole = await b.range(p, end)
    _expect(
        len(whole.kvs) == whole.count == 4,
        f"a range without min_mod_revision returned {len(whole.kvs)} keys, count {whole.count}",
    )
    none = await b.range(p, end, min_mod_revision=whole.header.revision + 1)
    _expect(none.kvs == () and none.count == 4, f"nothing modified since now: {none}")
    await b.delete(p, end)


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
