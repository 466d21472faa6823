"""Convergence planning: Gazette's scenarios end to end over the MVCC core, each rule of the
planner on its own, the transactions' guards, and a property: applying the plan transaction by
transaction never leaves an item with fewer consistent replicas than min(R, what it had)."""

from __future__ import annotations

from collections import Counter

import pytest
from allocator_testkit import CONSISTENT, ROOT, Fixture
from hypothesis import given
from hypothesis import strategies as st

from broker.allocator.converge import PlanError, plan
from broker.allocator.state import MemberId, State, assignment_key, item_key, member_key
from broker.keyspace.backend import CompareTarget, OpDelete, OpPut
from broker.keyspace.mvcc import InvalidRequestError, MVCCStore

C = "consistent"


def primaries(state: State) -> Counter[MemberId]:
    return Counter(a.member for group in state.assignments.values() for a in group if a.slot == 0)


# --- Gazette's scenarios (allocator/scenarios_test.go), end to end ------------------------------


def test_initial_allocation() -> None:
    f = Fixture()
    f.insert(
        ("items/item-1", 1),
        ("items/item-2", 2),
        ("items/item-3", 3),
        ("members/zone-a#member-A1", 2),
        ("members/zone-a#member-A2", 2),
        ("members/zone-b#member-B", 4),
    )
    assert f.converge() == 1
    state = f.state()
    # Fully replicated, each multi-replica item in both zones, every limit kept. (Where item-1
    # goes is a tie: A1, A2 or B are all within their fair shares.)
    assert [len(state.assignments_of(i)) for i in state.items] == [1, 2, 3]
    for item_id in ("item-2", "item-3"):
        assert {a.member.zone for a in state.assignments_of(item_id)} == {"zone-a", "zone-b"}
    assert all(state.member_total[m] <= member.item_limit for m, member in state.members.items())
    assert sorted(a.slot for g in state.assignments.values() for a in g) == [0, 0, 0, 1, 1, 2]
    # Primaries are spread: one each, rather than all on the first member.
    assert set(primaries(state).values()) == {1}


def test_replace_when_not_consistent() -> None:
    f = Fixture()
    f.insert(
        ("items/item-1", 1),
        ("items/item-2", 2),
        ("items/item-3", 3),
        ("members/zone-a#member-A", 2),
        ("members/zone-b#member-B", 4),
        ("members/zone-a#member-old", 0),
        ("members/zone-a#member-new", 3),
        ("assign/item-1#zone-a#member-A#0", ""),
        ("assign/item-2#zone-a#member-old#0", ""),
        ("assign/item-2#zone-b#member-B#1", ""),
        ("assign/item-3#zone-a#member-A#0", ""),
        ("assign/item-3#zone-a#member-old#1", ""),
        ("assign/item-3#zone-b#member-B#2", ""),
    )
    # Nothing is consistent: the allocator may add replicas, but removes none.
    assert f.converge() == 1
    assert f.keys() == [
        "item-1#zone-a#member-A#0",
        "item-2#zone-a#member-new#2",
        "item-2#zone-a#member-old#0",
        "item-2#zone-b#member-B#1",
        "item-3#zone-a#member-A#0",
        "item-3#zone-a#member-new#3",
        "item-3#zone-a#member-old#1",
        "item-3#zone-b#member-B#2",
    ]
    f.mark_all_consistent()
    # Remove member-old (promoting item-2's primary), then pack the slots.
    assert f.converge() == 3
    assert f.keys() == [
        "item-1#zone-a#member-A#0",
        "item-2#zone-a#member-new#1",
        "item-2#zone-b#member-B#0",
        "item-3#zone-a#member-A#0",
        "item-3#zone-a#member-new#2",
        "item-3#zone-b#member-B#1",
    ]


def test_replace_when_consistent() -> None:
    f = Fixture()
    f.insert(
        ("items/item-1", 1),
        ("items/item-2", 2),
        ("items/item-3", 3),
        ("members/zone-a#member-A", 2),
        ("members/zone-b#member-B", 4),
        ("members/zone-a#member-old", 0),
        ("members/zone-a#member-new", 3),
        ("assign/item-1#zone-a#member-A#0", C),
        ("assign/item-2#zone-a#member-old#0", C),
        ("assign/item-2#zone-b#member-B#1", C),
        ("assign/item-3#zone-a#member-old#0", C),
        ("assign/item-3#zone-a#member-A#1", C),
        ("assign/item-3#zone-b#member-B#2", C),
    )
    assert f.converge() == 1
    # member-old stays until member-new's replicas are consistent.
    assert "item-2#zone-a#member-old#0" in f.keys()
    assert "item-2#zone-a#member-new#2" in f.keys()
    assert "item-3#zone-a#member-new#3" in f.keys()
    f.mark_all_consistent()
    assert f.converge() == 2
    assert f.keys() == [
        "item-1#zone-a#member-A#0",
        "item-2#zone-a#member-new#1",
        "item-2#zone-b#member-B#0",
        "item-3#zone-a#member-A#1",
        "item-3#zone-a#member-new#0",  # Promoted: the member with fewest primaries.
        "item-3#zone-b#member-B#2",
    ]


def test_scale_down_to_insufficient_member_slots_changes_nothing() -> None:
    f = Fixture()
    f.insert(
        ("items/item-1", 1),
        ("items/item-2", 2),
        ("items/item-3", 3),
        ("members/zone-a#member-A1", 1),
        ("members/zone-a#member-A2", 2),
        ("members/zone-a#member-A3", 3),
        ("assign/item-1#zone-a#member-A3#0", C),
        ("assign/item-2#zone-a#member-A2#0", C),
        ("assign/item-2#zone-a#member-A3#1", C),
        ("assign/item-3#zone-a#member-A1#1", C),
        ("assign/item-3#zone-a#member-A2#2", C),
        ("assign/item-3#zone-a#member-A3#0", C),
    )
    assert f.converge() == 0
    before = f.keys()
    f.member("zone-a#member-A3", 2)
    # A3 is now over its limit, but any removal would drop an item below its replication.
    assert f.converge() == 0
    assert f.keys() == before
    p = f.plan()
    assert p.deferred_removals == 1


def test_recovery_on_lease_and_zone_eviction() -> None:
    f = Fixture()
    f.insert(
        ("items/item-1", 1),
        ("items/item-2", 2),
        ("items/item-3", 3),
        ("members/zone-a#member-A1", 4),
        ("members/zone-a#member-A2", 2),
        ("members/zone-a#member-A3", 1),
        ("members/zone-b#member-B1", 4),
        ("assign/item-1#zone-a#member-A1#0", C),
        ("assign/item-2#zone-a#member-A2#1", C),
        ("assign/item-2#zone-b#member-B1#0", C),
        ("assign/item-3#zone-a#member-A1#2", C),
        ("assign/item-3#zone-a#member-A3#0", C),
        ("assign/item-3#zone-b#member-B1#1", C),
    )
    assert f.converge() == 0
    f.revoke("zone-b#member-B1")  # The member and its assignments vanish together.
    assert f.converge() == 3
    assert f.keys() == [
        "item-1#zone-a#member-A1#0",
        "item-2#zone-a#member-A1#1",
        "item-2#zone-a#member-A2#0",
        "item-3#zone-a#member-A1#1",
        "item-3#zone-a#member-A2#2",
        "item-3#zone-a#member-A3#0",
    ]


def test_unbalanced_zone_and_member_capacity_rotation() -> None:
    f = Fixture()
    f.insert(
        ("items/item-1", 3),
        ("items/item-2", 3),
        ("items/item-3", 3),
        ("members/zone-a#member-A1", 1),
        ("members/zone-a#member-A2", 3),
        ("members/zone-b#member-B1", 10),
        ("members/zone-b#member-B2", 10),
        ("assign/item-1#zone-a#member-A1#0", C),
        ("assign/item-1#zone-b#member-B1#1", C),
        ("assign/item-1#zone-b#member-B2#2", C),
        ("assign/item-2#zone-a#member-A2#0", C),
        ("assign/item-2#zone-b#member-B1#1", C),
        ("assign/item-2#zone-b#member-B2#2", C),
        ("assign/item-3#zone-a#member-A2#0", C),
        ("assign/item-3#zone-b#member-B1#1", C),
        ("assign/item-3#zone-b#member-B2#2", C),
    )
    assert f.converge() == 0
    f.member("zone-a#member-A1", 3)
    f.member("zone-a#member-A2", 1)
    assert f.converge() == 1
    f.mark_all_consistent()
    assert f.converge() == 3
    assert f.keys() == [
        "item-1#zone-a#member-A1#0",
        "item-1#zone-b#member-B1#1",
        "item-1#zone-b#member-B2#2",
        "item-2#zone-a#member-A1#2",  # Swapped from A2.
        "item-2#zone-b#member-B1#0",  # Elevated to primary.
        "item-2#zone-b#member-B2#1",
        "item-3#zone-a#member-A2#0",
        "item-3#zone-b#member-B1#1",
        "item-3#zone-b#member-B2#2",
    ]


# --- The planner's rules, one at a time -----------------------------------------------------


def test_fresh_items_spread_their_primaries() -> None:
    f = Fixture()
    for name in ("zone-a#A1", "zone-a#A2", "zone-b#B1"):
        f.member(name, 100)
    for i in range(100):
        f.item(f"item-{i:03d}", 3)
    assert f.converge() == 1
    state = f.state()
    assert all(len(g) == 3 for g in state.assignments.values())
    assert sorted(primaries(state).values()) == [33, 33, 34]


def test_removal_waits_for_enough_consistent_replicas() -> None:
    f = Fixture()
    f.insert(
        ("items/i", 2),
        ("members/zone-a#A", 5),
        ("members/zone-b#B", 5),
        ("members/zone-a#X", 0),  # Draining.
        ("assign/i#zone-a#A#0", C),
        ("assign/i#zone-b#B#1", ""),
        ("assign/i#zone-a#X#2", C),
    )
    # Two consistent replicas (A, X) and R=2: removing X would leave one.
    p = f.plan()
    assert (p.removed, p.deferred_removals) == (0, 1)
    assert p.idle
    f.mark_all_consistent()
    p = f.plan()
    assert (p.removed, p.deferred_removals) == (1, 0)
    f.apply(p)
    assert f.keys() == ["i#zone-a#A#0", "i#zone-b#B#1"]


def test_nothing_is_removed_from_an_under_replicated_item() -> None:
    f = Fixture()
    f.insert(
        ("items/i", 2),
        ("members/zone-a#A", 5),
        ("members/zone-a#X", 0),
        ("assign/i#zone-a#X#0", ""),  # Inconsistent, undesired, but one sync from counting.
    )
    p = f.plan()
    assert (p.added, p.removed, p.deferred_removals) == (1, 0, 1)


def test_inconsistent_surplus_goes_once_the_item_has_enough() -> None:
    f = Fixture()
    f.insert(
        ("items/i", 1),
        ("members/zone-a#A", 5),
        ("members/zone-a#X", 0),
        ("assign/i#zone-a#A#0", C),
        ("assign/i#zone-a#X#1", ""),
    )
    f.apply(f.plan())
    assert f.keys() == ["i#zone-a#A#0"]


def test_removing_the_primary_promotes_in_the_same_transaction() -> None:
    f = Fixture()
    f.insert(
        ("items/i", 2),
        ("members/zone-a#A", 5),
        ("members/zone-b#B", 5),
        ("members/zone-a#X", 0),
        ("assign/i#zone-a#X#0", C),
        ("assign/i#zone-a#A#1", C),
        ("assign/i#zone-b#B#2", C),
    )
    leases = dict(f.leases)
    p = f.plan()
    assert (p.removed, p.promoted) == (1, 1)
    [txn] = p.txns
    x0 = assignment_key(ROOT, "i", MemberId("zone-a", "X"), 0)
    a1 = assignment_key(ROOT, "i", MemberId("zone-a", "A"), 1)
    a0 = assignment_key(ROOT, "i", MemberId("zone-a", "A"), 0)
    # A (consistent, fewest primaries, lowest slot) is promoted: same value, same lease.
    assert txn.ops == (
        OpDelete(x0),
        OpDelete(a1),
        OpPut(a0, CONSISTENT, lease=leases[MemberId("zone-a", "A")]),
    )
    f.apply(p)
    assert f.keys() == ["i#zone-a#A#0", "i#zone-b#B#2"]


def test_promotion_prefers_a_consistent_replica() -> None:
    f = Fixture()
    f.insert(
        ("items/i", 2),
        ("members/zone-a#A", 5),
        ("members/zone-b#B", 5),
        ("assign/i#zone-a#A#1", ""),
        ("assign/i#zone-b#B#2", C),
    )
    f.apply(f.plan())
    assert f.keys() == ["i#zone-a#A#1", "i#zone-b#B#0"]


def test_slots_are_packed_one_move_per_round() -> None:
    f = Fixture()
    f.insert(
        ("items/i", 3),
        ("members/zone-a#A", 5),
        ("members/zone-a#B", 5),
        ("members/zone-b#C", 5),
        ("assign/i#zone-a#A#0", C),
        ("assign/i#zone-a#B#4", C),
        ("assign/i#zone-b#C#7", C),
    )
    assert f.converge() == 2
    assert f.keys() == ["i#zone-a#A#0", "i#zone-a#B#1", "i#zone-b#C#2"]


def test_adds_wait_for_room_under_the_limit() -> None:
    f = Fixture()
    f.insert(
        ("items/i", 1),
        ("items/j", 1),
        ("members/zone-a#A", 1),
        ("members/zone-a#B", 1),
        ("assign/i#zone-a#A#0", C),
        ("assign/j#zone-a#A#0", C),  # A is over its limit of 1.
    )
    p = f.plan()
    # One of i, j moves to B; A keeps the other.
    assert (p.added, p.deferred_adds) == (1, 0)
    f.apply(p)
    f.mark_all_consistent()
    f.converge()
    state = f.state()
    assert state.member_total == {MemberId("zone-a", "A"): 1, MemberId("zone-a", "B"): 1}


def test_add_is_deferred_while_the_member_is_full() -> None:
    f = Fixture()
    f.insert(
        ("items/i", 1),
        ("items/j", 1),
        ("members/zone-a#A", 1),
        ("members/zone-a#B", 1),
        ("assign/i#zone-a#B#0", C),
        ("assign/j#zone-a#A#0", C),
    )
    state = f.state()
    A, B = MemberId("zone-a", "A"), MemberId("zone-a", "B")
    # Ask for a swap: each add finds its member full, so nothing happens (and nothing breaks).
    p = plan(state, {"i": (A,), "j": (B,)}, state.leader or A, is_consistent=f.is_consistent)
    assert p.idle
    assert (p.deferred_adds, p.deferred_removals) == (2, 2)


def test_duplicate_keys_of_one_member_are_removed() -> None:
    f = Fixture()
    f.insert(
        ("items/i", 1),
        ("members/zone-a#A", 5),
        ("assign/i#zone-a#A#0", C),
        ("assign/i#zone-a#A#3", C),
    )
    f.converge()
    assert f.keys() == ["i#zone-a#A#0"]


def test_zero_replication_removes_everything() -> None:
    f = Fixture()
    f.insert(
        ("items/i", 0),
        ("members/zone-a#A", 5),
        ("members/zone-a#B", 5),
        ("assign/i#zone-a#A#0", C),
        ("assign/i#zone-a#B#1", ""),
    )
    f.converge()
    assert f.keys() == []


def test_dead_assignments_are_removed_unless_the_item_returns() -> None:
    f = Fixture()
    f.insert(
        ("items/i", 1),
        ("members/zone-a#A", 5),
        ("assign/i#zone-a#A#0", C),
        ("assign/gone#zone-a#A#0", C),
        ("assign/gone#zone-a#A#1", ""),
    )
    p = f.plan()
    assert p.removed_dead == 2
    [txn] = p.txns
    absent = [c for c in txn.compares if c.key == item_key(ROOT, "gone")]
    assert [(c.target, c.value) for c in absent] == [(CompareTarget.CREATE, 0)]
    # The item comes back before the plan applies: the deletion must not go through.
    f.item("gone", 1)
    resp, _ = f.store.txn(txn.compares, txn.ops)
    assert not resp.succeeded
    assert "gone#zone-a#A#0" in f.keys()


def test_additions_live_under_the_members_lease() -> None:
    f = Fixture()
    f.insert(("items/i", 2), ("members/zone-a#A", 5), ("members/zone-b#B", 5))
    f.converge()
    assert f.keys() == ["i#zone-a#A#0", "i#zone-b#B#1"]
    f.revoke("zone-b#B")
    assert f.keys() == ["i#zone-a#A#0"]


@pytest.mark.parametrize("change", ["leader", "member", "item", "assignment"])
def test_transactions_fail_if_their_inputs_changed(change: str) -> None:
    f = Fixture()
    f.insert(
        ("members/zone-a#leader", 0),
        ("items/i", 2),
        ("members/zone-a#A", 5),
        ("members/zone-a#X", 0),
        ("assign/i#zone-a#X#0", C),
        ("assign/i#zone-a#A#1", C),
        ("assign/i#zone-a#B#2", C),  # B has no member key (nor lease).
    )
    f.member("zone-b#new", 5)
    p = f.plan()
    # One addition (zone spread wants zone-b), and one of the two surplus replicas removed:
    # removing both would leave one consistent replica of two.
    assert (p.added, p.removed, p.deferred_removals) == (1, 1, 1)
    [txn] = p.txns
    if change == "leader":
        f.member("zone-a#leader", 0)  # Same value, new mod revision: a new term, in effect.
    elif change == "member":
        f.member("zone-b#new", 0)
    elif change == "item":
        f.item("i", 3)
    else:
        [removed] = [op.key for op in txn.ops if isinstance(op, OpDelete)]
        f.store.put(removed, b"rewritten by its primary")
    before = f.keys()
    resp, _ = f.store.txn(txn.compares, txn.ops)
    assert not resp.succeeded
    assert f.keys() == before


def test_transactions_respect_txn_ops_max() -> None:
    f = Fixture(store=MVCCStore(txn_ops_max=10), txn_ops_max=10)
    for name in ("zone-a#A", "zone-a#B", "zone-b#C"):
        f.member(name, 100)
    for i in range(30):
        f.item(f"item-{i:02d}", 3)
    p = f.plan()
    assert len(p.txns) > 1
    for txn in p.txns:
        assert len(txn.compares) <= 10 and len(txn.ops) <= 10
    f.apply(p)  # The store enforces the same limit, and refuses anything larger.
    assert len(f.keys()) == 90
    with pytest.raises(InvalidRequestError):
        f.store.txn([], [OpDelete(b"/x/%d" % i) for i in range(11)])


def test_a_checkpoint_is_truncated_to_fit_one_transaction() -> None:
    f = Fixture(store=MVCCStore(txn_ops_max=8), txn_ops_max=8)
    f.insert(("items/i", 1), ("members/zone-a#keep", 5))
    f.assign("i", "zone-a#keep", 0)
    for n in range(6):
        f.member(f"zone-a#drained{n}", 0)
        f.assign("i", f"zone-a#drained{n}", n + 1)
    p = f.plan()
    # 8 compares at most: the leader's, the item's, 2 kept back for a promotion, so 4 removals.
    assert (p.removed, p.deferred_removals) == (4, 2)
    f.apply(p)
    assert f.converge() == 1
    assert f.keys() == ["i#zone-a#keep#0"]


def test_plan_refuses_impossible_requests() -> None:
    f = Fixture()
    f.insert(("members/zone-a#A", 1))
    state = f.state()
    with pytest.raises(PlanError, match="txn_ops_max"):
        plan(state, {}, MemberId("zone-a", "A"), is_consistent=f.is_consistent, txn_ops_max=7)
    with pytest.raises(PlanError, match="zone-a#nobody"):
        plan(state, {}, MemberId("zone-a", "nobody"), is_consistent=f.is_consistent)


def test_every_transaction_is_guarded_by_the_leader_key() -> None:
    f = Fixture(txn_ops_max=8)
    f.member("zone-a#A", 50)
    for i in range(10):
        f.item(f"item-{i}", 1)
    p = f.plan()
    leader = member_key(ROOT, MemberId("zone-a", "A"))
    assert len(p.txns) > 1
    assert all(any(c.key == leader for c in txn.compares) for txn in p.txns)


# --- The safety property, over random keyspaces --------------------------------------------

ZONES = ["zone-a", "zone-b", "zone-c"]
NAMES = ["A", "B", "C", "D", "E"]


@st.composite
def fixtures(draw: st.DrawFn) -> Fixture:
    ops_max = draw(st.integers(8, 24))
    f = Fixture(store=MVCCStore(txn_ops_max=ops_max), txn_ops_max=ops_max)
    members = draw(
        st.lists(
            st.tuples(st.sampled_from(ZONES), st.sampled_from(NAMES)),
            min_size=1,
            max_size=5,
            unique=True,
        )
    )
    for zone, name in members:
        f.member(f"{zone}#{name}", draw(st.integers(0, 6)))
    # Assignments may name members that are gone (no member key, no lease).
    pool = [f"{z}#{n}" for z, n in members] + ["zone-z#gone"]
    items = [f"item-{i}" for i in range(draw(st.integers(0, 8)))]
    for item_id in items:
        f.item(item_id, draw(st.integers(0, 3)))
    for item_id in [*items, "dead-1"]:
        for member in draw(st.lists(st.sampled_from(pool), max_size=6, unique=True)):
            slot = draw(st.integers(0, 5))
            f.assign(item_id, member, slot, draw(st.sampled_from([CONSISTENT, b""])))
    return f


def consistent_counts(state: State) -> dict[str, int]:
    return {
        item_id: sum(1 for a in state.assignments_of(item_id) if a.value == CONSISTENT)
        for item_id in state.items
    }


@given(fixtures())
def test_no_step_drops_an_item_below_its_consistent_replicas(f: Fixture) -> None:
    for _ in range(15):
        state = f.state()
        floor = {
            item_id: min(item.replication, consistent_counts(state)[item_id])
            for item_id, item in state.items.items()
        }
        allowed = {
            m: max(member.item_limit, state.member_total.get(m, 0))
            for m, member in state.members.items()
        }

        def check(floor: dict[str, int] = floor, allowed: dict[MemberId, int] = allowed) -> None:
            now = f.state()
            for item_id, n in consistent_counts(now).items():
                assert n >= floor[item_id], f"{item_id}: {n} consistent < {floor[item_id]}"
            for m, total in now.member_total.items():
                if m in allowed:
                    assert total <= allowed[m], f"{m} holds {total} > {allowed[m]}"

        p = f.plan()
        if p.idle:
            if all(a.value == CONSISTENT for g in state.assignments.values() for a in g):
                break
            # Idle only for want of consistent replicas (nothing may go while an item has
            # fewer than its replication): catch up, as the items' primaries would, and go on.
            f.mark_all_consistent()
            continue
        f.apply(p, after_each=check)
        # Between rounds every replica catches up, as the items' primaries would make it.
        f.mark_all_consistent()
    else:
        raise AssertionError("no idle round within 15 rounds")

    # Idle: whatever still differs from the desired assignment is held back by a constraint.
    state = f.state()
    desired = f.solution(state).desired
    for item_id, item in state.items.items():
        group = state.assignments_of(item_id)
        have = {a.member for a in group}
        if group:
            assert any(a.slot == 0 for a in group), f"{item_id} has no primary"
        for m in set(desired[item_id]) - have:
            assert state.member_total.get(m, 0) >= state.members[m].item_limit
        if have - set(desired[item_id]):
            assert len(group) <= item.replication
    assert not any(i not in state.items for i in state.assignments), "dead assignments remain"
