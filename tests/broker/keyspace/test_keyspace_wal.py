"""The persisted keyspace's layers below the store: record framing (torn tails versus
corruption), the change and snapshot codec, and the MVCC core's redo of recorded changes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.keyspace.backend import Event, EventType, KeyValue
from broker.keyspace.change_codec import (
    ChangeDecodeError,
    decode_change,
    decode_state,
    encode_change,
    encode_state,
)
from broker.keyspace.changes import (
    Change,
    Commit,
    Committed,
    Compacted,
    LeaseGranted,
    LeaseRevoked,
    RedoError,
    StoreState,
)
from broker.keyspace.mvcc import MVCCStore
from broker.keyspace.wal import CorruptLogError, frame, header_bytes, scan_records

ALL = (b"\x00", b"\x00")
PATH = "/keyspace/wal-0.log"


def log_of(*payloads: bytes) -> bytes:
    return b"".join(frame(p) for p in payloads)


# -- Framing: torn tails are dropped, damage before the tail is an error ---------------------


def test_intact_log_scans_whole() -> None:
    data = log_of(b"one", b"two", b"three")
    scan = scan_records(data, PATH)
    assert [p for _, p in scan.records] == [b"one", b"two", b"three"]
    assert [o for o, _ in scan.records] == [0, header_bytes + 3, 2 * header_bytes + 6]
    assert (scan.end, scan.torn) == (len(data), None)


@pytest.mark.parametrize(
    ("tail", "found"),
    [
        (frame(b"last")[:5], "partial record header"),
        (frame(b"last")[: header_bytes + 2], "partial record"),
        (frame(b"last")[:-1] + b"X", "final record whose checksum"),
        (b"\x00" * 40, "zero bytes"),
        (frame(b"last")[:-2] + b"XX" + b"\x00" * 30, "final record whose checksum"),
    ],
    ids=["partial-header", "partial-payload", "bad-final-checksum", "zeros", "bad-then-zeros"],
)
def test_torn_tail_is_dropped(tail: bytes, found: str) -> None:
    intact = log_of(b"one", b"two")
    scan = scan_records(intact + tail, PATH)
    assert [p for _, p in scan.records] == [b"one", b"two"]
    assert scan.end == len(intact)
    assert scan.torn is not None and found in scan.torn


def test_bad_payload_checksum_before_the_tail_is_corruption() -> None:
    data = bytearray(log_of(b"one", b"two", b"three"))
    second = header_bytes + 3
    data[second + header_bytes] ^= 0xFF  # A byte of "two"'s payload.
    with pytest.raises(CorruptLogError) as info:
        scan_records(bytes(data), PATH)
    assert (info.value.path, info.value.offset) == (PATH, second)
    assert "checksum mismatch" in str(info.value) and PATH in str(info.value)


def test_damaged_length_is_corruption_not_a_torn_tail() -> None:
    # A length damaged into "longer than the file" must not swallow the records after it.
    data = bytearray(log_of(b"one", b"two", b"three"))
    data[0] = 0xFF
    with pytest.raises(CorruptLogError, match="header checksum") as info:
        scan_records(bytes(data), PATH)
    assert info.value.offset == 0


def test_frame_refuses_empty_payload() -> None:
    with pytest.raises(ValueError, match="record payload"):
        frame(b"")


# -- The codec ----------------------------------------------------------------------------------

keys = st.binary(min_size=1, max_size=12)
i64 = st.integers(min_value=0, max_value=2**63 - 1)
kvs = st.builds(KeyValue, keys, st.binary(max_size=20), i64, i64, i64, i64)
events = st.lists(st.builds(Event, st.sampled_from(EventType), kvs), min_size=1, max_size=4)


def commit_of(revision: int, evs: list[Event]) -> Commit:
    return Commit(revision, tuple(evs), (None,) * len(evs))


changes = st.one_of(
    st.builds(lambda r, e: Committed(commit_of(r, e)), i64, events),
    st.builds(LeaseGranted, i64, i64),
    st.builds(
        lambda i, r, e: LeaseRevoked(i, commit_of(r + 1, e)),
        i64.map(lambda v: v // 2),
        i64.map(lambda v: v // 2),
        events,
    ),
    st.builds(lambda i: LeaseRevoked(i, None), i64),
    st.builds(Compacted, i64),
)


@given(changes)
def test_changes_round_trip(change: Change) -> None:
    assert decode_change(encode_change(change)) == change


@given(
    i64,
    i64,
    i64,
    st.lists(st.tuples(i64, i64), max_size=3),
    st.lists(kvs, max_size=5),
    st.lists(st.builds(Event, st.sampled_from(EventType), kvs), max_size=3),
)
def test_states_round_trip(
    revision: int,
    compact: int,
    next_lease: int,
    leases: list[tuple[int, int]],
    kv_list: list[KeyValue],
    last: list[Event],
) -> None:
    state = StoreState(revision, compact, next_lease, tuple(leases), tuple(kv_list), tuple(last))
    assert decode_state(encode_state(state)) == state


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x09", "unknown change kind 9"),
        (encode_change(Compacted(3))[:-1], "truncated"),
        (encode_change(Compacted(3)) + b"x", "left over"),
        (encode_change(LeaseGranted(1, 10))[:1] + b"\x00" * 3, "truncated"),
    ],
)
def test_undecodable_changes_are_refused(data: bytes, message: str) -> None:
    with pytest.raises(ChangeDecodeError, match=message):
        decode_change(data)


# -- Redo: a rebuilt core equals the one that recorded the changes ------------------------------


def recorded_history() -> tuple[MVCCStore, list[Change]]:
    core = MVCCStore(record_changes=True, history_revisions_max=5)
    lease, _ = core.lease_grant(10, now=0.0)
    core.put(b"a", b"1")
    core.put(b"b", b"2", lease)
    core.put(b"a", b"3")
    core.delete(b"a")
    core.txn([], [], [])  # Changes nothing: nothing recorded.
    empty, _ = core.lease_grant(10, now=0.0)
    core.lease_revoke(empty)
    core.compact(core.revision - 1)
    for i in range(8):  # Past history_revisions_max: automatic compactions, not recorded.
        core.put(b"c", str(i).encode())
    core.expire(now=100.0)  # Revokes `lease`, deleting b.
    return core, core.take_changes()


def test_redo_rebuilds_the_same_store() -> None:
    core, changes = recorded_history()
    assert not any(isinstance(c, Compacted) and c.revision > 4 for c in changes)
    rebuilt = MVCCStore(history_revisions_max=5)
    for change in changes:
        rebuilt.redo(decode_change(encode_change(change)))
    assert rebuilt.state() == core.state()
    assert rebuilt.compact_revision == core.compact_revision
    # History too: an older revision reads alike, and replays the same events.
    old = core.revision - 2
    assert rebuilt.range(*ALL, revision=old) == core.range(*ALL, revision=old)
    assert rebuilt.replay(*ALL, old, core.revision, 100) == core.replay(
        *ALL, old, core.revision, 100
    )
    assert core.take_changes() == []


def test_load_state_then_redo_continues() -> None:
    core, changes = recorded_history()
    half = len(changes) // 2
    first = MVCCStore(history_revisions_max=5)
    for change in changes[:half]:
        first.redo(change)
    second = MVCCStore(history_revisions_max=5)
    second.load_state(decode_state(encode_state(first.state())))
    assert second.compact_revision == first.revision  # History before a snapshot is gone.
    for change in changes[half:]:
        second.redo(change)
    assert second.state() == core.state()


def test_load_state_keeps_the_events_of_its_revision_for_watches() -> None:
    core = MVCCStore()
    core.put(b"a", b"1")
    _, commit = core.put(b"b", b"2")
    loaded = MVCCStore()
    loaded.load_state(core.state())
    assert loaded.replay(*ALL, commit.revision, commit.revision, 10) == (
        commit.events,
        commit.revision,
    )


def test_restored_leases_are_due_at_once_and_expire_all_revokes_them() -> None:
    core = MVCCStore(record_changes=True)
    lease, _ = core.lease_grant(3600, now=0.0)
    core.put(b"member", b"x", lease)
    rebuilt = MVCCStore(record_changes=True)
    for change in core.take_changes():
        rebuilt.redo(change)
    [commit] = rebuilt.expire_all()
    assert [(e.type, e.kv.key) for e in commit.events] == [(EventType.DELETE, b"member")]
    assert rebuilt.take_changes() == [LeaseRevoked(lease, commit)]
    assert rebuilt.lease_grant(10, now=0.0)[0] == lease + 1  # IDs are not reused.


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            Committed(commit_of(9, [Event(EventType.PUT, KeyValue(b"k", b"", 9, 9, 1))])),
            "does not follow revision",
        ),
        (
            Committed(commit_of(3, [Event(EventType.PUT, KeyValue(b"a", b"", 3, 3, 1))])),
            "put of b'a' does not follow",
        ),
        (
            Committed(commit_of(3, [Event(EventType.DELETE, KeyValue(b"zz", b"", 0, 3, 0))])),
            "delete of b'zz'",
        ),
        (
            Committed(commit_of(3, [Event(EventType.PUT, KeyValue(b"k", b"", 3, 3, 1, 77))])),
            "put of b'k'",
        ),
        (LeaseGranted(1, 10), "already granted"),
        (LeaseRevoked(5, None), "does not exist"),
        (LeaseRevoked(1, None), "the lease has 1"),
        (Compacted(50), "past revision"),
    ],
)
def test_redo_refuses_changes_that_do_not_follow(change: Change, message: str) -> None:
    core = MVCCStore(record_changes=True)
    lease, _ = core.lease_grant(10, now=0.0)
    core.put(b"a", b"1", lease)
    rebuilt = MVCCStore()
    for recorded in core.take_changes():
        rebuilt.redo(recorded)
    before = rebuilt.state()
    with pytest.raises(RedoError, match=message):
        rebuilt.redo(change)
    assert rebuilt.state() == before


def test_load_state_refuses_inconsistent_snapshots() -> None:
    good = StoreState(3, 0, 2, ((1, 10),), (KeyValue(b"a", b"", 2, 3, 2, 1),), ())
    MVCCStore().load_state(good)
    bad = [
        StoreState(3, 4, 2, (), (), ()),
        StoreState(3, 0, 2, (), (KeyValue(b"a", b"", 2, 3, 2, 1),), ()),
        StoreState(3, 0, 2, (), (KeyValue(b"b", b"", 2, 3, 2), KeyValue(b"a", b"", 2, 3, 2)), ()),
        StoreState(3, 0, 2, (), (KeyValue(b"a", b"", 2, 9, 2),), ()),
    ]
    for state in bad:
        with pytest.raises(RedoError):
            MVCCStore().load_state(state)
    used = MVCCStore()
    used.put(b"x", b"")
    with pytest.raises(ValueError, match="not fresh"):
        used.load_state(good)
