"""Parsing the allocator keyspace into a State: keys, rules, counts, the leader, and what is
left out (and why)."""

from __future__ import annotations

import math

import pytest
from allocator_testkit import ROOT, Fixture, entries, int_value

from broker.allocator.state import (
    Assignment,
    InvalidStateError,
    Item,
    Member,
    MemberId,
    State,
    assignment_key,
    build_state,
    item_assignments_prefix,
    item_key,
    member_key,
    parse_member_id,
    parse_state,
    slot_max,
)
from broker.keyspace.backend import KeyValue
from broker.keyspace.keyspace import Entry

A = MemberId("zone-a", "A")
B = MemberId("zone-b", "B")


def kv(
    key: str | bytes, value: bytes = b"", create: int = 1, mod: int = 1, lease: int = 0
) -> KeyValue:
    raw = key.encode() if isinstance(key, str) else key
    return KeyValue(raw, value, create, mod, 1, lease)


def parse(*kvs: KeyValue) -> tuple[list[str], State]:
    state = parse_state(ROOT, 9, entries(kvs), replication_of=int_value, item_limit_of=int_value)
    return list(state.issues), state


def test_keys_are_gazettes_layout() -> None:
    assert item_key(ROOT, "a/journal") == b"/root/items/a/journal"
    assert member_key(ROOT, A) == b"/root/members/zone-a#A"
    assert assignment_key(ROOT, "a/journal", A, 2) == b"/root/assign/a/journal#zone-a#A#2"
    # The trailing separator keeps "a/b" from matching the assignments of "a/bc".
    assert item_assignments_prefix(ROOT, "a/b") == b"/root/assign/a/b#"
    assert str(A) == "zone-a#A"


def test_parse_items_members_assignments() -> None:
    f = Fixture()
    f.insert(
        ("items/item-2", 2),
        ("items/item-1", 1),
        ("members/zone-b#B", 4),
        ("members/zone-a#A", 2),
        ("assign/item-2#zone-b#B#0", "consistent"),
        ("assign/item-2#zone-a#A#1", ""),
        ("assign/item-1#zone-a#A#0", "x"),
        # An assignment of an item that does not exist: parsed, but not counted as load.
        ("assign/gone#zone-a#A#0", ""),
    )
    state = f.state()
    assert state.issues == ()
    assert list(state.items) == ["item-1", "item-2"]
    assert [i.replication for i in state.items.values()] == [1, 2]
    assert list(state.members) == [A, B]
    assert [m.item_limit for m in state.members.values()] == [2, 4]
    assert state.zones == ("zone-a", "zone-b")
    assert [(a.member, a.slot, a.value) for a in state.assignments_of("item-2")] == [
        (A, 1, b""),
        (B, 0, b"consistent"),
    ]
    assert list(state.assignments) == ["gone", "item-1", "item-2"]
    assert state.member_total == {A: 2, B: 1}
    assert state.member_primary == {A: 1, B: 1}
    assert state.item_slots == 3
    assert state.member_slots == 6
    assert [a.item_id for a in state.local_assignments(A)] == ["item-1", "item-2"]
    assert state.revision == f.store.revision
    # Assignments carry the member's lease, as the allocator must when it creates them.
    assert state.assignments_of("item-1")[0].kv.lease == f.leases[A]
    assert state.assignments_of("item-1")[0].is_primary


def test_leader_is_the_member_created_first() -> None:
    f = Fixture()
    f.member("zone-b#B", 1)  # Created first, though it sorts last.
    f.member("zone-a#A", 1)
    assert f.state().leader == B
    # Updating a member's value keeps its create revision, and so its leadership.
    f.member("zone-b#B", 7)
    assert f.state().leader == B
    f.revoke("zone-b#B")
    assert f.state().leader == A
    f.revoke("zone-a#A")
    assert f.state().leader is None


def test_leader_tie_breaks_on_key() -> None:
    state = build_state(
        ROOT,
        5,
        [],
        [
            Member(B, 1, kv(member_key(ROOT, B), create=3)),
            Member(A, 1, kv(member_key(ROOT, A), create=3)),
        ],
        [],
    )
    assert state.leader == A


def test_keys_outside_the_allocator_prefixes_are_ignored_silently() -> None:
    issues, state = parse(
        kv("/root/other/thing", b"zzz"),
        kv("/rootx/items/item-1", b"1"),  # Another root sharing the prefix.
        kv("/root/items/item-1", b"1"),
    )
    assert issues == []
    assert list(state.items) == ["item-1"]


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("/root/members/no-separator", b"1", "expected <zone>#<suffix>"),
        ("/root/members/zone#", b"1", "must not be empty"),
        ("/root/members/zo ne#s", b"1", "must not contain ' '"),
        ("/root/items/", b"1", "must not be empty"),
        ("/root/items/has#hash", b"1", "must not contain '#'"),
        ("/root/items/item", b"-1", "must be an int >= 0"),
        ("/root/items/item", b"three", "invalid literal"),
        ("/root/members/z#s", b"-4", "must be an int >= 0"),
        ("/root/assign/item#z#s", b"", "expected <item>#<zone>#<suffix>#<slot>"),
        ("/root/assign/item#z#s#0#1", b"", "expected <item>#<zone>#<suffix>#<slot>"),
        ("/root/assign/item#z#s#01", b"", "slot must be a decimal integer"),
        ("/root/assign/item#z#s#-1", b"", "slot must be a decimal integer"),
        ("/root/assign/item#z#s#+1", b"", "slot must be a decimal integer"),
        ("/root/assign/item#z#s#x", b"", "slot must be a decimal integer"),
        (f"/root/assign/item#z#s#{slot_max + 1}", b"", f"slot must be <= {slot_max}"),
        ("/root/assign/item##s#0", b"", "must not be empty"),
    ],
)
def test_malformed_entries_are_left_out_with_a_reason(key: str, value: bytes, why: str) -> None:
    issues, state = parse(kv(key, value), kv("/root/items/fine", b"2"))
    assert len(issues) == 1
    assert issues[0].startswith(key)
    assert why in issues[0]
    # The rest of the keyspace is still served.
    assert list(state.items) == ["fine"]


def test_non_utf8_allocator_key_is_an_issue() -> None:
    issues, _ = parse(kv(b"/root/items/\xff", b"1"), kv(b"/elsewhere/\xff", b"1"))
    assert issues == ["b'/root/items/\\xff': key is not UTF-8"]


def test_rules_receive_the_decoded_entry() -> None:
    seen: list[object] = []

    def replication(entry: Entry[str]) -> int:
        seen.append(entry.decoded)
        return 3

    state = parse_state(
        ROOT,
        1,
        [Entry(kv("/root/items/i", b"ignored"), "decoded!")],
        replication_of=replication,
        item_limit_of=lambda e: 0,
    )
    assert seen == ["decoded!"]
    assert state.items["i"].replication == 3


def test_rule_returning_a_bool_is_rejected() -> None:
    # True is an int in Python; a rule returning it is almost certainly a bug.
    state = parse_state(
        ROOT,
        1,
        entries([kv("/root/items/i", b"")]),
        replication_of=lambda e: True,
        item_limit_of=int_value,
    )
    assert state.items == {}
    assert "must be an int >= 0 (got True)" in state.issues[0]


def _item(item_id: str, r: int = 1) -> Item:
    return Item(item_id, r, kv(item_key(ROOT, item_id)))


def _member(m: MemberId, limit: int = 1) -> Member:
    return Member(m, limit, kv(member_key(ROOT, m)))


def _assignment(item_id: str, m: MemberId, slot: int) -> Assignment:
    return Assignment(item_id, m, slot, kv(assignment_key(ROOT, item_id, m, slot)))


@pytest.mark.parametrize(
    ("items", "members", "assignments", "why"),
    [
        ([_item("i"), _item("i")], [], [], "item 'i': duplicate"),
        ([_item("i", -1)], [], [], "replication must be >= 0"),
        ([_item("bad id")], [], [], "must not contain ' '"),
        ([], [_member(A), _member(A)], [], "member zone-a#A: duplicate"),
        ([], [_member(A, -1)], [], "item limit must be >= 0"),
        ([], [_member(MemberId("z#", "s"))], [], "must not contain '#'"),
        ([], [], [_assignment("i", A, 0), _assignment("i", A, 0)], "duplicate"),
        ([], [], [_assignment("i", A, slot_max + 1)], "slot out of range"),
    ],
)
def test_build_state_rejects_inconsistent_parts(
    items: list[Item], members: list[Member], assignments: list[Assignment], why: str
) -> None:
    with pytest.raises(InvalidStateError, match=why):
        build_state(ROOT, 1, items, members, assignments)


def test_build_state_rejects_negative_revision() -> None:
    with pytest.raises(InvalidStateError, match="revision"):
        build_state(ROOT, -1, [], [], [])


def test_parse_member_id() -> None:
    assert parse_member_id("zone-a#A") == A
    with pytest.raises(InvalidStateError):
        parse_member_id("zone-a")
    with pytest.raises(InvalidStateError):
        parse_member_id("a#b#c")


def test_network_key_tracks_items_and_members_but_not_assignments() -> None:
    f = Fixture()
    f.insert(("items/i", 2), ("members/zone-a#A", 3))
    key = f.state().network_key()
    f.assign("i", "zone-a#A", 0)
    assert f.state().network_key() == key
    f.item("i", 3)
    assert f.state().network_key() != key
    key = f.state().network_key()
    f.member("zone-a#A", 4)
    assert f.state().network_key() != key


def test_load_ratio() -> None:
    f = Fixture()
    f.insert(("members/zone-a#A", 4), ("members/zone-b#B", 0))
    state = f.state()
    assert state.load_ratio(A, {A: 2}) == 0.5
    assert state.load_ratio(A, {}) == 0.0
    # Drained and missing members are infinitely loaded: they shed first, are promoted last.
    assert state.load_ratio(B, {B: 1}) == math.inf
    assert state.load_ratio(MemberId("zone-c", "C"), {}) == math.inf
