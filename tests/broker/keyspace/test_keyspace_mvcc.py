"""The sans-IO MVCC core: each operation, its error paths, history and leases."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.keyspace.backend import (
    CompactedError,
    Compare,
    CompareResult,
    CompareTarget,
    Event,
    EventType,
    FutureRevisionError,
    Header,
    KeyValue,
    LeaseNotFoundError,
    OpDelete,
    OpGet,
    OpPut,
)
from broker.keyspace.mvcc import (
    InvalidRequestError,
    LeaseExistsError,
    MVCCStore,
    in_range,
)

ALL = (b"\x00", b"\x00")  # key, range_end covering every key


def kvs(store: MVCCStore, revision: int = 0) -> dict[bytes, bytes]:
    return {kv.key: kv.value for kv in store.range(*ALL, revision=revision).kvs}


# -- Put, range, delete -------------------------------------------------------------------------


def test_fresh_store_is_at_revision_one_and_empty() -> None:
    store = MVCCStore()
    resp = store.range(*ALL)
    assert resp.header == Header(revision=1)
    assert resp.kvs == ()
    assert store.compact_revision == 0


def test_put_creates_then_updates() -> None:
    store = MVCCStore()
    h1, c1 = store.put(b"k", b"v1")
    assert h1.revision == 2
    assert c1.events == (Event(EventType.PUT, KeyValue(b"k", b"v1", 2, 2, 1)),)
    assert c1.priors == (None,)
    h2, c2 = store.put(b"k", b"v2")
    updated = KeyValue(b"k", b"v2", 2, 3, 2)
    assert h2.revision == 3
    assert c2.events == (Event(EventType.PUT, updated),)
    assert c2.priors == (KeyValue(b"k", b"v1", 2, 2, 1),)
    assert store.range(b"k").kvs == (updated,)


@pytest.mark.parametrize(
    ("key", "value", "lease", "error"),
    [
        (b"", b"v", 0, InvalidRequestError),
        (b"k", b"v" * 100, 0, InvalidRequestError),
        (b"k", b"v", -1, InvalidRequestError),
        (b"k", b"v", 7, LeaseNotFoundError),
    ],
    ids=["empty-key", "too-large", "negative-lease", "unknown-lease"],
)
def test_bad_put_raises_and_changes_nothing(
    key: bytes, value: bytes, lease: int, error: type[Exception]
) -> None:
    store = MVCCStore(request_bytes_max=64)
    store.put(b"k", b"before")
    with pytest.raises(error):
        store.put(key, value, lease)
    assert store.revision == 2
    assert kvs(store) == {b"k": b"before"}


def test_delete_single_and_range() -> None:
    store = MVCCStore()
    for k in (b"a", b"b/1", b"b/2", b"c"):
        store.put(k, k)
    header, deleted, commit = store.delete(b"b/", b"b0")
    assert (header.revision, deleted) == (6, 2)
    assert commit is not None
    assert [e.kv for e in commit.events] == [
        KeyValue(b"b/1", b"", 0, 6, 0),
        KeyValue(b"b/2", b"", 0, 6, 0),
    ]
    assert all(e.type == EventType.DELETE for e in commit.events)
    assert [p.key for p in commit.priors if p is not None] == [b"b/1", b"b/2"]
    header, deleted, commit = store.delete(b"a")
    assert (header.revision, deleted) == (7, 1)
    assert kvs(store) == {b"c": b"c"}


def test_delete_of_nothing_keeps_the_revision() -> None:
    store = MVCCStore()
    store.put(b"k", b"v")
    header, deleted, commit = store.delete(b"absent")
    assert (header.revision, deleted, commit) == (2, 0, None)
    with pytest.raises(InvalidRequestError, match="key is empty"):
        store.delete(b"")


def test_range_bounds() -> None:
    store = MVCCStore()
    for k in (b"a", b"a/1", b"a/2", b"ab", b"b"):
        store.put(k, b"")

    def keys(key: bytes, end: bytes | None) -> list[bytes]:
        return [kv.key for kv in store.range(key, end).kvs]

    assert keys(b"a", None) == [b"a"]
    assert keys(b"a/", None) == []
    assert keys(b"a/", b"a0") == [b"a/1", b"a/2"]
    assert keys(b"a/2", b"\x00") == [b"a/2", b"ab", b"b"]
    assert keys(b"b", b"a") == []
    assert in_range(b"z", b"a", b"\x00") and not in_range(b"a", b"b", b"\x00")


def test_range_rejects_bad_and_unavailable_revisions() -> None:
    store = MVCCStore()
    store.put(b"k", b"v")
    with pytest.raises(InvalidRequestError):
        store.range(b"")
    with pytest.raises(InvalidRequestError):
        store.range(b"k", revision=-1)
    with pytest.raises(FutureRevisionError, match="revision 3 is in the future"):
        store.range(b"k", revision=3)
    store.put(b"k", b"v2")
    store.compact(3)
    with pytest.raises(CompactedError) as info:
        store.range(b"k", revision=2)
    assert (info.value.requested, info.value.compact_revision) == (2, 3)
    assert store.range(b"k", revision=3).kvs[0].value == b"v2"


_ops = st.lists(
    st.tuples(
        st.sampled_from(["put", "delete", "delete-range"]),
        st.sampled_from([b"a", b"b", b"b/1", b"c"]),
        st.binary(max_size=3),
    ),
    max_size=30,
)


@given(_ops)
def test_range_at_every_past_revision_matches_a_snapshot(
    ops: list[tuple[str, bytes, bytes]],
) -> None:
    store = MVCCStore()
    snapshots: dict[int, dict[bytes, bytes]] = {store.revision: {}}
    for op, key, value in ops:
        if op == "put":
            store.put(key, value)
        elif op == "delete":
            store.delete(key)
        else:
            store.delete(key, b"\x00")
        snapshots[store.revision] = kvs(store)
    for rev, snapshot in snapshots.items():
        assert kvs(store, rev) == snapshot, f"at revision {rev}"
        sub = {k: v for k, v in snapshot.items() if k.startswith(b"b")}
        assert {kv.key: kv.value for kv in store.range(b"b", b"c", rev).kvs} == sub


@given(_ops)
def test_replaying_history_rebuilds_the_state(ops: list[tuple[str, bytes, bytes]]) -> None:
    store = MVCCStore()
    for op, key, value in ops:
        if op == "put":
            store.put(key, value)
        else:
            store.delete(key, b"\x00" if op == "delete-range" else None)
    events, last = store.replay(*ALL, start=1, end=store.revision, events_max=1000)
    assert last == store.revision
    state: dict[bytes, bytes] = {}
    for event in events:
        if event.type == EventType.PUT:
            state[event.kv.key] = event.kv.value
        else:
            del state[event.kv.key]
    assert state == kvs(store)


# -- Transactions -------------------------------------------------------------------------------


def _cmp(key: bytes, target: CompareTarget, result: CompareResult, value: int | bytes) -> Compare:
    return Compare(key, target, result, value)


@pytest.mark.parametrize(
    ("compare", "holds"),
    [
        (_cmp(b"k", CompareTarget.VERSION, CompareResult.EQUAL, 2), True),
        (_cmp(b"k", CompareTarget.VERSION, CompareResult.GREATER, 2), False),
        (_cmp(b"k", CompareTarget.CREATE, CompareResult.EQUAL, 2), True),
        (_cmp(b"k", CompareTarget.CREATE, CompareResult.LESS, 3), True),
        (_cmp(b"k", CompareTarget.MOD, CompareResult.EQUAL, 3), True),
        (_cmp(b"k", CompareTarget.MOD, CompareResult.NOT_EQUAL, 3), False),
        (_cmp(b"k", CompareTarget.VALUE, CompareResult.EQUAL, b"v2"), True),
        (_cmp(b"k", CompareTarget.VALUE, CompareResult.LESS, b"v10"), False),
        (_cmp(b"k", CompareTarget.VALUE, CompareResult.GREATER, b"v10"), True),
        (_cmp(b"k", CompareTarget.LEASE, CompareResult.EQUAL, 1), True),
        (_cmp(b"k", CompareTarget.LEASE, CompareResult.GREATER, 1), False),
        (_cmp(b"no", CompareTarget.VERSION, CompareResult.EQUAL, 0), True),
        (_cmp(b"no", CompareTarget.CREATE, CompareResult.EQUAL, 0), True),
        (_cmp(b"no", CompareTarget.MOD, CompareResult.GREATER, 0), False),
        (_cmp(b"no", CompareTarget.LEASE, CompareResult.EQUAL, 0), True),
        (_cmp(b"no", CompareTarget.VALUE, CompareResult.EQUAL, b""), False),
        (_cmp(b"no", CompareTarget.VALUE, CompareResult.NOT_EQUAL, b""), False),
    ],
)
def test_txn_compare(compare: Compare, holds: bool) -> None:
    store = MVCCStore()
    lease, _ = store.lease_grant(60, now=0.0)
    store.put(b"k", b"v1")
    store.put(b"k", b"v2", lease)  # created at 2, modified at 3, version 2, lease 1
    resp, commit = store.txn([compare], [OpGet(b"k")], [OpGet(b"no")])
    assert resp.succeeded is holds
    assert commit is None
    assert resp.header.revision == 3


def test_txn_runs_one_branch_as_one_revision() -> None:
    store = MVCCStore()
    store.put(b"old", b"o")
    holds = _cmp(b"old", CompareTarget.VERSION, CompareResult.EQUAL, 1)
    resp, commit = store.txn(
        [holds],
        [OpPut(b"a", b"1"), OpPut(b"b", b"2"), OpGet(b"a"), OpDelete(b"old")],
        [OpPut(b"never", b"x")],
    )
    assert resp.succeeded
    assert resp.header.revision == 3
    assert resp.results == (None, None, (KeyValue(b"a", b"1", 3, 3, 1),), 1)
    assert commit is not None and commit.revision == 3
    assert [(e.type, e.kv.key) for e in commit.events] == [
        (EventType.PUT, b"a"),
        (EventType.PUT, b"b"),
        (EventType.DELETE, b"old"),
    ]
    assert kvs(store) == {b"a": b"1", b"b": b"2"}

    resp, commit = store.txn([holds], [OpPut(b"never", b"x")], [OpGet(b"a")])
    assert not resp.succeeded and commit is None and resp.header.revision == 3


@pytest.mark.parametrize(
    ("compares", "success", "match"),
    [
        ([], [OpPut(b"a", b""), OpPut(b"a", b"")], "duplicate key"),
        ([], [OpPut(b"a/1", b""), OpDelete(b"a/", b"a0")], "both put and deleted"),
        ([], [OpPut(b"", b"")], "key is empty"),
        ([], [OpGet(b"")], "key is empty"),
        ([], [OpDelete(b"k")] * 4, "exceed the limit"),
        ([_cmp(b"k", CompareTarget.VALUE, CompareResult.EQUAL, 1)], [], "needs bytes"),
        ([_cmp(b"k", CompareTarget.VERSION, CompareResult.EQUAL, b"1")], [], "needs an int"),
        ([_cmp(b"k", CompareTarget.VERSION, CompareResult.EQUAL, True)], [], "needs an int"),
        ([_cmp(b"", CompareTarget.VERSION, CompareResult.EQUAL, 0)], [], "key is empty"),
        ([], ["not an op"], "expected OpPut"),
    ],
)
def test_invalid_txn_raises_and_changes_nothing(
    compares: list[Compare], success: list[object], match: str
) -> None:
    store = MVCCStore(txn_ops_max=3)
    store.put(b"k", b"v")
    with pytest.raises(InvalidRequestError, match=match):
        store.txn(compares, success, [])  # type: ignore[arg-type]
    assert store.revision == 2 and kvs(store) == {b"k": b"v"}


def test_txn_with_a_gone_lease_in_the_chosen_branch_changes_nothing() -> None:
    store = MVCCStore()
    resp, _ = store.txn([], [OpPut(b"a", b"")], [OpPut(b"b", b"", lease=9)])
    assert resp.succeeded  # the failure branch's lease is not checked
    with pytest.raises(LeaseNotFoundError):
        store.txn([], [OpPut(b"c", b""), OpPut(b"d", b"", lease=9)])
    assert kvs(store) == {b"a": b""}


# -- Compaction and replay ----------------------------------------------------------------------


def test_compact_errors() -> None:
    store = MVCCStore()
    store.put(b"k", b"v")
    with pytest.raises(FutureRevisionError):
        store.compact(3)
    store.compact(2)
    with pytest.raises(CompactedError):
        store.compact(2)
    with pytest.raises(CompactedError):
        store.compact(1)
    assert store.compact_revision == 2


def test_history_beyond_the_bound_is_compacted() -> None:
    store = MVCCStore(history_revisions_max=3)
    for i in range(10):
        store.put(b"k", str(i).encode())
    assert store.revision == 11
    assert store.compact_revision == 8
    assert kvs(store, 8) == {b"k": b"6"}
    with pytest.raises(CompactedError):
        store.range(b"k", revision=7)


def test_replay_batches_never_split_a_revision() -> None:
    store = MVCCStore()
    store.put(b"a", b"")  # 2
    store.txn([], [OpPut(b"b", b""), OpPut(b"c", b""), OpPut(b"d", b"")])  # 3
    store.put(b"x/outside", b"")  # 4
    store.put(b"e", b"")  # 5
    events, last = store.replay(b"a", b"x", 2, 5, events_max=2)
    assert ([e.kv.key for e in events], last) == ([b"a", b"b", b"c", b"d"], 3)
    events, last = store.replay(b"a", b"x", 4, 5, events_max=2)
    assert ([e.kv.key for e in events], last) == ([b"e"], 5)
    events, last = store.replay(b"a", b"x", 4, 4, events_max=2)
    assert (events, last) == ((), 4)


def test_replay_rejects_compacted_and_future_revisions() -> None:
    store = MVCCStore()
    store.put(b"a", b"")
    store.put(b"a", b"")
    store.compact(3)
    with pytest.raises(CompactedError):
        store.replay(*ALL, start=2, end=3, events_max=10)
    with pytest.raises(FutureRevisionError):
        store.replay(*ALL, start=3, end=4, events_max=10)
    events, _ = store.replay(*ALL, start=3, end=3, events_max=10)
    assert [e.kv.mod_revision for e in events] == [3]


def test_constructor_bounds() -> None:
    with pytest.raises(ValueError, match="history_revisions_max"):
        MVCCStore(history_revisions_max=0)
    with pytest.raises(ValueError, match="lease_ttl_min_s"):
        MVCCStore(lease_ttl_min_s=-1)
    with pytest.raises(ValueError, match="txn_ops_max"):
        MVCCStore(txn_ops_max=0)


# -- Leases -------------------------------------------------------------------------------------


def test_lease_grant() -> None:
    store = MVCCStore(lease_ttl_min_s=2)
    assert store.lease_grant(10, now=0.0) == (1, 10)
    assert store.lease_grant(1, now=0.0) == (2, 2)  # raised to the minimum, as etcd does
    assert store.lease_grant(5, now=0.0, lease_id=3) == (3, 5)
    assert store.lease_grant(5, now=0.0) == (4, 5)  # skips the explicitly chosen ID
    with pytest.raises(LeaseExistsError):
        store.lease_grant(5, now=0.0, lease_id=3)
    with pytest.raises(InvalidRequestError):
        store.lease_grant(5, now=0.0, lease_id=-1)
    with pytest.raises(InvalidRequestError):
        store.lease_grant(10**10, now=0.0)
    assert store.next_lease_deadline() == 2.0
    assert store.revision == 1  # leases are not key/value changes


def test_leased_keys_follow_their_lease() -> None:
    store = MVCCStore()
    lease, _ = store.lease_grant(10, now=0.0)
    other, _ = store.lease_grant(10, now=0.0)
    store.put(b"a", b"", lease)
    store.put(b"b", b"", lease)
    store.put(b"c", b"", lease)
    store.put(b"b", b"")  # detached
    store.put(b"c", b"", other)  # moved
    assert store.range(b"a").kvs[0].lease == lease
    assert store.lease_keys(lease) == [b"a"]
    assert store.lease_keys(other) == [b"c"]
    store.delete(b"c")
    assert store.lease_keys(other) == []


def test_revoke_deletes_keys_in_one_revision() -> None:
    store = MVCCStore()
    lease, _ = store.lease_grant(10, now=0.0)
    store.put(b"b", b"", lease)
    store.put(b"a", b"", lease)
    store.put(b"keep", b"")
    header, commit = store.lease_revoke(lease)
    assert header.revision == 5
    assert commit is not None
    assert [(e.type, e.kv.key) for e in commit.events] == [
        (EventType.DELETE, b"a"),
        (EventType.DELETE, b"b"),
    ]
    assert kvs(store) == {b"keep": b""}
    with pytest.raises(LeaseNotFoundError):
        store.lease_revoke(lease)
    with pytest.raises(LeaseNotFoundError):
        store.lease_keys(lease)
    empty, _ = store.lease_grant(10, now=0.0)
    assert store.lease_revoke(empty) == (Header(5), None)


def test_keepalive_extends_the_deadline() -> None:
    store = MVCCStore()
    lease, _ = store.lease_grant(10, now=0.0)
    store.put(b"k", b"", lease)
    assert store.lease_keepalive(lease, now=8.0) == 10
    assert store.next_lease_deadline() == 18.0
    assert store.expire(now=17.9) == []
    [commit] = store.expire(now=18.0)
    assert [e.kv.key for e in commit.events] == [b"k"]
    with pytest.raises(LeaseNotFoundError):
        store.lease_keepalive(lease, now=18.0)
    with pytest.raises(LeaseNotFoundError):
        store.lease_keepalive(99, now=0.0)


def test_keepalive_past_the_deadline_fails_before_expiry_runs() -> None:
    store = MVCCStore()
    lease, _ = store.lease_grant(10, now=0.0)
    with pytest.raises(LeaseNotFoundError):
        store.lease_keepalive(lease, now=10.0)
    assert store.next_lease_deadline() == 10.0  # still there until expire() revokes it


def test_expire_revokes_due_leases_earliest_first() -> None:
    store = MVCCStore()
    late, _ = store.lease_grant(20, now=0.0)
    early, _ = store.lease_grant(10, now=0.0)
    bare, _ = store.lease_grant(5, now=0.0)  # no keys: expires without a revision
    store.put(b"late", b"", late)
    store.put(b"early", b"", early)
    commits = store.expire(now=30.0)
    assert [[e.kv.key for e in c.events] for c in commits] == [[b"early"], [b"late"]]
    assert [c.revision for c in commits] == [4, 5]
    assert store.next_lease_deadline() is None
    with pytest.raises(LeaseNotFoundError):
        store.lease_revoke(bare)
