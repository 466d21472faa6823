"""Exiting members: capacity shed only from the cluster's excess (Gazette's ShedCapacity).

An exiting member keeps its item limit in its member key and is marked exiting. The allocator
sheds exiting members' capacity, oldest member first, only from the excess of the members'
slots over the items' replicas, and never from more than ``len(members) - max replication``
members. So where capacity is tight, an exiting member whose capacity is needed keeps its items
until others can take them, instead of leaving items short of replicas. The cases mirror
Gazette's alloc_state_test (TestShedCapacity*, TestLoadRatioWithShedding)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from broker.allocator import (
    MemberId,
    assignment_key,
    broker_exiting,
    broker_item_limit,
    item_key,
    member_key,
    parse_state,
)
from broker.allocator.solver import solve_state
from broker.allocator.state import State
from broker.keyspace.backend import KeyValue
from broker.keyspace.keyspace import Entry
from broker.protocol import protocol_pb2 as pb
from broker.topology import Member

ROOT = "/root"


def state(
    items: dict[str, int],
    members: Sequence[tuple[str, int, bool]],
    assignments: Sequence[tuple[str, str, int]] = (),
) -> State:
    """Members as (zone#suffix, limit, exiting), created in list order (oldest first)."""
    entries: list[Entry[object]] = []
    for name, replication in items.items():
        entries.append(Entry(KeyValue(item_key(ROOT, name), b"", 1, 1, 1), replication))
    for revision, (ident, limit, exiting) in enumerate(members, start=10):
        zone, suffix = ident.split("#")
        spec = pb.BrokerSpec(journal_limit=limit, exiting=exiting)
        kv = KeyValue(member_key(ROOT, MemberId(zone, suffix)), b"", revision, revision, 1)
        entries.append(Entry(kv, Member(zone, suffix, spec)))
    for item, ident, slot in assignments:
        zone, suffix = ident.split("#")
        key = assignment_key(ROOT, item, MemberId(zone, suffix), slot)
        entries.append(Entry(KeyValue(key, b"consistent", 1, 1, 1), None))
    return parse_state(
        ROOT,
        100,
        entries,
        replication_of=lambda e: int(e.decoded),  # type: ignore[call-overload]
        item_limit_of=broker_item_limit,
        exiting_of=broker_exiting,
    )


def limits(s: State) -> dict[str, int]:
    return {str(m.id): m.item_limit for m in s.members.values()}


def test_exiting_member_sheds_fully_when_the_cluster_has_room() -> None:
    s = state(
        {"item-a": 1, "item-b": 1},
        [("zone-a#m1", 5, True), ("zone-a#m2", 5, False)],
        [("item-a", "zone-a#m1", 0), ("item-b", "zone-a#m2", 0)],
    )
    assert limits(s) == {"zone-a#m1": 0, "zone-a#m2": 5}
    assert s.members[MemberId("zone-a", "m1")].exiting
    assert s.load_ratio(MemberId("zone-a", "m1"), s.member_total) == math.inf
    assert s.load_ratio(MemberId("zone-a", "m2"), s.member_total) == 1 / 5


def test_several_exiting_members_shed_at_once() -> None:
    s = state(
        {"item-a": 1, "item-b": 1},
        [
            ("zone-a#m1", 5, True),
            ("zone-a#m2", 5, True),
            ("zone-a#m3", 5, False),
            ("zone-b#m4", 5, False),
            ("zone-b#m5", 5, False),
        ],
    )
    assert limits(s) == {
        "zone-a#m1": 0,
        "zone-a#m2": 0,
        "zone-a#m3": 5,
        "zone-b#m4": 5,
        "zone-b#m5": 5,
    }


def test_enough_members_are_kept_for_the_largest_replication() -> None:
    s = state(
        {"item-a": 3, "item-b": 2, "item-c": 1},
        [
            ("zone-a#m1", 10, True),
            ("zone-a#m2", 10, True),
            ("zone-b#m3", 10, False),
            ("zone-b#m4", 10, False),
        ],
    )
    # Only one of four members may go while an item wants three: the oldest exiting one.
    assert limits(s) == {"zone-a#m1": 0, "zone-a#m2": 10, "zone-b#m3": 10, "zone-b#m4": 10}


def test_only_the_excess_is_shed_oldest_first() -> None:
    s = state(
        {f"item-{c}": 1 for c in "abcde"},
        [
            ("zone-a#m1", 3, True),
            ("zone-a#m2", 3, True),
            ("zone-b#m3", 3, True),
            ("zone-b#m4", 3, False),
        ],
    )
    # 12 slots for 5 replicas: 7 to shed, 3 + 3 + 1.
    assert limits(s) == {"zone-a#m1": 0, "zone-a#m2": 0, "zone-b#m3": 2, "zone-b#m4": 3}


def test_tight_cluster_keeps_the_exiting_members_items() -> None:
    # Two members of limit 2 and two items of replication 2: every slot is needed. The exiting
    # member keeps its replicas (the items would be left with one each otherwise).
    members = [("zone-a#m1", 2, True), ("zone-b#m2", 2, False)]
    held = [
        ("item-a", "zone-a#m1", 0),
        ("item-a", "zone-b#m2", 1),
        ("item-b", "zone-a#m1", 1),
        ("item-b", "zone-b#m2", 0),
    ]
    s = state({"item-a": 2, "item-b": 2}, members, held)
    assert limits(s) == {"zone-a#m1": 2, "zone-b#m2": 2}
    solution = solve_state(s)
    m1 = MemberId("zone-a", "m1")
    assert all(m1 in desired for desired in solution.desired.values())
    assert solution.replicas_placed == solution.replicas_wanted == 4

    # A third member joins: now there is room, and the exiting member's capacity goes.
    s = state({"item-a": 2, "item-b": 2}, [*members, ("zone-b#m3", 2, False)], held)
    assert limits(s) == {"zone-a#m1": 0, "zone-b#m2": 2, "zone-b#m3": 2}
    solution = solve_state(s)
    assert all(m1 not in desired for desired in solution.desired.values())
    assert solution.replicas_placed == 4


def test_overloaded_cluster_sheds_nothing() -> None:
    s = state(
        {"item-a": 1, "item-b": 1, "item-c": 1}, [("zone-a#m1", 1, True), ("zone-a#m2", 1, False)]
    )
    assert limits(s) == {"zone-a#m1": 1, "zone-a#m2": 1}
