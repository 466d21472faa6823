"""The allocator: assigns items (journals, shards) to members (brokers, consumers) in etcd.

Shared by brokers and consumers, over Gazette's keyspace layout (``state``):

* ``state``: parse the keyspace into items, members and assignments; the leader.
* ``solver`` (over ``flow``): the desired assignment, a lexicographic min-cost flow.
* ``converge``: the etcd transactions of one round towards it, never leaving an item with fewer
  consistent replicas than it needs.
* ``allocator``: the async loop the leading member runs.

All but ``allocator`` are sans-IO.
"""

from broker.allocator.allocator import (
    AllocatorError,
    MemberNotFoundError,
    RoundReport,
    TooManyFailuresError,
    broker_is_consistent,
    broker_item_limit,
    journal_replication,
    route_of,
    serve,
)
from broker.allocator.converge import (
    IsConsistent,
    Plan,
    PlanError,
    Txn,
    plan,
    txn_ops_max_default,
)
from broker.allocator.flow import FlowInputError, FlowNetwork, FlowSolutionError, min_cost_flow
from broker.allocator.solver import InvalidProblemError, Solution, fair_share, solve, solve_state
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
    parse_state,
)

__all__ = [
    "AllocatorError",
    "Assignment",
    "FlowInputError",
    "FlowNetwork",
    "FlowSolutionError",
    "InvalidProblemError",
    "InvalidStateError",
    "IsConsistent",
    "Item",
    "Member",
    "MemberId",
    "MemberNotFoundError",
    "Plan",
    "PlanError",
    "RoundReport",
    "Solution",
    "State",
    "TooManyFailuresError",
    "Txn",
    "assignment_key",
    "broker_is_consistent",
    "broker_item_limit",
    "build_state",
    "fair_share",
    "item_assignments_prefix",
    "item_key",
    "journal_replication",
    "member_key",
    "min_cost_flow",
    "parse_state",
    "plan",
    "route_of",
    "serve",
    "solve",
    "solve_state",
    "txn_ops_max_default",
]
