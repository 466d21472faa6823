"""The broker's view of the cluster: keyspace layout, decoding, routes and headers.

Etcd (or the embedded keyspace) is the only source of truth for who serves which journal. Every
broker mirrors one prefix of it (the *root*, ``/gazette/cluster`` by default) into a KeySpace
whose values this module decodes:

    <root>/items/<journal>                     JournalSpec
    <root>/members/<zone>#<suffix>             BrokerSpec (under the member's lease)
    <root>/assign/<journal>#<zone>#<suffix>#<slot>
                                               Route advertised by the primary once its pipeline
                                               is synchronised; empty until then. Slot 0 is the
                                               primary. Under the member's lease.
    <root>/quorum/<journal>                    Term register of a quorum-mode journal (JSON,
                                               broker/quorum_shell/term_record.py); absent for
                                               all-replicas journals, which Gazette's are.
    <root>/quorum-members/<journal>            Members that joined a quorum-mode journal, with
                                               the disk they joined with (JSON,
                                               broker/quorum_shell/members_record.py).

The layout and the binary-protobuf values are Gazette's allocator layout, so that a Go broker and
ours read each other's keys. ``#`` separates the fields of member and assignment keys; tokens
(zones, suffixes) can never contain it, nor any byte that sorts before it, so the byte order of
``<zone>#<suffix>`` is the order of (zone, suffix) tuples: assignments of a journal come out of
a keyspace range read already sorted by member.

A journal's *Route* is derived from its assignments alone: members sorted by (zone, suffix),
``primary`` the index of the slot-0 member (or -1), endpoints attached from the members'
BrokerSpecs. Two Routes are *equivalent* when they name the same members and the same primary;
endpoints do not count, since a broker that restarts on a new port is still the same replica.

All functions here are pure (values in, values out): the resolver and the append FSM build on
them, and tests call them directly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import cast

from google.protobuf.message import DecodeError

from broker.keyspace.backend import Header as KeySpaceHeader
from broker.keyspace.backend import KeyValue
from broker.keyspace.keyspace import Entry, KeySpace
from broker.protocol import protocol_pb2 as pb
from broker.protocol.validate import (
    PROCESS_SUFFIX_LEN_MAX,
    PROCESS_SUFFIX_LEN_MIN,
    ZONE_LEN_MAX,
    ZONE_LEN_MIN,
    ValidationError,
    at,
    validate_broker_spec,
    validate_endpoint,
    validate_journal_name,
    validate_journal_spec,
    validate_token,
)
from broker.quorum_shell.members_record import (
    QUORUM_MEMBERS,
    MembersRecordDecodeError,
    QuorumMembers,
    decode_members_record,
)
from broker.quorum_shell.term_record import (
    QuorumTerm,
    TermRecordDecodeError,
    decode_term_record,
    record_journal_revision,
)

DEFAULT_ROOT = "/gazette/cluster"

ITEMS = "/items/"
MEMBERS = "/members/"
ASSIGN = "/assign/"
QUORUM = "/quorum/"
# Separates the fields of member and assignment keys (see the module docstring).
SEP = "#"

# Gazette caps replication at 5; a slot index above that is a malformed key, not a big route.
_SLOT_MAX = 1 << 16


class TopologyDecodeError(ValueError):
    """A key under the root is not a journal (or shard), member or assignment key, or its value
    does not decode. The KeySpace logs it and leaves the key out of its mirror."""


# --- Decoded values ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JournalItem:
    """``<root>/items/<journal>``: the spec of one journal."""

    name: str
    spec: pb.JournalSpec


@dataclass(frozen=True, slots=True)
class Member:
    """``<root>/members/<zone>#<suffix>``: one broker process."""

    zone: str
    suffix: str
    spec: pb.BrokerSpec


@dataclass(frozen=True, slots=True)
class Assignment:
    """``<root>/assign/<journal>#<zone>#<suffix>#<slot>``: one member serving one journal.

    ``route`` is the Route the journal's primary advertised in the value once every replica was
    synchronised with it, or None while the value is empty (freshly assigned by the allocator).
    """

    journal: str
    zone: str
    suffix: str
    slot: int
    route: pb.Route | None

    @property
    def member_id(self) -> pb.ProcessSpec.ID:
        return pb.ProcessSpec.ID(zone=self.zone, suffix=self.suffix)


Decoded = JournalItem | Member | Assignment | QuorumTerm | QuorumMembers


# --- Keys -------------------------------------------------------------------------------------


def items_prefix(root: str) -> str:
    return root + ITEMS


def members_prefix(root: str) -> str:
    return root + MEMBERS


def assign_prefix(root: str) -> str:
    return root + ASSIGN


def item_key(root: str, journal: str) -> str:
    return root + ITEMS + journal


def member_key(root: str, zone: str, suffix: str) -> str:
    return root + MEMBERS + zone + SEP + suffix


def journal_assignments_prefix(root: str, journal: str) -> str:
    """Prefix of every assignment key of ``journal``. The trailing separator matters: without
    it, journal "a/b" would also match the assignments of "a/bc"."""
    return root + ASSIGN + journal + SEP


def assignment_key(root: str, journal: str, zone: str, suffix: str, slot: int) -> str:
    return root + ASSIGN + journal + SEP + zone + SEP + suffix + SEP + str(slot)


def quorum_term_key(root: str, journal: str) -> str:
    return root + QUORUM + journal


# --- Decoding ---------------------------------------------------------------------------------


def split_member_key(rest: str) -> tuple[str, str]:
    """The (zone, suffix) of a member key after its prefix, ``<zone>#<suffix>``, validated (of
    brokers, and of consumers: gazette_consumer/topology.py)."""
    zone, sep, suffix = rest.partition(SEP)
    if not sep:
        raise TopologyDecodeError(f"member key {rest!r}: expected <zone>#<suffix>")
    _validate_member_id(zone, suffix)
    return zone, suffix


def split_assignment_key(
    rest: str, item: str, validate_item: Callable[[str], None]
) -> tuple[str, str, str, int]:
    """The (item, zone, suffix, slot) of an assignment key after its prefix,
    ``<item>#<zone>#<suffix>#<slot>``, validated; ``item`` names the item ("journal", "shard")
    and ``validate_item`` checks it (names and IDs never contain '#', so the last three
    separators delimit the fields)."""
    fields = rest.rsplit(SEP, 3)
    if len(fields) != 4:
        raise TopologyDecodeError(
            f"assignment key {rest!r}: expected <{item}>#<zone>#<suffix>#<slot>"
        )
    name, zone, suffix, slot_text = fields
    with at(item):
        validate_item(name)
    _validate_member_id(zone, suffix)
    if not slot_text.isdigit() or int(slot_text) > _SLOT_MAX or str(int(slot_text)) != slot_text:
        raise TopologyDecodeError(f"assignment key {rest!r}: slot must be a decimal integer")
    return name, zone, suffix, int(slot_text)


def _validate_member_id(zone: str, suffix: str) -> None:
    with at("zone"):
        validate_token(zone, ZONE_LEN_MIN, ZONE_LEN_MAX)
    with at("suffix"):
        validate_token(suffix, PROCESS_SUFFIX_LEN_MIN, PROCESS_SUFFIX_LEN_MAX)


def _decode_item(name: str, value: bytes) -> JournalItem:
    spec = pb.JournalSpec.FromString(value)
    # Lenient on postfix templates: see validate_journal_spec.
    validate_journal_spec(spec, check_postfix_template=False)
    if spec.name != name:
        raise TopologyDecodeError(f"JournalSpec.name {spec.name!r} does not match its key")
    return JournalItem(name, spec)


def _decode_member(rest: str, value: bytes) -> Member:
    zone, suffix = split_member_key(rest)
    spec = pb.BrokerSpec.FromString(value)
    validate_broker_spec(spec)
    if spec.process_spec.id.zone != zone or spec.process_spec.id.suffix != suffix:
        raise TopologyDecodeError(f"BrokerSpec id does not match its key {rest!r}")
    return Member(zone, suffix, spec)


def _decode_assignment(rest: str, value: bytes) -> Assignment:
    journal, zone, suffix, slot = split_assignment_key(rest, "journal", validate_journal_name)
    route: pb.Route | None = None
    if value:
        route = pb.Route.FromString(value)
        with at("route"):
            validate_route(route)
    return Assignment(journal, zone, suffix, slot, route)


def make_decoder(root: str) -> Callable[[KeyValue], Decoded]:
    """The KeySpace decoder of the broker layout under ``root``."""
    items, members, assign = items_prefix(root), members_prefix(root), assign_prefix(root)
    quorum, quorum_members = root + QUORUM, root + QUORUM_MEMBERS

    def decode(kv: KeyValue) -> Decoded:
        try:
            key = kv.key.decode()
        except UnicodeDecodeError as exc:
            raise TopologyDecodeError(f"key {kv.key!r} is not UTF-8") from exc
        try:
            if key.startswith(items):
                return _decode_item(key[len(items) :], kv.value)
            if key.startswith(members):
                return _decode_member(key[len(members) :], kv.value)
            if key.startswith(assign):
                return _decode_assignment(key[len(assign) :], kv.value)
            if key.startswith(quorum):
                journal = key[len(quorum) :]
                validate_journal_name(journal)
                return QuorumTerm(
                    journal, decode_term_record(kv.value), record_journal_revision(kv.value)
                )
            if key.startswith(quorum_members):
                journal = key[len(quorum_members) :]
                validate_journal_name(journal)
                return QuorumMembers(journal, decode_members_record(kv.value))
        except (
            ValidationError,
            DecodeError,
            TermRecordDecodeError,
            MembersRecordDecodeError,
        ) as err:
            raise TopologyDecodeError(f"key {key!r}: {err}") from err
        raise TopologyDecodeError(f"key {key!r} is not an item, member, assignment or quorum key")

    return decode


def new_keyspace(root: str = DEFAULT_ROOT) -> KeySpace[Decoded]:
    """An (unloaded) KeySpace mirror of the broker layout under ``root``."""
    return KeySpace(root, make_decoder(root))


# --- KeySpace lookups -------------------------------------------------------------------------


def lookup_item(ks: KeySpace[Decoded], root: str, journal: str) -> Entry[Decoded] | None:
    entry = ks.get(item_key(root, journal))
    if entry is None or not isinstance(entry.decoded, JournalItem):
        return None
    return entry


def lookup_member(ks: KeySpace[Decoded], root: str, zone: str, suffix: str) -> Member | None:
    entry = ks.get(member_key(root, zone, suffix))
    if entry is None or not isinstance(entry.decoded, Member):
        return None
    return entry.decoded


def journal_assignments(ks: KeySpace[Decoded], root: str, journal: str) -> list[Entry[Decoded]]:
    """The assignment entries of ``journal``, in key order (by member)."""
    return [
        e
        for e in ks.search(journal_assignments_prefix(root, journal))
        if isinstance(e.decoded, Assignment) and e.decoded.journal == journal
    ]


def local_journals(
    ks: KeySpace[Decoded], root: str, local_id: pb.ProcessSpec.ID
) -> dict[str, list[Entry[Decoded]]]:
    """Journals with an assignment of ``local_id``, each with *all* its assignment entries."""
    by_journal: dict[str, list[Entry[Decoded]]] = {}
    local: set[str] = set()
    for entry in ks.search(assign_prefix(root)):
        a = entry.decoded
        if not isinstance(a, Assignment):
            continue
        by_journal.setdefault(a.journal, []).append(entry)
        if a.zone == local_id.zone and a.suffix == local_id.suffix:
            local.add(a.journal)
    return {journal: by_journal[journal] for journal in sorted(local)}


def assignment_of(entry: Entry[Decoded]) -> Assignment:
    a = entry.decoded
    if not isinstance(a, Assignment):
        raise TypeError(f"keyspace entry {entry.kv.key!r} is not an assignment")
    return a


# --- Routes -----------------------------------------------------------------------------------


def route_from_assignments(assignments: Iterable[Assignment]) -> pb.Route:
    """The Route of a journal: members sorted by (zone, suffix), primary the slot-0 member."""
    ordered = sorted(assignments, key=lambda a: (a.zone, a.suffix, a.slot))
    route = pb.Route(primary=-1)
    for a in ordered:
        if route.members and (route.members[-1].zone, route.members[-1].suffix) == (
            a.zone,
            a.suffix,
        ):
            # A member assigned twice (two slots) is one replica; the allocator never does
            # this, but a hand-written key might, and a Route must list each member once.
            if a.slot == 0:
                route.primary = len(route.members) - 1
            continue
        if a.slot == 0:
            route.primary = len(route.members)
        route.members.add(zone=a.zone, suffix=a.suffix)
    return route


def attach_endpoints(route: pb.Route, ks: KeySpace[Decoded], root: str) -> None:
    """Fill ``route.endpoints`` from the members' BrokerSpecs ("" for a member whose BrokerSpec
    is missing: its assignment outlived it, which the allocator will soon repair)."""
    del route.endpoints[:]
    for m in route.members:
        member = lookup_member(ks, root, m.zone, m.suffix)
        route.endpoints.append(member.spec.process_spec.endpoint if member else "")


def routes_equivalent(a: pb.Route, b: pb.Route) -> bool:
    """Same members in the same order and the same primary; endpoints are not compared."""
    if a.primary != b.primary or len(a.members) != len(b.members):
        return False
    return all(
        x.zone == y.zone and x.suffix == y.suffix for x, y in zip(a.members, b.members, strict=True)
    )


def route_matches_assignments(route: pb.Route, assignments: Sequence[Entry[Decoded]]) -> bool:
    """Whether every assignment already advertises ``route`` (the journal is consistent)."""
    for entry in assignments:
        advertised = assignment_of(entry).route
        if advertised is None or not routes_equivalent(route, advertised):
            return False
    return True


def advertised_value(route: pb.Route) -> bytes:
    """The assignment value advertising ``route``: members and primary, no endpoints (they are
    a property of the members, not of the journal's consistency)."""
    return pb.Route(members=route.members, primary=route.primary).SerializeToString()


def member_index(route: pb.Route, member: pb.ProcessSpec.ID) -> int:
    """Index of ``member`` in ``route.members``, or -1."""
    for index, m in enumerate(route.members):
        if m.zone == member.zone and m.suffix == member.suffix:
            return index
    return -1


def same_id(a: pb.ProcessSpec.ID, b: pb.ProcessSpec.ID) -> bool:
    return a.zone == b.zone and a.suffix == b.suffix


def as_status(code: int) -> pb.Status:
    """A status code as the generated enum type (they are ints at runtime)."""
    return cast("pb.Status", code)


def format_id(member: pb.ProcessSpec.ID) -> str:
    return f"{member.zone}#{member.suffix}"


# --- Headers ----------------------------------------------------------------------------------


def etcd_header(header: KeySpaceHeader) -> pb.Header.Etcd:
    return pb.Header.Etcd(
        cluster_id=header.cluster_id,
        member_id=header.member_id,
        revision=header.revision,
        raft_term=header.raft_term,
    )


def make_header(process_id: pb.ProcessSpec.ID, route: pb.Route, etcd: pb.Header.Etcd) -> pb.Header:
    out = pb.Header(route=route, etcd=etcd)
    out.process_id.CopyFrom(process_id)
    return out


# --- Validation of wire values ----------------------------------------------------------------


def validate_process_id(member: pb.ProcessSpec.ID) -> None:
    _validate_member_id(member.zone, member.suffix)


def validate_route(route: pb.Route) -> None:
    """Gazette's Route rules: members valid, unique and sorted; primary in [-1, len); endpoints
    empty or one per member."""
    for index, m in enumerate(route.members):
        with at(f"members[{index}]"):
            validate_process_id(m)
        if index:
            prev = route.members[index - 1]
            if (prev.zone, prev.suffix) >= (m.zone, m.suffix):
                raise ValidationError(
                    f"must be in unique, sorted order (index {index}: "
                    f"{format_id(prev)} >= {format_id(m)})",
                    "members",
                )
    if not -1 <= route.primary < len(route.members):
        raise ValidationError(
            f"must be in [-1, {len(route.members)}) (got {route.primary})", "primary"
        )
    if route.endpoints and len(route.endpoints) != len(route.members):
        raise ValidationError(
            f"must be empty or one per member (got {len(route.endpoints)} for "
            f"{len(route.members)} members)",
            "endpoints",
        )
    for index, endpoint in enumerate(route.endpoints):
        if endpoint:
            with at(f"endpoints[{index}]"):
                validate_endpoint(endpoint)


def validate_header(header: pb.Header) -> None:
    """A Header must name a process (unless it is the zero ID a client may send), a valid
    Route and a positive etcd revision."""
    if header.process_id.zone or header.process_id.suffix:
        with at("process_id"):
            validate_process_id(header.process_id)
    with at("route"):
        validate_route(header.route)
    if header.etcd.revision <= 0:
        raise ValidationError(f"must be > 0 (got {header.etcd.revision})", "etcd", "revision")
