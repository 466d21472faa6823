"""Which quorum journals a broker's term registers name it in: the journals that get a node
on a broker whatever their assignments (journals.py, QuorumJournals.observe), and the route of
the members a register names, with the endpoints of those announced.

A register names a member in its ensemble, or in `previous` while an ensemble change is not
settled (TermRecord): the ensemble the change left, or the one it gave up when its own could
not elect (Rules.next_ensemble), which the next term may go back to.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from broker.keyspace.keyspace import KeySpace
from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.quorum_shell.term_record import QuorumTerm
from broker.topology import (
    Decoded,
    JournalItem,
    attach_endpoints,
    lookup_item,
    quorum_term_key,
)


def registered_route(
    ks: KeySpace[Decoded], root: str, journal: str, revision: int, name: str
) -> pb.Route | None:
    """The route of the ensemble `journal`'s term register names (endpoints of the members
    announced, "" for the others), if a term was claimed for this journal (the spec key's
    create revision `revision`) and it names member `name`; else None."""
    entry = ks.get(quorum_term_key(root, journal))
    term = entry.decoded if entry is not None else None
    if not isinstance(term, QuorumTerm) or term.record.term == 0:
        return None
    if term.journal_revision and term.journal_revision != revision:
        return None  # the register of an earlier journal of this name
    if name not in term.record.ensemble:
        return None
    return _members_route(ks, root, term.record.ensemble)


class Registered(NamedTuple):
    """A journal's term register naming a member (registered_journals)."""

    # The record's ensemble (not `previous`), with the endpoints of those announced: a node
    # started with it takes no initiative if its member is not in it (Coordinator.outsider),
    # so a member only in `previous` claims no term it is not in, and answers the way back's
    # NewTerm when it comes.
    route: pb.Route
    revision: int  # the journal's identity: its spec key's create revision


def registered_journals(ks: KeySpace[Decoded], root: str, name: str) -> dict[str, Registered]:
    """Quorum journals whose term register names member `name`, in its ensemble or in
    `previous` (an ensemble change not yet settled: the ensemble it left, or the one it gave
    up, Rules.next_ensemble), by journal. A register of an earlier journal of the name, or of
    a journal whose spec is gone or not in quorum mode, names no one."""
    out: dict[str, Registered] = {}
    for entry in ks.search(quorum_term_key(root, "")):  # every journal's term register
        term = entry.decoded
        if not isinstance(term, QuorumTerm) or term.record.term == 0:
            continue
        record = term.record
        if name not in record.ensemble and name not in record.previous:
            continue
        item = lookup_item(ks, root, term.journal)
        decoded = item.decoded if item is not None else None
        if not isinstance(decoded, JournalItem) or not gl.is_quorum_journal(decoded.spec.labels):
            continue
        assert item is not None
        revision = item.kv.create_revision
        if term.journal_revision and term.journal_revision != revision:
            continue  # the register of an earlier journal of this name
        route = _members_route(ks, root, record.ensemble)
        out[term.journal] = Registered(route, revision)
    return out


def _members_route(ks: KeySpace[Decoded], root: str, members: Iterable[str]) -> pb.Route:
    route = pb.Route(primary=-1)
    for member in sorted(members):
        zone, _, suffix = member.partition("#")
        route.members.append(pb.ProcessSpec.ID(zone=zone, suffix=suffix))
    attach_endpoints(route, ks, root)
    return route
