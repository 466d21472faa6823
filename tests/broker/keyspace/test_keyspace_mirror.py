"""KeySpace: the pure apply_events, lookups, and the watch loop's retries and waiters."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.keyspace.backend import (
    Event,
    EventType,
    Header,
    KeyValue,
    UnavailableError,
    WatchResponse,
)
from broker.keyspace.embedded import EmbeddedBackend
from broker.keyspace.keyspace import (
    ApplyIssue,
    Entry,
    InvalidRootError,
    KeySpace,
    WatchStoppedError,
    apply_events,
)

wait_s = 5.0  # upper bound on waits that should end promptly


def decode(kv: KeyValue) -> str:
    if kv.value.startswith(b"bad"):
        raise ValueError("bad value")
    return kv.value.decode()


def put(key: bytes, value: bytes, create: int, mod: int, version: int) -> Event:
    return Event(EventType.PUT, KeyValue(key, value, create, mod, version))


def delete(key: bytes, mod: int) -> Event:
    return Event(EventType.DELETE, KeyValue(key, b"", 0, mod, 0))


def entry(key: bytes, value: bytes, create: int, mod: int, version: int) -> Entry[str]:
    return Entry(KeyValue(key, value, create, mod, version), value.decode())


BASE = [entry(b"a", b"a", 2, 2, 1), entry(b"c", b"c", 3, 5, 2), entry(b"e", b"e", 4, 4, 1)]


# -- apply_events -------------------------------------------------------------------------------


def test_apply_inserts_updates_and_deletes_in_one_pass() -> None:
    before = list(BASE)
    out, issues = apply_events(
        BASE,
        [
            put(b"d", b"d", 6, 6, 1),
            put(b"c", b"c2", 3, 6, 3),
            delete(b"a", 6),
            put(b"b", b"b", 7, 7, 1),
        ],
        decode,
    )
    assert out == [
        entry(b"b", b"b", 7, 7, 1),
        entry(b"c", b"c2", 3, 6, 3),
        entry(b"d", b"d", 6, 6, 1),
        entry(b"e", b"e", 4, 4, 1),
    ]
    assert issues == []
    assert BASE == before  # pure


def test_apply_keeps_revision_order_of_one_key() -> None:
    out, issues = apply_events(
        BASE,
        [put(b"b", b"b1", 6, 6, 1), delete(b"b", 7), put(b"b", b"b2", 8, 8, 1)],
        decode,
    )
    assert out[1] == entry(b"b", b"b2", 8, 8, 1)
    assert issues == []


def test_apply_skips_values_that_fail_to_decode() -> None:
    out, issues = apply_events(
        BASE, [put(b"b", b"bad", 6, 6, 1), put(b"c", b"bad", 3, 6, 3)], decode
    )
    assert out == BASE  # a new bad key is left out; a bad update keeps the previous value
    assert [i.problem for i in issues] == [
        "value failed to decode (left out)",
        "value failed to decode (previous value kept)",
    ]
    assert all(isinstance(i.error, ValueError) for i in issues)


def test_apply_repairs_after_skipped_values() -> None:
    out, issues = apply_events(
        BASE,
        [put(b"b", b"fixed", 6, 8, 2), delete(b"x", 8), put(b"c", b"c3", 3, 8, 4)],
        decode,
    )
    assert entry(b"b", b"fixed", 6, 8, 2) in out
    assert entry(b"c", b"c3", 3, 8, 4) in out
    assert issues == [
        ApplyIssue(b"b", "update of a key not in the mirror (applied as a creation)"),
        ApplyIssue(b"c", "version skipped from 2 (applied)"),
        ApplyIssue(b"x", "deletion of a key not in the mirror (ignored)"),
    ]


def test_apply_ignores_stale_events_and_flags_odd_ones() -> None:
    out, issues = apply_events(BASE, [put(b"c", b"old", 3, 4, 1), delete(b"a", 2)], decode)
    assert out == BASE
    assert [i.problem for i in issues] == [
        "stale event at revision 2 (have 2)",
        "stale event at revision 4 (have 5)",
    ]
    out, issues = apply_events(BASE, [put(b"e", b"e2", 9, 9, 1)], decode)
    assert out[-1] == entry(b"e", b"e2", 9, 9, 1)
    assert [i.problem for i in issues] == ["create revision changed without a deletion (applied)"]


@given(
    st.lists(
        st.tuples(st.sampled_from([b"a", b"b", b"c", b"d"]), st.none() | st.binary(max_size=2)),
        max_size=40,
    ),
    st.integers(min_value=1, max_value=8),
)
def test_apply_matches_a_dict_model(changes: list[tuple[bytes, bytes | None]], batch: int) -> None:
    """Events applied in batches of any size give the same state as a dict."""
    model: dict[bytes, KeyValue] = {}
    events: list[Event] = []
    for rev, (key, value) in enumerate(changes, start=2):
        prior = model.get(key)
        if value is None:
            if prior is not None:
                del model[key]
                events.append(delete(key, rev))
            continue
        kv = (
            KeyValue(key, value, rev, rev, 1)
            if prior is None
            else KeyValue(key, value, prior.create_revision, rev, prior.version + 1)
        )
        model[key] = kv
        events.append(Event(EventType.PUT, kv))
    entries: list[Entry[bytes]] = []
    for i in range(0, len(events), batch):
        entries, issues = apply_events(entries, events[i : i + batch], lambda kv: kv.value)
        assert issues == []
    assert entries == [Entry(model[k], model[k].value) for k in sorted(model)]


# -- Roots and lookups --------------------------------------------------------------------------


@pytest.mark.parametrize("root", ["", "a/", "/a/", "/a//b", "/a/./b", "/a/../b", "//a", b"\xff"])
def test_root_must_be_a_clean_path(root: str | bytes) -> None:
    with pytest.raises(InvalidRootError):
        KeySpace(root, decode)


@pytest.mark.parametrize("root", ["/", "/a", "/a/b", "a", b"/gazette/cluster"])
def test_clean_roots_are_accepted(root: str | bytes) -> None:
    assert KeySpace(root, decode).root == (root if isinstance(root, bytes) else root.encode())


def test_lookups() -> None:
    ks = KeySpace("/r", decode)
    ks.kvs = [
        entry(b"/r/a", b"1", 2, 2, 1),
        entry(b"/r/a/x", b"2", 2, 2, 1),
        entry(b"/r/ab", b"3", 2, 2, 1),
        entry(b"/r/b", b"4", 2, 2, 1),
        entry(b"/r/\xff", b"5", 2, 2, 1),
    ]
    assert ks.get("/r/ab") == ks.kvs[2]
    assert ks.get(b"/r/aa") is None
    assert ks.index("/r/aa") == (2, False)
    assert ks.index("/r/b") == (3, True)
    assert [e.decoded for e in ks.search("/r/a")] == ["1", "2", "3"]
    assert [e.decoded for e in ks.search("/r/a/")] == ["2"]
    assert [e.decoded for e in ks.search(b"/r/\xff")] == ["5"]
    assert ks.search("/s") == []
    assert [e.decoded for e in ks.range("/r/a/", "/r/b")] == ["2", "3"]


# -- Load, watch, waiters -----------------------------------------------------------------------


async def test_load_at_a_revision_records_that_revision() -> None:
    backend = EmbeddedBackend()
    h1 = await backend.put(b"/r/a", b"one")
    await backend.put(b"/r/a", b"two")
    await backend.put(b"/r/b", b"bad")
    await backend.put(b"/rx", b"outside-but-prefixed")  # Gazette roots are plain prefixes
    await backend.put(b"/q", b"outside")
    ks = KeySpace("/r", decode)
    calls: list[int] = []
    ks.observers.append(lambda: calls.append(ks.header.revision))
    await ks.load(backend, h1.revision)
    assert ks.header.revision == h1.revision
    assert [(e.kv.key, e.decoded) for e in ks.kvs] == [(b"/r/a", "one")]
    await ks.load(backend)
    assert ks.header.revision == backend.store.core.revision
    assert [(e.kv.key, e.decoded) for e in ks.kvs] == [
        (b"/r/a", "two"),
        (b"/rx", "outside-but-prefixed"),
    ]
    assert calls == [h1.revision, ks.header.revision]
    await backend.close()


def test_apply_advances_the_header_once_per_batch() -> None:
    ks = KeySpace("/r", decode)
    calls: list[tuple[int, int]] = []
    ks.observers.append(lambda: calls.append((ks.header.revision, len(ks.kvs))))
    ks.apply(
        WatchResponse(Header(2), (put(b"/r/a", b"a", 2, 2, 1),)),
        WatchResponse(Header(3), (put(b"/r/b", b"b", 3, 3, 1),)),
    )
    assert calls == [(3, 2)]
    ks.apply(WatchResponse(Header(3), (put(b"/r/c", b"c", 3, 3, 1),)))  # logged, applied
    assert calls[-1] == (3, 3)


async def test_watch_loads_first_and_follows() -> None:
    backend = EmbeddedBackend()
    await backend.put(b"/r/a", b"a")
    ks = KeySpace("/r", decode)
    task = asyncio.create_task(ks.watch(backend))
    h = await backend.put(b"/r/b", b"b")
    await ks.wait_for_revision(h.revision, wait_s)
    assert [e.decoded for e in ks.kvs] == ["a", "b"]
    await backend.close()
    await asyncio.wait_for(task, wait_s)  # the backend closing ends the watch
    with pytest.raises(WatchStoppedError, match="watch ended"):
        await ks.wait_for_revision(h.revision + 1, wait_s)
    await ks.wait_for_revision(h.revision, wait_s)  # reached revisions still return


async def test_wait_for_revision_times_out() -> None:
    ks = KeySpace("/r", decode)
    with pytest.raises(TimeoutError, match=r"revision 5 not reached within 0\.01s"):
        await ks.wait_for_revision(5, 0.01)


class AlwaysBroken(EmbeddedBackend):
    """A backend whose watches always fail, as if its server were down."""

    def watch(
        self, key: bytes, range_end: bytes | None = None, start_revision: int = 0
    ) -> AsyncIterator[WatchResponse]:
        raise UnavailableError("down")


async def test_watch_gives_up_after_the_attempt_bound_with_backoff() -> None:
    delays: list[float] = []

    async def sleep(delay_s: float) -> None:
        delays.append(delay_s)

    ks = KeySpace(
        "/r", decode, watch_attempts_max=6, backoff_initial_s=0.1, backoff_max_s=0.5, sleep=sleep
    )
    waiter = asyncio.create_task(ks.wait_for_revision(100, wait_s))
    with pytest.raises(UnavailableError, match="down"):
        await ks.watch(AlwaysBroken())
    assert delays == [0.0, 0.1, 0.2, 0.4, 0.5]
    with pytest.raises(WatchStoppedError) as info:
        await waiter  # failed at once, not left to time out
    assert isinstance(info.value.__cause__, UnavailableError)


async def test_watch_resumes_after_breaks() -> None:
    backend = EmbeddedBackend()
    ks = KeySpace("/r", decode)
    task = asyncio.create_task(ks.watch(backend))
    for i in range(5):
        h = await backend.put(b"/r/k", str(i).encode())
        backend.break_watches()
    await ks.wait_for_revision(h.revision, wait_s)
    assert ks.get("/r/k") == Entry(KeyValue(b"/r/k", b"4", 2, 6, 5), "4")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await backend.close()


def test_constructor_bounds() -> None:
    with pytest.raises(ValueError, match="watch_attempts_max"):
        KeySpace("/r", decode, watch_attempts_max=0)
    with pytest.raises(ValueError, match="backoff"):
        KeySpace("/r", decode, backoff_initial_s=1.0, backoff_max_s=0.5)
