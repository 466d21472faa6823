"""Conditions on a broker cluster's etcd state, for tests to wait on, over any KeySpace mirror.

A test of a running cluster (in-process or ``ProcessCluster``'s processes) mostly waits for the
allocator and the journals' primaries to bring etcd into some state: every journal assigned,
its replicas synchronised, a broker's journals moved elsewhere. Those states have no event of
their own, but every change to them is an etcd revision, so ``wait_until`` re-checks a
condition at each revision of a KeySpace mirror, never by sleeping. A condition returns None
once it holds, else a description of what is still missing (reported on timeout).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence

from broker.keyspace.keyspace import KeySpace
from broker.protocol import protocol_pb2 as pb
from broker.topology import (
    Decoded,
    Member,
    assignment_of,
    attach_endpoints,
    journal_assignments,
    lookup_item,
    lookup_member,
    route_from_assignments,
    route_matches_assignments,
)

# None once the condition holds, else what is still missing.
Condition = Callable[[], str | None]
# A condition is re-checked at least this often even without a new revision: one that reads
# more than the mirror (a test's own state, a broker's process) would otherwise wait for a
# revision a quiet cluster may never make, and pass only at its timeout.
recheck_s_max = 1.0


async def wait_until(
    ks: KeySpace[Decoded],
    condition: Condition,
    timeout_s: float,
    *,
    diagnose: Callable[[], Awaitable[str]] | None = None,
) -> float:
    """Wait until ``condition`` holds, re-checking at each revision of ``ks`` (whose watch the
    caller runs), and at least every ``recheck_s_max``. Returns the seconds it took; raises
    TimeoutError naming what was missing, followed by ``diagnose()``'s report if given."""
    started = time.monotonic()
    deadline = started + timeout_s
    while (missing := condition()) is not None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            report = f"\n{await diagnose()}" if diagnose is not None else ""
            raise TimeoutError(f"after {timeout_s}s: {missing}{report}")
        with contextlib.suppress(TimeoutError):
            await ks.wait_for_revision(ks.header.revision + 1, min(remaining, recheck_s_max))
    return time.monotonic() - started


def route_of(ks: KeySpace[Decoded], root: str, journal: str) -> pb.Route:
    """The journal's current route: members sorted, primary index, endpoints attached."""
    entries = journal_assignments(ks, root, journal)
    route = route_from_assignments(assignment_of(e) for e in entries)
    attach_endpoints(route, ks, root)
    return route


def journal_problem(
    ks: KeySpace[Decoded],
    root: str,
    journal: str,
    replication: int,
    *,
    zones_min: int = 1,
    exclude: Sequence[str] = (),
) -> str | None:
    """Why ``journal`` is not served as wanted, or None: ``replication`` assignments of live
    members (none with a suffix in ``exclude``), a primary, every assignment advertising the
    route (its primary synchronised them all: the allocator's notion of consistency), and
    members in at least ``zones_min`` zones."""
    if lookup_item(ks, root, journal) is None:
        return f"{journal}: no such journal"
    entries = journal_assignments(ks, root, journal)
    route = route_from_assignments(assignment_of(e) for e in entries)
    names = [f"{m.zone}#{m.suffix}" for m in route.members]
    if len(route.members) != replication:
        return f"{journal}: route {names} has {len(route.members)} != {replication} members"
    if route.primary < 0:
        return f"{journal}: route {names} has no primary"
    for m in route.members:
        if m.suffix in exclude:
            return f"{journal}: route {names} still holds {m.suffix}"
        if not isinstance(lookup_member(ks, root, m.zone, m.suffix), Member):
            return f"{journal}: member {m.suffix} of {names} is gone"
    if not route_matches_assignments(route, entries):
        return f"{journal}: route {names} not yet consistent"
    if len({m.zone for m in route.members}) < zones_min:
        return f"{journal}: route {names} spans fewer than {zones_min} zones"
    return None


def journals_ready(
    ks: KeySpace[Decoded],
    root: str,
    journals: Sequence[str],
    replication: int,
    *,
    zones_min: int = 1,
    exclude: Sequence[str] = (),
) -> Condition:
    """A condition: every one of ``journals`` passes ``journal_problem``."""

    def condition() -> str | None:
        problems = [
            problem
            for journal in journals
            if (
                problem := journal_problem(
                    ks, root, journal, replication, zones_min=zones_min, exclude=exclude
                )
            )
        ]
        if problems:
            return f"{len(problems)} journal(s) not ready, e.g. {problems[0]}"
        return None

    return condition


def member_gone(ks: KeySpace[Decoded], root: str, zone: str, suffix: str) -> Condition:
    """A condition: the member's key is no longer in etcd (its lease expired or was revoked)."""

    def condition() -> str | None:
        if lookup_member(ks, root, zone, suffix) is not None:
            return f"member {zone}#{suffix} still announced"
        return None

    return condition
