"""The min-cost flow engine: cheapest flow of any value, with rewards as negative costs."""

from __future__ import annotations

import networkx as nx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.allocator.flow import SINK, SOURCE, FlowInputError, FlowNetwork, min_cost_flow


def test_positive_costs_alone_buy_no_flow() -> None:
    net = FlowNetwork()
    a = net.add_node()
    net.add_arc(SOURCE, a, 5, 1)
    net.add_arc(a, SINK, 5, 1)
    assert min_cost_flow(net) == [0, 0]


def test_a_reward_buys_the_cheapest_maximum_flow() -> None:
    net = FlowNetwork()
    a, b = net.add_node(), net.add_node()
    net.add_arc(SOURCE, a, 3, -100)  # Paid per unit: as much as the network carries.
    cheap = net.add_arc(a, b, 2, 1)
    dear = net.add_arc(a, b, 5, 10)  # A parallel arc: a cost that rises with the flow.
    net.add_arc(b, SINK, 3, 0)
    flows = min_cost_flow(net)
    assert flows[0] == 3
    assert flows[cheap] == 2
    assert flows[dear] == 1


def test_flow_stops_where_it_stops_paying() -> None:
    net = FlowNetwork()
    a = net.add_node()
    net.add_arc(SOURCE, a, 10, -5)
    net.add_arc(a, SINK, 4, 2)  # Net gain 3 per unit: taken in full.
    net.add_arc(a, SINK, 4, 7)  # Net loss 2 per unit: not taken.
    assert min_cost_flow(net) == [4, 4, 0]


@pytest.mark.parametrize(
    ("tail", "head", "capacity", "cost", "why"),
    [
        (0, 2, -1, 0, "capacity must be >= 0"),
        (0, 2, 1.5, 0, "capacity must be an int"),
        (0, 2, 1, 0.5, "cost must be an int"),
        (0, 2, True, 0, "capacity must be an int"),
        (0, 9, 1, 0, "node 9 was never added"),
        (2, 2, 1, 0, "loops are not allowed"),
        (2, 0, 1, 0, "nothing flows into the source"),
        (1, 2, 1, 0, "nothing flows into the source or out of the sink"),
    ],
)
def test_bad_arcs_are_refused(tail: int, head: int, capacity: int, cost: int, why: str) -> None:
    net = FlowNetwork()
    net.add_node()
    with pytest.raises(FlowInputError, match=why):
        net.add_arc(tail, head, capacity, cost)
    assert net.arcs == []


@st.composite
def networks(draw: st.DrawFn) -> FlowNetwork:
    net = FlowNetwork()
    inner = [net.add_node() for _ in range(draw(st.integers(1, 6)))]
    for node in inner:
        if draw(st.booleans()):
            net.add_arc(SOURCE, node, draw(st.integers(0, 9)), -1000)
        if draw(st.booleans()):
            net.add_arc(node, SINK, draw(st.integers(0, 9)), draw(st.integers(0, 20)))
    for _ in range(draw(st.integers(0, 12))):
        tail, head = draw(st.sampled_from(inner)), draw(st.sampled_from(inner))
        if tail != head:
            net.add_arc(tail, head, draw(st.integers(0, 9)), draw(st.integers(0, 20)))
    return net


@given(networks())
def test_rewarded_flow_is_a_maximum_flow(net: FlowNetwork) -> None:
    # Every path costs less than one unit's reward, so the cheapest flow carries the most.
    flows = min_cost_flow(net)
    value = sum(f for a, f in zip(net.arcs, flows, strict=True) if a.tail == SOURCE)

    graph = nx.DiGraph()
    graph.add_nodes_from(range(net.node_count))
    for arc in net.arcs:
        if graph.has_edge(arc.tail, arc.head):
            graph[arc.tail][arc.head]["capacity"] += arc.capacity
        else:
            graph.add_edge(arc.tail, arc.head, capacity=arc.capacity)
    assert value == nx.maximum_flow_value(graph, SOURCE, SINK)

    # Capacity and conservation (min_cost_flow checks them too; this checks the checker).
    balance = [0] * net.node_count
    for arc, f in zip(net.arcs, flows, strict=True):
        assert 0 <= f <= arc.capacity
        balance[arc.tail] -= f
        balance[arc.head] += f
    assert all(b == 0 for b in balance[2:])
    assert balance[SINK] == value
