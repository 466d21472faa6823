"""The desired assignment of items to members: a min-cost flow problem, solved sans-IO.

Goals, in strict priority order (each one matters only among answers equal on all before it):

1. *Coverage*: as many items as possible get at least one replica.
2. *Replication*: as many replicas as possible in total, up to each item's desired replication.
   Hard limits: a member holds at most its item limit, an item at most one replica per member.
   (Some maximum flow always covers as many items as possible, so goal 1 costs goal 2 nothing.)
3. *Zone spread*: when members span two or more zones, an item's replicas are not all in one
   zone. An item may still use a single zone when the alternative is fewer replicas (Gazette
   makes the same trade: an item in one zone is better than an item short of replicas).
4. *Balance*: each member holds at most its fair share, ``ceil(limit * D / S)`` for D the
   replicas to place and S the members' total limit. Above it a member may still go, up to its
   limit, but only when goals 1-3 need it, and then the excess is shared out (the cost of load
   beyond the fair share rises in steps, so two members a little over beat one far over).
5. *Stability*: as few new assignments as possible (every new assignment is a replica to
   build, and for brokers a route change). So a joining member takes only what the others hold
   beyond their new fair share, and a leaving member's replicas are re-placed while nothing
   else moves.
6. *Primary stability*: when some current replica must go, drop a secondary rather than the
   primary (a primary's move is a hand-off; a secondary's is not).
7. *Evenness*: within their fair shares, new replicas go to the members with the lowest load
   relative to their share (the cost of load rises in steps up to the share too). This level is
   below stability, so it steers placements but never moves anything by itself: in a zone that
   another zone's shortage leaves with spare room, the room is shared evenly.

Each goal is a cost level of the flow network, and each level's unit cost exceeds the most
that every level below could add up to, so the optimum is lexicographic. Because stability is
a cost and not a heuristic, the solution is a fixed point: solving again with the solution as
the current assignment returns it unchanged, since any other answer equal on goals 1-4 needs at
least one new assignment.

The network. Items with the same replication and the same current replicas (and primary) are
interchangeable, so they are aggregated into one *class* with a count n: a fresh cluster of
1000 items is one class, not 1000 nodes. Per class c (n items, replication r):

    source --n, -(cover+repl)---->  c            first replica of each item (a reward)
    source --n(r-1), -repl------->  c            further replicas
    c      --n(r-1), 0----------->  c/zone       per zone: at most r-1 replicas per item...
    c      --n, zone------------->  c/zone       ...or all r, at a price (only with >= 2 zones)
    c/zone --n, 0|keep|move------>  member       at most one replica per item and member; free
                                                 for the current primary, cheap for a current
                                                 secondary, dear for a new assignment
    member --fair/8, j*slack----->  sink         j = 0..7: load up to the fair share
    member --fair/8, j*over------>  sink         j = 1..7: beyond it
    member --the rest, 8*over---->  sink         up to the limit

A class flow decomposes into per-item assignments by McNaughton's wrap-around rule: list each
member (ordered by zone, then suffix) as many times as it received units, and give the k-th
item of the class positions k, k+n, k+2n, ... Since no member received more than n units, no
item gets a member twice; since a zone's run is at most n(r-1) long plus one n-long stretch per
unit of priced overflow, no item gets more than r-1 replicas in one zone unless the flow paid
for it.

Cost. Networks stay small while items share current placements (one class per distinct
placement), and the allocator solves only when items, replication, members or limits change.
The worst case is every item in a class of its own. The network above would then have items x
members arcs, so new assignments are first routed through one pool node per zone instead (see
``_class_flows``), which keeps the answer exact and the network near items + members arcs:
1000 items scattered over 100 members solve in about a second rather than ten.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from broker.allocator.flow import SINK, SOURCE, FlowNetwork, FlowSolutionError, min_cost_flow
from broker.allocator.state import MemberId, State


class InvalidProblemError(ValueError):
    """A negative replication or item limit."""


@dataclass(frozen=True, slots=True)
class Solution:
    # Every item (in id order) with its desired members, sorted by (zone, suffix); an item
    # that gets no replica maps to ().
    desired: dict[str, tuple[MemberId, ...]]
    # Replicas the items want in total, and how many the solution places.
    replicas_wanted: int
    replicas_placed: int
    # Whether the pooled network's answer could be realised (see ``_class_flows``): just for
    # observability, the solution is the same quality either way.
    pooled: bool = field(default=False, compare=False)


@dataclass(slots=True)
class _Class:
    replication: int
    current: frozenset[int]  # member indices
    primary: int  # member index, or -1
    items: list[str]


@dataclass(frozen=True, slots=True)
class _Weights:
    slack: int
    keep_secondary: int
    move: int
    over: int
    zone: int
    replica: int
    cover: int


# A member's load is costed in tiers of rising unit cost, so that the cost of load is convex and
# the optimum evens out load ratios as far as the higher goals allow: ``load_tiers`` tiers share
# the load up to the fair share (slack level), as many tiers of an eighth of it each go beyond
# (balance level), the last one open-ended up to the limit.
load_tiers = 8

# Goal levels from the least to the most important (see the module docstring), each with the
# most steps of its unit cost one unit of flow can pay at that level.
_levels: tuple[tuple[str, int], ...] = (
    ("slack", load_tiers - 1),
    ("keep_secondary", 1),
    ("move", 1),
    ("over", load_tiers),
    ("zone", 1),
    ("replica", 1),
    ("cover", 1),
)


def _weights(units: int) -> _Weights:
    """Unit costs of each goal level. A unit of flow crosses at most one arc of each level, so
    the levels below can add up to at most ``units`` times their summed top unit costs: the
    next level's unit cost is one more than that."""
    weights: dict[str, int] = {}
    bound = 0
    for name, steps in _levels:
        weights[name] = bound + 1
        bound += units * weights[name] * steps
    return _Weights(**weights)


def solve(
    items: Mapping[str, int],
    members: Mapping[MemberId, int],
    current: Mapping[str, Collection[MemberId]],
    primaries: Mapping[str, MemberId] | None = None,
    *,
    dense: bool = False,
) -> Solution:
    """The desired assignment.

    ``items`` maps item ids to desired replication, ``members`` member ids to item limits,
    ``current`` item ids to their currently assigned members and ``primaries`` item ids to
    their current primary. Current assignments of unknown items or members are ignored.
    ``dense`` skips the pooled network (see ``_class_flows``); the answer is equally optimal.
    """
    for item_id, r in items.items():
        if r < 0:
            raise InvalidProblemError(f"item {item_id!r}: replication must be >= 0 (got {r})")
    for member_id, limit in members.items():
        if limit < 0:
            raise InvalidProblemError(f"member {member_id}: item limit must be >= 0 (got {limit})")
    primaries = primaries or {}

    # Only members able to take an item are nodes; sorted, so that a zone's members are
    # contiguous (the decomposition relies on it) and the network is built deterministically.
    candidates = sorted(m for m, limit in members.items() if limit > 0)
    index = {m: i for i, m in enumerate(candidates)}
    zones = sorted({m.zone for m in candidates})
    layout = _Layout(
        limits=[members[m] for m in candidates],
        zone_of=[zones.index(m.zone) for m in candidates],
        zones=len(zones),
    )

    classes = _classes(items, current, primaries, index)
    desired: dict[str, tuple[MemberId, ...]] = {item_id: () for item_id in sorted(items)}
    wanted = sum(items.values())
    if not classes:
        return Solution(desired, wanted, 0)

    per_class = None if dense else _class_flows(layout, classes, pooled=True)
    pooled = per_class is not None
    if per_class is None:
        per_class = _dense_flows(layout, classes)

    placed = 0
    for c, per_member in zip(classes, per_class, strict=True):
        for item_id, members_of_item in zip(
            c.items, _wrap_around(per_member, len(c.items)), strict=True
        ):
            desired[item_id] = tuple(candidates[m] for m in members_of_item)
            placed += len(members_of_item)
    return Solution(desired, wanted, placed, pooled=pooled)


@dataclass(frozen=True, slots=True)
class _Layout:
    """The candidate members, by index: their limits and zone indices, and the zone count."""

    limits: list[int]
    zone_of: list[int]
    zones: int


def _class_flows(layout: _Layout, classes: list[_Class], *, pooled: bool) -> list[list[int]] | None:
    """Solve the network; for each class, the units each member receives.

    The *dense* network has an arc from every class to every member: exact, but items x
    members arcs when every item has a placement of its own. The *pooled* network keeps the
    arcs to each class's current members and routes every new assignment through one pool node
    per zone: classes + members arcs, roughly. It relaxes one constraint (through the pool, a
    class may send a member more units than it has items), so its answer must be realised
    afterwards (``_realise``); when that succeeds, the answer is optimal for the dense network
    too, since a relaxation's optimum that is feasible is an optimum. When it fails: None.
    """
    units = sum(len(c.items) * c.replication for c in classes)
    w = _weights(units)
    net = FlowNetwork()
    member_nodes = [net.add_node() for _ in layout.limits]
    _add_member_arcs(net, member_nodes, layout.limits, units, w)
    pools: list[int] | None = None
    supply_arcs: list[int] = []
    if pooled:
        pools = [net.add_node() for _ in range(layout.zones)]
        for m, node in enumerate(member_nodes):
            cap = min(layout.limits[m], units)
            supply_arcs.append(net.add_arc(pools[layout.zone_of[m]], node, cap, 0))

    member_arcs: list[list[tuple[int, int]]] = []
    pool_arcs: list[list[tuple[int, int]]] = []
    for c in classes:
        direct, to_pools = _add_class_arcs(net, c, layout, member_nodes, pools, w)
        member_arcs.append(direct)
        pool_arcs.append(to_pools)

    flows = min_cost_flow(net)
    per_class = [[0] * len(layout.limits) for _ in classes]
    for row, arcs in zip(per_class, member_arcs, strict=True):
        for m, arc in arcs:
            row[m] += flows[arc]
    if not pooled:
        return per_class
    supply = [flows[arc] for arc in supply_arcs]
    demand = [[0] * layout.zones for _ in classes]
    for row, arcs in zip(demand, pool_arcs, strict=True):
        for z, arc in arcs:
            row[z] += flows[arc]
    if not _realise(layout, classes, per_class, demand, supply):
        return None
    return per_class


def _dense_flows(layout: _Layout, classes: list[_Class]) -> list[list[int]]:
    per_class = _class_flows(layout, classes, pooled=False)
    if per_class is None:  # Only the pooled network has a realisation step that can fail.
        raise FlowSolutionError("the dense network's flows could not be read")
    return per_class


def _realise(
    layout: _Layout,
    classes: list[_Class],
    per_class: list[list[int]],
    demand: list[list[int]],
    supply: list[int],
) -> bool:
    """Split the pooled units among members: class c takes ``demand[c][z]`` units from the
    members of zone z, member m gives ``supply[m]``, and no class gets more units of a member
    than it has items (``per_class`` holds what it keeps already, and receives the split).

    A greedy fill, as in the Gale-Ryser construction: classes needing most first, each from the
    members with most left to give. False if some demand cannot be placed (then the caller
    falls back to the dense network, so a greedy miss costs time, never quality).
    """
    left = list(supply)
    by_zone: list[list[int]] = [[] for _ in range(layout.zones)]
    for m, z in enumerate(layout.zone_of):
        by_zone[z].append(m)
    for z, zone_members in enumerate(by_zone):
        order = sorted(range(len(classes)), key=lambda c: (-demand[c][z], c))
        for c in order:
            need = demand[c][z]
            if need == 0:
                break  # Sorted: every later class needs nothing from this zone either.
            n = len(classes[c].items)
            row = per_class[c]
            for m in sorted(zone_members, key=lambda m: (-left[m], m)):
                take = min(n - row[m], left[m], need)
                if take > 0:
                    row[m] += take
                    left[m] -= take
                    need -= take
                    if need == 0:
                        break
            if need:
                return False
    return True


def solve_state(state: State) -> Solution:
    """``solve`` for a parsed keyspace State."""
    current: dict[str, list[MemberId]] = {}
    primaries: dict[str, MemberId] = {}
    for item_id in state.items:
        for a in state.assignments_of(item_id):
            current.setdefault(item_id, []).append(a.member)
            if a.slot == 0:
                primaries[item_id] = a.member
    return solve(
        {i.id: i.replication for i in state.items.values()},
        {m.id: m.item_limit for m in state.members.values()},
        current,
        primaries,
    )


def _classes(
    items: Mapping[str, int],
    current: Mapping[str, Collection[MemberId]],
    primaries: Mapping[str, MemberId],
    index: Mapping[MemberId, int],
) -> list[_Class]:
    """Group interchangeable items, in item id order (so class order is deterministic)."""
    by_key: dict[tuple[int, frozenset[int], int], _Class] = {}
    for item_id in sorted(items):
        # No item can have more replicas than there are members to hold them.
        r = min(items[item_id], len(index))
        if r == 0:
            continue
        cur = frozenset(index[m] for m in current.get(item_id, ()) if m in index)
        primary = primaries.get(item_id)
        p = index[primary] if primary is not None and index.get(primary, -1) in cur else -1
        key = (r, cur, p)
        cls = by_key.get(key)
        if cls is None:
            cls = by_key[key] = _Class(r, cur, p, [])
        cls.items.append(item_id)
    return list(by_key.values())


def _add_member_arcs(
    net: FlowNetwork, member_nodes: list[int], limits: list[int], units: int, w: _Weights
) -> None:
    slots = sum(limits)
    for node, limit in zip(member_nodes, limits, strict=True):
        for capacity, cost in _load_tiers(limit, fair_share(limit, units, slots), units, w):
            if capacity > 0:
                net.add_arc(node, SINK, capacity, cost)


def _load_tiers(limit: int, fair: int, units: int, w: _Weights) -> list[tuple[int, int]]:
    """(capacity, unit cost) of each tier of a member's load, in order of rising cost."""
    tiers = [
        (fair * (j + 1) // load_tiers - fair * j // load_tiers, j * w.slack)
        for j in range(load_tiers)
    ]
    # No more than ``units`` can ever flow; bounding keeps huge limits from mattering.
    beyond = min(limit, units) - fair
    width = -(-fair // load_tiers) or 1
    for j in range(1, load_tiers):
        step = min(width, max(beyond, 0))
        tiers.append((step, j * w.over))
        beyond -= step
    tiers.append((max(beyond, 0), load_tiers * w.over))
    return tiers


def _add_class_arcs(
    net: FlowNetwork,
    c: _Class,
    layout: _Layout,
    member_nodes: list[int],
    pools: list[int] | None,
    w: _Weights,
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Add class ``c``'s arcs; returns its (member, arc) pairs into members and its (zone,
    arc) pairs into the pools."""
    n, r = len(c.items), c.replication
    node = net.add_node()
    net.add_arc(SOURCE, node, n, -(w.cover + w.replica))
    if r > 1:
        net.add_arc(SOURCE, node, n * (r - 1), -w.replica)

    spread = layout.zones > 1 and r > 1
    zone_nodes: list[int] = []
    for _ in range(layout.zones):
        zone_node = net.add_node()
        zone_nodes.append(zone_node)
        if spread:
            net.add_arc(node, zone_node, n * (r - 1), 0)
            net.add_arc(node, zone_node, n, w.zone)
        else:
            net.add_arc(node, zone_node, n * r, 0)

    direct: list[tuple[int, int]] = []
    for m, member_node in enumerate(member_nodes):
        if m == c.primary:
            cost = 0
        elif m in c.current:
            cost = w.keep_secondary
        elif pools is None:
            cost = w.move
        else:
            continue  # New assignments go through the zone's pool.
        direct.append((m, net.add_arc(zone_nodes[layout.zone_of[m]], member_node, n, cost)))
    to_pools: list[tuple[int, int]] = []
    if pools is not None:
        for z, (zone_node, pool) in enumerate(zip(zone_nodes, pools, strict=True)):
            to_pools.append((z, net.add_arc(zone_node, pool, n * r, w.move)))
    return direct, to_pools


def _wrap_around(per_member: list[int], n: int) -> list[list[int]]:
    """Split a class's units per member among its ``n`` items (see the module docstring)."""
    out: list[list[int]] = [[] for _ in range(n)]
    position = 0
    for m, count in enumerate(per_member):
        if count > n:
            # The arc capacity forbids it; if it ever happened an item would get m twice.
            raise AssertionError(f"member {m} received {count} units of a class of {n} items")
        for _ in range(count):
            out[position % n].append(m)
            position += 1
    return out


def fair_share(limit: int, replicas: int, slots: int) -> int:
    """A member's fair share of ``replicas`` among members holding ``slots`` in total:
    ``ceil(limit * min(replicas, slots) / slots)``, in integers. The shares add up to at least
    the replicas that fit, so a perfectly balanced answer pays no balance cost at all."""
    if slots <= 0:
        return 0
    return min(limit, -(-limit * min(replicas, slots) // slots))
