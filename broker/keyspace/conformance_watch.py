"""Keyspace conformance checks of watches and compaction (see conformance.py)."""

from __future__ import annotations

import asyncio

from broker.keyspace import (
    conformance_kit,  # Its tunables are read at call time (tests patch them).
)
from broker.keyspace.backend import (
    CompactedError,
    FutureRevisionError,
    KeyValue,
    OpPut,
    prefix_end,
)
from broker.keyspace.conformance_kit import (
    Check as Check,
)
from broker.keyspace.conformance_kit import (
    KeySpaceHarness,
    _aclose,
    _expect,
    _expect_raises,
    _scope,
    _summary,
    _watch_until,
)


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
        async with asyncio.timeout(conformance_kit.event_timeout_s):
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
