"""Minimum-cost flow over a small network: the optimisation engine of the allocator's solver.

The solver (``solver.py``) states the assignment problem as a flow network whose arc costs
encode its goals; this module finds the cheapest flow through it and checks the answer. It knows
nothing of items or members.

*Cheapest flow of any value.* ``min_cost_flow`` returns, among all feasible flows from source
to sink (of any value, including zero), one of least total cost. Arcs with a negative cost are
therefore rewards: a network that pays for every unit reaching the sink (a negative cost on the
source arcs) gets a maximum flow, and among maximum flows the cheapest by its other arcs. This
one primitive expresses "assign as many replicas as possible, then as well as possible" without
a separate max-flow pass.

The engine is networkx's network simplex: exact, deterministic for a given arc order (arcs are
added in the caller's order and nodes are plain ints), and fast on the aggregated networks the
solver builds (a few thousand arcs). Integer capacities and costs make the optimum integral.
Python ints do not overflow, so costs may span many orders of magnitude (the solver weighs its
goals lexicographically by making each level's unit cost exceed the whole of the levels below).
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

SOURCE = 0
SINK = 1


class FlowInputError(ValueError):
    """An arc with a negative capacity, a non-integer capacity or cost, or a bad node."""


class FlowSolutionError(RuntimeError):
    """The engine returned a flow that breaks capacity or conservation: a bug, never data."""


@dataclass(frozen=True, slots=True)
class Arc:
    tail: int
    head: int
    capacity: int
    cost: int


class FlowNetwork:
    """Nodes are ints: ``SOURCE`` (0), ``SINK`` (1) and any others the caller names with
    ``add_node``. Parallel arcs are allowed (they are how a cost rises with the flow)."""

    def __init__(self) -> None:
        self._nodes = 2
        self.arcs: list[Arc] = []

    @property
    def node_count(self) -> int:
        return self._nodes

    def add_node(self) -> int:
        node = self._nodes
        self._nodes += 1
        return node

    def add_arc(self, tail: int, head: int, capacity: int, cost: int) -> int:
        """Add an arc; returns its index into ``arcs`` (and into the solved flows)."""
        for name, value in (("capacity", capacity), ("cost", cost)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise FlowInputError(f"arc {tail}->{head}: {name} must be an int (got {value!r})")
        if capacity < 0:
            raise FlowInputError(f"arc {tail}->{head}: capacity must be >= 0 (got {capacity})")
        for node in (tail, head):
            if not 0 <= node < self._nodes:
                raise FlowInputError(f"arc {tail}->{head}: node {node} was never added")
        if tail == head:
            raise FlowInputError(f"arc {tail}->{head}: loops are not allowed")
        if head == SOURCE or tail == SINK:
            raise FlowInputError(
                f"arc {tail}->{head}: nothing flows into the source or out of the sink"
            )
        self.arcs.append(Arc(tail, head, capacity, cost))
        return len(self.arcs) - 1


def min_cost_flow(network: FlowNetwork) -> list[int]:
    """The flow on each arc (indexed as ``network.arcs``) of a least-cost source-to-sink flow
    of any value. Raises FlowSolutionError if the engine's answer does not check out."""
    upper = sum(a.capacity for a in network.arcs if a.tail == SOURCE)
    graph = nx.MultiDiGraph()
    graph.add_nodes_from(range(network.node_count))
    # Supply ``upper`` units at the source and demand them at the sink; a free bypass arc lets
    # every unit the network does not profitably carry go straight through. The optimum is
    # then the cheapest flow of any value, which is what the caller asked for.
    graph.nodes[SOURCE]["demand"] = -upper
    graph.nodes[SINK]["demand"] = upper
    graph.add_edge(SOURCE, SINK, key=-1, capacity=upper, weight=0)
    for index, arc in enumerate(network.arcs):
        graph.add_edge(arc.tail, arc.head, key=index, capacity=arc.capacity, weight=arc.cost)
    _, flow_dict = nx.network_simplex(graph)

    flows = [flow_dict[a.tail][a.head][index] for index, a in enumerate(network.arcs)]
    _check(network, flows)
    return flows


def _check(network: FlowNetwork, flows: list[int]) -> None:
    balance = [0] * network.node_count
    for arc, flow in zip(network.arcs, flows, strict=True):
        if not 0 <= flow <= arc.capacity:
            raise FlowSolutionError(f"arc {arc}: flow {flow} outside [0, {arc.capacity}]")
        balance[arc.tail] -= flow
        balance[arc.head] += flow
    for node in range(2, network.node_count):
        if balance[node] != 0:
            raise FlowSolutionError(f"node {node}: flow not conserved (balance {balance[node]})")
