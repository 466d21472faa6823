"""The route a quorum journal's clients are told: the allocator's route with the term
register's leader as primary.

Two routes of one quorum journal. The *assigned* route (the allocator's: its slot 0 is the
primary) is what the quorum pulse advertises in the journal's assignments and what readiness
checks compare; it changes only when the allocator moves a replica. The *leader* route names
the quorum leader as primary: it is what response headers (Append, Read, Fragments, List)
report, so that a client's route cache sends its appends to the broker that commits them. An
election changes the leader without touching the assignments, so the two are kept apart: the
resolver keeps the assigned one in `Resolution.route` and puts this one in the header.

The leader is read from the mirror's term register (`<root>/quorum/<journal>`, QuorumTerm):
every broker reads the same register at a revision, members and non-members alike. While no
leader is appointed (an election), or the register names a leader outside the route (the
allocator moved it), or belongs to an earlier journal of this name, the assigned route is
reported unchanged: what clients were told, and retried against, before leaders were routed.
"""

from __future__ import annotations

from broker.keyspace.keyspace import KeySpace
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import is_quorum_journal
from broker.quorum_shell.term_record import QuorumTerm
from broker.topology import Decoded, format_id, quorum_term_key


def register_leader(
    ks: KeySpace[Decoded], root: str, journal: str, journal_revision: int
) -> QuorumTerm | None:
    """The journal's term register as the mirror holds it, if it names a leader and belongs to
    the journal whose spec key was created at `journal_revision` (0: do not check)."""
    entry = ks.get(quorum_term_key(root, journal))
    term = entry.decoded if entry is not None else None
    if not isinstance(term, QuorumTerm) or not term.record.leader:
        return None
    if journal_revision and term.journal_revision and term.journal_revision != journal_revision:
        return None  # the register of an earlier journal of this name
    return term


def with_primary(route: pb.Route, member: str) -> pb.Route | None:
    """A copy of `route` with `member` (`zone#suffix`) as primary; None if not a member."""
    for index, m in enumerate(route.members):
        if format_id(m) == member:
            out = pb.Route()
            out.CopyFrom(route)
            out.primary = index
            return out
    return None


def leader_route(
    ks: KeySpace[Decoded],
    root: str,
    spec: pb.JournalSpec | None,
    journal_revision: int,
    assigned: pb.Route,
) -> pb.Route:
    """The route clients are told (see the module docstring): `assigned` itself for a journal
    that is not a quorum journal or has no routable leader, else a copy naming the leader."""
    if spec is None or not is_quorum_journal(spec.labels):
        return assigned
    term = register_leader(ks, root, spec.name, journal_revision)
    if term is None:
        return assigned
    return with_primary(assigned, term.record.leader) or assigned
