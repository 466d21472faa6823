"""The allocator's async shell: while this member leads, converge the keyspace's assignments.

Every member (broker or consumer process) runs ``serve``; only the *leader*, the member whose
key has the lowest create revision, acts. Leadership needs no election of its own: it follows
from etcd's revisions, every member computes the same answer from its mirror, and each
transaction the leader sends compares its own member key's mod revision, so a leader that lost
its key (lease expiry) cannot change anything.

A round: parse the KeySpace mirror into a State; if leader, solve for the desired assignment
(only when items, replication, members or limits changed since the last solve: see
``State.network_key``), plan the round's transactions, and apply them one at a time, stopping
at the first that fails its compares; then wait until the mirror reflects the last applied
transaction (or, after an idle round or a failure, the next revision) and go again. A failed
compare is never retried as it stood: the next round plans afresh from the newer state.

The shell does not watch the keyspace itself: the process already keeps one mirror of its root
up to date (brokers for their routes, consumers for their shards), and the allocator reads that
same mirror, so its view and the process's never disagree. The caller must have announced the
member (its key under a lease) and let the mirror reflect it before calling ``serve``.

``serve`` returns when this member may exit: its item limit is zero (it is draining) and it
holds no assignments. The caller should then revoke its lease promptly: while its member key
remains it may still be the leader, and no other member allocates. It raises MemberNotFoundError once the member key is gone (the lease
expired or was revoked: the process must stop serving) and TooManyFailuresError after
``txn_failures_max`` consecutive rounds whose transactions all failed, except rounds that etcd
refused for want of space (NoSpaceError): those are planned again at the next revision or
wake-up for as long as the alarm lasts, as Gazette's allocator retries every failed round.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from broker import metrics
from broker.allocator.converge import IsConsistent, Plan, plan, txn_ops_max_default
from broker.allocator.solver import Solution, solve_state
from broker.allocator.state import Assignment, Item, MemberId, State, parse_state
from broker.keyspace.backend import Backend, LeaseNotFoundError, NoSpaceError, UnavailableError
from broker.keyspace.keyspace import Entry, KeySpace
from broker.logging import get_logger
from broker.protocol import protocol_pb2 as pb
from broker.protocol.validate import JOURNAL_REPLICATION_MAX
from broker.topology import JournalItem, Member, routes_equivalent

log = get_logger(__name__)

T = TypeVar("T")

# Consecutive rounds in which the leader's first transaction failed (a compare, etcd being
# unreachable, a lease gone) before serve gives up: something is persistently wrong.
txn_failures_max_default = 30
# Longest wait for a keyspace change before planning again anyway. Planning an unchanged state
# is a harmless no-op; the wake-up guards against a mirror that stalls without failing.
idle_wake_s_default = 30.0


class AllocatorError(Exception):
    """Base class of the allocator shell's errors."""


class MemberNotFoundError(AllocatorError):
    """This member's key is not in the keyspace: its lease expired or was revoked."""


class TooManyFailuresError(AllocatorError):
    """Too many consecutive rounds failed to apply any transaction."""


@dataclass(frozen=True, slots=True)
class RoundReport:
    """What one leader round did; passed to ``serve``'s observer."""

    round: int
    # Revision of the state the round planned from.
    revision: int
    plan: Plan
    # Transactions applied (a prefix of plan.txns), the revision of the last one (0: none),
    # and whether one failed.
    applied: int
    applied_revision: int
    failed: bool
    # Whether this round solved afresh (rather than reusing the last solution).
    solved: bool
    solution: Solution
    # Whether the failure was etcd refusing every write (its NOSPACE alarm): not counted
    # toward ``txn_failures_max`` (see ``serve``).
    no_space: bool = False

    @property
    def idle(self) -> bool:
        """Nothing to do: the assignments are as converged as they can be for now."""
        return self.plan.idle and not self.failed


# --- Gazette's rules for brokers ------------------------------------------------------------------


def journal_replication(entry: Entry[Any]) -> int:
    """A journal's desired replication (Gazette's JournalSpec.DesiredReplication): one replica
    when suspended partially (read-only), none when fully, never more than the protocol's cap."""
    decoded = entry.decoded
    if not isinstance(decoded, JournalItem):
        raise TypeError(f"expected a JournalItem, got {type(decoded).__name__}")
    spec = decoded.spec
    level = spec.suspend.level
    if level == pb.JournalSpec.Suspend.FULL:
        return 0
    if level == pb.JournalSpec.Suspend.PARTIAL:
        return 1
    return min(spec.replication, JOURNAL_REPLICATION_MAX)


def broker_item_limit(entry: Entry[Any]) -> int:
    """A broker's journal limit; zero once it announces it is exiting, so that it drains."""
    decoded = entry.decoded
    if not isinstance(decoded, Member):
        raise TypeError(f"expected a broker Member, got {type(decoded).__name__}")
    return 0 if decoded.spec.exiting else decoded.spec.journal_limit


def route_of(assignments: Sequence[Assignment]) -> pb.Route:
    """The Route implied by an item's assignments: members sorted by (zone, suffix), each once,
    primary the index of the slot-0 member or -1."""
    members = sorted({a.member for a in assignments})
    primary = next((a.member for a in assignments if a.slot == 0), None)
    route = pb.Route(primary=-1 if primary is None else members.index(primary))
    for m in members:
        route.members.add(zone=m.zone, suffix=m.suffix)
    return route


def broker_is_consistent(
    item: Item, assignment: Assignment, assignments: Sequence[Assignment]
) -> bool:
    """A broker's assignment is consistent once its value advertises the journal's current
    route (the primary writes it after synchronising every replica of that route)."""
    del item  # Every journal is judged the same way.
    if not assignment.value:
        return False
    try:
        advertised = pb.Route.FromString(assignment.value)
    except Exception:  # A value that does not decode advertises nothing.
        return False
    return routes_equivalent(advertised, route_of(assignments))


# --- The loop -------------------------------------------------------------------------------------


async def serve(
    backend: Backend,
    keyspace: KeySpace[T],
    member: MemberId,
    *,
    is_consistent: IsConsistent,
    replication_of: Callable[[Entry[T]], int] = journal_replication,
    item_limit_of: Callable[[Entry[T]], int] = broker_item_limit,
    txn_ops_max: int = txn_ops_max_default,
    txn_failures_max: int = txn_failures_max_default,
    idle_wake_s: float = idle_wake_s_default,
    rounds_max: int | None = None,
    observer: Callable[[RoundReport], None] | None = None,
) -> None:
    """Allocate items to members while ``member`` leads (see the module docstring).

    ``rounds_max`` bounds the leader rounds (None: until drained, failed or cancelled);
    ``observer`` is called after each leader round.
    """
    if txn_failures_max < 1 or idle_wake_s <= 0:
        raise ValueError("serve: need txn_failures_max >= 1 and idle_wake_s > 0")
    root = keyspace.root.decode()
    cache: tuple[object, Solution] | None = None
    failures = 0
    rounds = 0
    while rounds_max is None or rounds < rounds_max:
        state = parse_state(
            root,
            keyspace.header.revision,
            keyspace.kvs,
            replication_of=replication_of,
            item_limit_of=item_limit_of,
        )
        local = state.members.get(member)
        if local is None:
            raise MemberNotFoundError(
                f"member {member}: key not found at revision {state.revision}"
            )
        if local.item_limit == 0 and not state.local_assignments(member):
            log.info("allocator: member drained; exiting", member=str(member))
            return

        next_revision = state.revision + 1
        if state.leader == member:
            network = state.network_key()
            solved = cache is None or cache[0] != network
            if cache is None or cache[0] != network:
                # In a worker thread: a large cluster's solve takes long enough (see
                # benchmarks/bench_allocator.py) to delay the process's lease refreshes and
                # RPCs if it ran on the event loop. The State is immutable, so sharing is safe.
                cache = (network, await asyncio.to_thread(_solve, state))
            report = await _round(
                backend, state, member, cache[1], solved, rounds, is_consistent, txn_ops_max
            )
            rounds += 1
            metrics.ALLOCATOR_ROUNDS.inc()
            if observer is not None:
                observer(report)
            if report.applied:
                failures = 0
                # Plan next from a mirror that reflects our own writes.
                next_revision = max(next_revision, report.applied_revision)
            elif report.failed and not report.no_space:
                failures += 1
                if failures >= txn_failures_max:
                    raise TooManyFailuresError(
                        f"allocator: {failures} consecutive rounds failed to apply a transaction"
                    )

        try:
            await keyspace.wait_for_revision(next_revision, idle_wake_s)
        except TimeoutError:
            pass  # Plan again anyway: see idle_wake_s.


def _solve(state: State) -> Solution:
    solution = solve_state(state)
    log.info(
        "allocator: solved desired assignment",
        revision=state.revision,
        items=len(state.items),
        members=len(state.members),
        replicas_wanted=solution.replicas_wanted,
        replicas_placed=solution.replicas_placed,
    )
    if solution.replicas_placed < solution.replicas_wanted:
        # Too few members, limits too low, or too few zones for the replication asked for.
        log.warning(
            "allocator: cannot reach the desired replication of every item",
            missing=solution.replicas_wanted - solution.replicas_placed,
        )
    for issue in state.issues:
        log.warning("allocator: keyspace entry left out", issue=issue)
    return solution


async def _round(
    backend: Backend,
    state: State,
    member: MemberId,
    solution: Solution,
    solved: bool,
    rounds: int,
    is_consistent: IsConsistent,
    txn_ops_max: int,
) -> RoundReport:
    p = plan(state, solution.desired, member, is_consistent=is_consistent, txn_ops_max=txn_ops_max)
    applied, failed, no_space, revision = 0, False, False, 0
    for txn in p.txns:
        try:
            resp = await backend.txn(txn.compares, txn.ops)
        except NoSpaceError as exc:
            # etcd refuses every write until an operator makes room: planned again at the next
            # revision or wake-up, and not counted as a failure that stops this member. Giving
            # up would take this process's assignments away with it, and a process started
            # again could not even take a lease; what it serves goes on meanwhile.
            log.error("allocator: transaction refused (will retry)", error=str(exc), round=rounds)
            metrics.ALLOCATOR_ROUND_FAILURES.labels("no_space").inc()
            failed = no_space = True
            break
        except (UnavailableError, LeaseNotFoundError) as exc:
            # Unreachable etcd, or a member's lease gone between our read and this write: the
            # next revision (or wake-up) brings a state to plan from again.
            log.warning("allocator: transaction failed (will retry)", error=str(exc), round=rounds)
            metrics.ALLOCATOR_ROUND_FAILURES.labels("unavailable").inc()
            failed = True
            break
        if not resp.succeeded:
            log.info(
                "allocator: transaction compares failed (will re-plan)",
                round=rounds,
                revision=state.revision,
            )
            metrics.ALLOCATOR_ROUND_FAILURES.labels("compare").inc()
            failed = True
            break
        applied += 1
        revision = resp.header.revision
    if applied or not p.idle:
        log.info(
            "allocator: round",
            round=rounds,
            revision=state.revision,
            txns=len(p.txns),
            applied=applied,
            added=p.added,
            removed=p.removed,
            promoted=p.promoted,
            packed=p.packed,
            removed_dead=p.removed_dead,
            deferred_adds=p.deferred_adds,
            deferred_removals=p.deferred_removals,
        )
    return RoundReport(
        rounds, state.revision, p, applied, revision, failed, solved, solution, no_space
    )
