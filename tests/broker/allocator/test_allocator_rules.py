"""Gazette's allocator rules for brokers: a journal's desired replication, a broker's journal
limit, and when a broker's assignment is consistent (it advertises the journal's route)."""

from __future__ import annotations

import pytest

from broker.allocator import (
    Assignment,
    Item,
    MemberId,
    assignment_key,
    broker_is_consistent,
    broker_item_limit,
    item_key,
    journal_replication,
    parse_state,
    route_of,
)
from broker.keyspace.backend import KeyValue
from broker.keyspace.keyspace import Entry
from broker.protocol import protocol_pb2 as pb
from broker.topology import (
    Assignment as TopologyAssignment,
)
from broker.topology import (
    JournalItem,
    Member,
    advertised_value,
    route_from_assignments,
)

ROOT = "/gazette/cluster"
A, B, C = MemberId("zone-a", "aaaa"), MemberId("zone-a", "bbbb"), MemberId("zone-b", "cccc")


def entry(decoded: object) -> Entry[object]:
    return Entry(KeyValue(b"/k", b"", 1, 1, 1), decoded)


def journal(
    replication: int, level: pb.JournalSpec.Suspend.Level = pb.JournalSpec.Suspend.NONE
) -> Entry[object]:
    spec = pb.JournalSpec(
        name="a/journal", replication=replication, suspend=pb.JournalSpec.Suspend(level=level)
    )
    return entry(JournalItem("a/journal", spec))


def test_journal_replication() -> None:
    assert journal_replication(journal(3)) == 3
    assert journal_replication(journal(3, pb.JournalSpec.Suspend.PARTIAL)) == 1
    assert journal_replication(journal(3, pb.JournalSpec.Suspend.FULL)) == 0
    assert journal_replication(journal(9)) == 5  # Gazette's cap.
    with pytest.raises(TypeError, match="expected a JournalItem"):
        journal_replication(entry("not a journal"))


def test_broker_item_limit() -> None:
    spec = pb.BrokerSpec(journal_limit=42)
    assert broker_item_limit(entry(Member("zone-a", "aaaa", spec))) == 42
    spec.exiting = True
    assert broker_item_limit(entry(Member("zone-a", "aaaa", spec))) == 0
    with pytest.raises(TypeError, match="expected a broker Member"):
        broker_item_limit(entry(JournalItem("a", pb.JournalSpec())))


def test_rules_that_raise_leave_the_entry_out() -> None:
    kvs = [
        Entry(KeyValue(b"/gazette/cluster/items/a", b"", 1, 1, 1), "garbage"),
        Entry(KeyValue(b"/gazette/cluster/members/zone-a#aaaa", b"", 1, 1, 1), "garbage"),
    ]
    state = parse_state(
        ROOT, 1, kvs, replication_of=journal_replication, item_limit_of=broker_item_limit
    )
    assert state.items == {} and state.members == {}
    assert len(state.issues) == 2


def assignment(m: MemberId, slot: int, value: bytes = b"") -> Assignment:
    key = assignment_key(ROOT, "a/journal", m, slot)
    return Assignment("a/journal", m, slot, KeyValue(key, value, 1, 1, 1))


ITEM = Item("a/journal", 3, KeyValue(item_key(ROOT, "a/journal"), b"", 1, 1, 1))


def test_route_of_matches_the_topology_route() -> None:
    group = [assignment(C, 0), assignment(A, 2), assignment(B, 1)]
    route = route_of(group)
    assert [(m.zone, m.suffix) for m in route.members] == [A, B, C]
    assert route.primary == 2
    topology = route_from_assignments(
        TopologyAssignment("a/journal", a.member.zone, a.member.suffix, a.slot, None) for a in group
    )
    assert route == topology
    assert route_of([assignment(A, 1)]).primary == -1


def test_broker_assignment_is_consistent_when_it_advertises_the_route() -> None:
    unadvertised = [assignment(A, 0), assignment(B, 1)]
    value = advertised_value(route_of(unadvertised))
    group = [assignment(A, 0, value), assignment(B, 1, value)]
    assert all(broker_is_consistent(ITEM, a, group) for a in group)
    # Freshly assigned (empty value), or garbage: not consistent.
    assert not broker_is_consistent(ITEM, unadvertised[0], unadvertised)
    garbled = assignment(A, 0, b"\xff\xff")
    assert not broker_is_consistent(ITEM, garbled, [garbled])
    # A route that lost or gained a member, or changed primary, is stale.
    with_c = [*group, assignment(C, 2)]
    assert not broker_is_consistent(ITEM, group[0], with_c)
    swapped = [assignment(A, 1, value), assignment(B, 0, value)]
    assert not broker_is_consistent(ITEM, swapped[0], swapped)
    # Endpoints are not part of consistency (a restarted broker is the same replica).
    with_endpoints = route_of(group)
    with_endpoints.endpoints.extend(["http://a:1", "http://b:1"])
    advertised = assignment(A, 0, with_endpoints.SerializeToString())
    assert broker_is_consistent(ITEM, advertised, [advertised, group[1]])
