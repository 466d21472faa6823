"""The solver: scenarios in the style of Gazette's scenarios_test, and properties checked
against an independent formulation (a per-item max-flow network built with networkx)."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Collection, Mapping

import networkx as nx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.allocator.solver import (
    InvalidProblemError,
    Solution,
    _Class,
    _classes,
    _Layout,
    _load_tiers,
    _realise,
    _Weights,
    fair_share,
    solve,
)
from broker.allocator.state import MemberId

Desired = Mapping[str, tuple[MemberId, ...]]


def m(name: str) -> MemberId:
    zone, suffix = name.split("#")
    return MemberId(zone, suffix)


def loads(desired: Desired) -> Counter[MemberId]:
    return Counter(member for members in desired.values() for member in members)


def zones_of(members: Collection[MemberId]) -> set[str]:
    return {x.zone for x in members}


def new_assignments(before: Desired, after: Desired) -> set[tuple[str, MemberId]]:
    return {(i, x) for i, ms in after.items() for x in ms if x not in before.get(i, ())}


def check_hard_limits(
    items: Mapping[str, int], members: Mapping[MemberId, int], solution: Solution
) -> None:
    d = solution.desired
    assert list(d) == sorted(items)
    for item_id, ms in d.items():
        assert len(ms) <= items[item_id]
        assert len(set(ms)) == len(ms), f"{item_id} has a member twice"
        assert list(ms) == sorted(ms)
        for x in ms:
            assert members.get(x, 0) > 0, f"{item_id} on unknown or drained {x}"
    for x, n in loads(d).items():
        assert n <= members[x], f"{x} holds {n} > limit {members[x]}"
    assert solution.replicas_placed == sum(len(ms) for ms in d.values())
    assert solution.replicas_wanted == sum(items.values())


# --- Scenarios --------------------------------------------------------------------------------


def test_initial_assignment_spreads_replication_zones_and_load() -> None:
    members = {m(f"zone-{z}#{z}{i}"): 1000 for z in "ab" for i in range(3)}
    items = {f"item-{i:03d}": 3 for i in range(100)}
    solution = solve(items, members, {})
    check_hard_limits(items, members, solution)
    for ms in solution.desired.values():
        assert len(ms) == 3
        assert zones_of(ms) == {"zone-a", "zone-b"}
    # 300 replicas over 6 equal members: exactly 50 each.
    assert set(loads(solution.desired).values()) == {50}


def test_gazette_initial_allocation() -> None:
    items = {"item-1": 1, "item-2": 2, "item-3": 3}
    members = {m("zone-a#A1"): 2, m("zone-a#A2"): 2, m("zone-b#B"): 4}
    d = solve(items, members, {}).desired
    # Fully replicated, every multi-replica item in both zones, no limit breached.
    assert [len(d[i]) for i in items] == [1, 2, 3]
    assert zones_of(d["item-2"]) == zones_of(d["item-3"]) == {"zone-a", "zone-b"}
    assert d["item-3"] == (m("zone-a#A1"), m("zone-a#A2"), m("zone-b#B"))
    # Within fair shares: 2, 2 and 3 (6 replicas, 8 slots).
    assert all(n <= fair_share(members[x], 6, 8) for x, n in loads(d).items())


def test_zone_spread_two_replicas_one_per_zone() -> None:
    members = {m("zone-a#A1"): 50, m("zone-a#A2"): 50, m("zone-b#B1"): 50, m("zone-b#B2"): 50}
    items = {f"item-{i:02d}": 2 for i in range(40)}
    d = solve(items, members, {}).desired
    for ms in d.values():
        assert [x.zone for x in ms] == ["zone-a", "zone-b"]
    assert set(loads(d).values()) == {20}


def test_replication_beats_zone_spread_when_a_zone_is_too_small() -> None:
    # Gazette's TestScaleUpZonesOneToTwo: zone-b can hold 2 of the 3 items' out-of-zone replicas.
    items = {"item-1": 3, "item-2": 3, "item-3": 3}
    members = {m("zone-a#A1"): 100, m("zone-a#A2"): 100, m("zone-a#A3"): 100, m("zone-b#B"): 2}
    d = solve(items, members, {}).desired
    assert all(len(ms) == 3 for ms in d.values())
    single_zone = [i for i, ms in d.items() if zones_of(ms) == {"zone-a"}]
    assert len(single_zone) == 1
    assert loads(d)[m("zone-b#B")] == 2


def test_member_limits_are_never_exceeded_and_the_rest_spreads() -> None:
    members = {m("zone-a#small"): 3, m("zone-a#big1"): 100, m("zone-b#big2"): 100}
    items = {f"item-{i:02d}": 2 for i in range(30)}
    d = solve(items, members, {}).desired
    check_hard_limits(items, members, solve(items, members, {}))
    assert all(len(ms) == 2 for ms in d.values())
    # 60 replicas, 203 slots: fair shares ceil(3*60/203)=1 and ceil(100*60/203)=30.
    assert loads(d)[m("zone-a#small")] <= 1
    assert loads(d)[m("zone-a#big1")] + loads(d)[m("zone-a#small")] == 30
    assert loads(d)[m("zone-b#big2")] == 30


def test_member_leaving_replaces_only_its_replicas() -> None:
    members = {m("zone-a#A1"): 100, m("zone-a#A2"): 100, m("zone-b#B1"): 100, m("zone-b#B2"): 100}
    items = {f"item-{i:02d}": 3 for i in range(40)}
    before = solve(items, members, {}).desired

    gone = m("zone-a#A2")
    remaining = {x: limit for x, limit in members.items() if x != gone}
    after = solve(items, remaining, before).desired
    check_hard_limits(items, remaining, solve(items, remaining, before))
    for item_id, ms in before.items():
        kept = set(ms) - {gone}
        assert kept <= set(after[item_id]), f"{item_id}: a replica moved needlessly"
        assert len(after[item_id]) == 3
        assert zones_of(after[item_id]) == {"zone-a", "zone-b"}
    # Exactly one new replica per replica the leaver held.
    assert len(new_assignments(before, after)) == loads(before)[gone]


def test_member_joining_rebalances_without_gratuitous_moves() -> None:
    members = {m("zone-a#A1"): 100, m("zone-a#A2"): 100, m("zone-b#B1"): 100}
    items = {f"item-{i:02d}": 2 for i in range(60)}
    before = solve(items, members, {}).desired
    # Zone spread puts one replica of every item on B1, the only zone-b member; zone-a shares
    # the other 60 evenly.
    assert loads(before) == {m("zone-a#A1"): 30, m("zone-a#A2"): 30, m("zone-b#B1"): 60}

    joiner = m("zone-b#B2")
    grown = {**members, joiner: 100}
    after = solve(items, grown, before).desired
    moved = new_assignments(before, after)
    # Every new assignment is the joiner's: it takes B1's excess over the new fair share
    # (120 replicas / 4 = 30), and nothing else moves.
    assert {x for _, x in moved} == {joiner}
    assert len(moved) == 30
    assert loads(after) == {x: 30 for x in grown}
    for ms in after.values():
        assert zones_of(ms) == {"zone-a", "zone-b"}


def test_resolving_the_solution_changes_nothing() -> None:
    members = {m("zone-a#A1"): 7, m("zone-a#A2"): 5, m("zone-b#B1"): 9, m("zone-c#C1"): 2}
    items = {f"item-{i}": r for i, r in enumerate([1, 2, 3, 3, 2, 1, 4, 0, 2])}
    first = solve(items, members, {})
    again = solve(items, members, first.desired)
    assert again == first


def test_insufficient_capacity_covers_items_first_deterministically() -> None:
    members = {m("zone-a#A"): 5, m("zone-b#B"): 5}
    items = {f"item-{i:02d}": 3 for i in range(10)}
    solution = solve(items, members, {})
    check_hard_limits(items, members, solution)
    # 10 slots for 30 wanted replicas: one replica for every item, not three for three.
    assert solution.replicas_placed == 10
    assert all(len(ms) == 1 for ms in solution.desired.values())
    assert loads(solution.desired) == {m("zone-a#A"): 5, m("zone-b#B"): 5}
    # Deterministic, whatever order the inputs come in.
    shuffled_items = dict(reversed(list(items.items())))
    shuffled_members = dict(reversed(list(members.items())))
    assert solve(shuffled_items, shuffled_members, {}) == solution


def test_partial_capacity_gives_as_many_replicas_as_fit() -> None:
    members = {m("zone-a#A1"): 4, m("zone-a#A2"): 4, m("zone-b#B"): 4}
    items = {f"item-{i}": 3 for i in range(5)}  # 15 wanted, 12 slots.
    solution = solve(items, members, {})
    check_hard_limits(items, members, solution)
    assert solution.replicas_placed == 12
    assert all(len(ms) >= 2 for ms in solution.desired.values())
    # zone-b's 4 slots can spread 4 of the 5 items; no more.
    spread = [i for i, ms in solution.desired.items() if zones_of(ms) == {"zone-a", "zone-b"}]
    assert len(spread) == 4


def test_lower_replication_drops_a_secondary_not_the_primary() -> None:
    members = {m("zone-a#A1"): 10, m("zone-a#A2"): 10, m("zone-b#B"): 10}
    current = {"item": [m("zone-a#A1"), m("zone-a#A2"), m("zone-b#B")]}
    for primary in members:
        d = solve({"item": 2}, members, current, {"item": primary}).desired
        assert primary in d["item"]
        assert zones_of(d["item"]) == {"zone-a", "zone-b"}


def test_more_replication_than_members() -> None:
    members = {m("zone-a#A"): 10, m("zone-b#B"): 10, m("zone-c#C"): 10}
    d = solve({"item": 5}, members, {}).desired
    assert d["item"] == tuple(sorted(members))


def test_zero_replication_and_drained_members() -> None:
    members = {m("zone-a#A"): 0, m("zone-a#B"): 3}
    d = solve({"off": 0, "on": 2}, members, {"off": [m("zone-a#B")], "on": [m("zone-a#A")]}).desired
    assert d == {"off": (), "on": (m("zone-a#B"),)}
    assert solve({"i": 1}, {}, {}).desired == {"i": ()}
    assert solve({}, members, {}).desired == {}


def test_current_assignments_of_unknown_members_are_ignored() -> None:
    members = {m("zone-a#A"): 3}
    d = solve({"i": 1}, members, {"i": [m("zone-x#gone")], "unknown-item": [m("zone-a#A")]})
    assert d.desired == {"i": (m("zone-a#A"),)}


@pytest.mark.parametrize(
    ("items", "members", "why"),
    [
        ({"i": -1}, {}, "item 'i': replication must be >= 0"),
        ({}, {MemberId("z", "s"): -2}, "member z#s: item limit must be >= 0"),
    ],
)
def test_invalid_problems_are_refused(
    items: dict[str, int], members: dict[MemberId, int], why: str
) -> None:
    with pytest.raises(InvalidProblemError, match=why):
        solve(items, members, {})


def test_fair_share() -> None:
    assert fair_share(10, 30, 30) == 10
    assert fair_share(10, 7, 30) == 3  # ceil(70 / 30)
    assert fair_share(10, 100, 30) == 10  # Never above the limit.
    assert fair_share(5, 3, 0) == 0


# --- Properties against an independent formulation -----------------------------------------


def independent_max(
    items: Mapping[str, int], members: Mapping[MemberId, int], *, cover: bool
) -> int:
    """Maximum replicas (or, with ``cover``, items with a replica), by a plain per-item flow
    network: no aggregation, no costs, no zones."""
    graph = nx.DiGraph()
    for item_id, r in items.items():
        graph.add_edge("source", ("item", item_id), capacity=min(r, 1) if cover else r)
        for x in members:
            graph.add_edge(("item", item_id), ("member", x), capacity=1)
    for x, limit in members.items():
        graph.add_edge(("member", x), "sink", capacity=limit)
    if "source" not in graph or "sink" not in graph:
        return 0
    return int(nx.maximum_flow_value(graph, "source", "sink"))


member_ids = st.builds(
    MemberId, st.sampled_from(["zone-a", "zone-b", "zone-c"]), st.sampled_from("ABCDEFG")
)


@st.composite
def problems(
    draw: st.DrawFn, ample: bool = False
) -> tuple[dict[str, int], dict[MemberId, int], dict[str, list[MemberId]]]:
    n_items = draw(st.integers(0, 14))
    items = {f"item-{i:02d}": draw(st.integers(0, 4)) for i in range(n_items)}
    ids = draw(st.sets(member_ids, max_size=7))
    limit = st.integers(n_items, n_items + 3) if ample else st.integers(0, 12)
    members = {x: draw(limit) for x in sorted(ids)}
    pool = sorted(ids | {MemberId("zone-z", "gone")})
    current = {
        i: draw(st.lists(st.sampled_from(pool), max_size=4, unique=True)) for i in items if pool
    }
    return items, members, current


@given(problems())
def test_solution_is_valid_and_maximal(
    problem: tuple[dict[str, int], dict[MemberId, int], dict[str, list[MemberId]]],
) -> None:
    items, members, current = problem
    solution = solve(items, members, current)
    check_hard_limits(items, members, solution)
    assert solution.replicas_placed == independent_max(items, members, cover=False)
    covered = sum(1 for ms in solution.desired.values() if ms)
    assert covered == independent_max(items, members, cover=True)


@given(problems(), st.randoms(use_true_random=False))
def test_solution_is_a_fixed_point(
    problem: tuple[dict[str, int], dict[MemberId, int], dict[str, list[MemberId]]],
    rng: random.Random,
) -> None:
    items, members, current = problem
    first = solve(items, members, current)
    # Whichever replica is primary, re-solving from the solution keeps it exactly.
    primaries = {i: rng.choice(ms) for i, ms in first.desired.items() if ms}
    assert solve(items, members, first.desired, primaries) == first


@given(problems(), st.randoms(use_true_random=False))
def test_solution_does_not_depend_on_input_order(
    problem: tuple[dict[str, int], dict[MemberId, int], dict[str, list[MemberId]]],
    rng: random.Random,
) -> None:
    items, members, current = problem

    def shuffled(d: dict[str, int] | dict[MemberId, int]) -> dict[object, int]:
        pairs = list(d.items())
        rng.shuffle(pairs)
        return dict(pairs)

    shuffled_current = {i: rng.sample(ms, len(ms)) for i, ms in current.items()}
    a = solve(items, members, current)
    b = solve(shuffled(items), shuffled(members), shuffled_current)  # type: ignore[arg-type]
    assert a == b


@given(problems(ample=True))
def test_ample_capacity_gives_full_replication_spread_over_zones(
    problem: tuple[dict[str, int], dict[MemberId, int], dict[str, list[MemberId]]],
) -> None:
    items, members, current = problem
    d = solve(items, members, current).desired
    zones = zones_of(members)
    for item_id, ms in d.items():
        assert len(ms) == min(items[item_id], len(members))
        if len(ms) >= 2 and len(zones) >= 2:
            assert len(zones_of(ms)) >= 2, f"{item_id} on {ms} uses one zone of {zones}"


@given(
    st.integers(1, 6),
    st.integers(0, 20),
    st.integers(1, 4),
    st.integers(0, 5),
    st.randoms(use_true_random=False),
)
def test_equal_members_of_one_zone_are_balanced(
    n_members: int, n_items: int, r: int, headroom: int, rng: random.Random
) -> None:
    limit = n_items + headroom
    members = {MemberId("zone-a", f"m{i}"): limit for i in range(n_members)}
    items = {f"item-{i:02d}": r for i in range(n_items)}
    current = {i: rng.sample(sorted(members), rng.randint(0, n_members)) for i in items}
    d = solve(items, members, current).desired
    placed = sum(len(ms) for ms in d.values())
    assert placed == n_items * min(r, n_members)
    share = fair_share(limit, placed, limit * n_members)
    assert max(loads(d).values(), default=0) <= share


# --- The pooled network is as good as the dense one ------------------------------------------


def objective(
    items: Mapping[str, int],
    members: Mapping[MemberId, int],
    current: Mapping[str, Collection[MemberId]],
    primaries: Mapping[str, MemberId],
    solution: Solution,
) -> tuple[int, ...]:
    """The solver's goals, level by level (most important first), scored independently of how
    the solution was found: two optimal solutions score the same on every level."""
    d = solution.desired
    candidates = [x for x, limit in members.items() if limit > 0]
    zones = zones_of(candidates)
    covered = sum(1 for ms in d.values() if ms)
    zone_overflow = 0
    moves = 0
    kept_secondaries = 0
    for item_id, ms in d.items():
        r = min(items[item_id], len(candidates))
        if len(zones) > 1 and r > 1:
            per_zone = Counter(x.zone for x in ms)
            zone_overflow += sum(max(0, n - (r - 1)) for n in per_zone.values())
        for x in ms:
            if x not in current.get(item_id, ()):
                moves += 1
            elif primaries.get(item_id) != x:
                kept_secondaries += 1
    units = sum(
        len(c.items) * c.replication
        for c in _classes(
            items, current, primaries, {x: i for i, x in enumerate(sorted(candidates))}
        )
    )
    slots = sum(members[x] for x in candidates)
    unit = _Weights(slack=1, keep_secondary=0, move=0, over=0, zone=0, replica=0, cover=0)
    over_unit = _Weights(slack=0, keep_secondary=0, move=0, over=1, zone=0, replica=0, cover=0)
    load = loads(d)

    def tier_cost(x: MemberId, w: _Weights) -> int:
        left, cost = load[x], 0
        for capacity, unit_cost in _load_tiers(
            members[x], fair_share(members[x], units, slots), units, w
        ):
            take = min(capacity, left)
            cost, left = cost + take * unit_cost, left - take
        return cost

    over = sum(tier_cost(x, over_unit) for x in candidates)
    slack = sum(tier_cost(x, unit) for x in candidates)
    return (
        covered,
        solution.replicas_placed,
        -zone_overflow,
        -over,
        -moves,
        -kept_secondaries,
        -slack,
    )


@given(problems(), st.randoms(use_true_random=False))
def test_pooled_and_dense_networks_are_equally_optimal(
    problem: tuple[dict[str, int], dict[MemberId, int], dict[str, list[MemberId]]],
    rng: random.Random,
) -> None:
    items, members, current = problem
    primaries = {i: rng.choice(ms) for i, ms in current.items() if ms}
    pooled = solve(items, members, current, primaries)
    dense = solve(items, members, current, primaries, dense=True)
    check_hard_limits(items, members, dense)
    assert objective(items, members, current, primaries, pooled) == objective(
        items, members, current, primaries, dense
    )


def test_pooled_network_serves_scattered_placements() -> None:
    rng = random.Random(3)
    members = {MemberId(f"zone-{i % 2}", f"m{i:02d}"): 100 for i in range(12)}
    items = {f"item-{i:03d}": 3 for i in range(200)}
    current = {i: rng.sample(sorted(members), 3) for i in items}
    solution = solve(items, members, current)
    assert solution.pooled
    dense = solve(items, members, current, dense=True)
    assert not dense.pooled
    assert objective(items, members, current, {}, solution) == objective(
        items, members, current, {}, dense
    )


def test_realisation_reports_an_impossible_split() -> None:
    # One class of one item wants two new replicas from a zone where only one member gives:
    # the item would get that member twice. The caller then falls back to the dense network.
    layout = _Layout(limits=[5, 5], zone_of=[0, 0], zones=1)
    classes = [_Class(2, frozenset(), -1, ["item"])]
    assert not _realise(layout, classes, [[0, 0]], [[2]], [2, 0])
    per_class = [[0, 0]]
    assert _realise(layout, classes, per_class, [[2]], [1, 1])
    assert per_class == [[1, 1]]
