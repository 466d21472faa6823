"""The consumer's view of the cluster: shards, consumer processes and assignments in etcd.

Consumers share the allocator layout of brokers (``broker.allocator.state``), under their own
root (Gazette's ``--etcd.prefix``, e.g. ``/gazette/consumers/word-count``):

    <root>/items/<shard id>                         ShardSpec
    <root>/members/<zone>#<suffix>                  ConsumerSpec (under the member's lease)
    <root>/assign/<shard id>#<zone>#<suffix>#<slot> ReplicaStatus of that replica, written by the
                                                    member that runs it; empty (IDLE) when the
                                                    allocator has just created it. Slot 0 is the
                                                    primary. Under the member's lease.

Values are binary protobuf, so Gazette's own consumers and tools read our keys and we theirs.
The decoder is strict like Gazette's: a spec whose ID differs from its key, or a status that
breaks the ReplicaStatus rules, is rejected (the KeySpace logs it and leaves it out) rather than
half-trusted.

A shard's *Route* is derived from its assignments as a journal's is: members sorted by (zone,
suffix), ``primary`` the index of the slot-0 member or -1, endpoints from the ConsumerSpecs.

Everything here is pure; the member, resolver and Shard service build on it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError

from broker.allocator.state import Assignment as AllocatorAssignment
from broker.allocator.state import Item as AllocatorItem
from broker.keyspace.backend import KeyValue
from broker.keyspace.keyspace import Entry, KeySpace
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import protocol_pb2 as pb
from broker.protocol.validate import (
    ValidationError,
    at,
    validate_consumer_spec,
    validate_shard_id,
    validate_shard_spec,
)
from broker.topology import ASSIGN, ITEMS, MEMBERS, SEP, split_assignment_key, split_member_key
from broker.topology import TopologyDecodeError as TopologyDecodeError

DEFAULT_ROOT_PREFIX = "/gazette/consumers"

Code = cpb.ReplicaStatus.Code
IDLE, BACKFILL, STANDBY, PRIMARY, FAILED = (
    cpb.ReplicaStatus.IDLE,
    cpb.ReplicaStatus.BACKFILL,
    cpb.ReplicaStatus.STANDBY,
    cpb.ReplicaStatus.PRIMARY,
    cpb.ReplicaStatus.FAILED,
)
_CODES = frozenset(cpb.ReplicaStatus.Code.values())
# Errors kept in one ReplicaStatus: a reduction over many failed replicas must stay small
# enough for an etcd value (and a readable `gazctl shards list`).
status_errors_max = 8


# --- Decoded values ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ShardItem:
    """``<root>/items/<shard id>``."""

    id: str
    spec: cpb.ShardSpec


@dataclass(frozen=True, slots=True)
class ConsumerMember:
    """``<root>/members/<zone>#<suffix>``: one consumer process."""

    zone: str
    suffix: str
    spec: cpb.ConsumerSpec


@dataclass(frozen=True, slots=True)
class ShardAssignment:
    """``<root>/assign/<shard>#<zone>#<suffix>#<slot>``: one replica of one shard."""

    shard: str
    zone: str
    suffix: str
    slot: int
    status: cpb.ReplicaStatus

    @property
    def member_id(self) -> pb.ProcessSpec.ID:
        return pb.ProcessSpec.ID(zone=self.zone, suffix=self.suffix)


Decoded = ShardItem | ConsumerMember | ShardAssignment


# --- Keys -------------------------------------------------------------------------------------


def default_root(app: str) -> str:
    """Gazette's conventional root of an application's consumer group."""
    return f"{DEFAULT_ROOT_PREFIX}/{app}"


def items_prefix(root: str) -> str:
    return root + ITEMS


def assign_prefix(root: str) -> str:
    return root + ASSIGN


def shard_key(root: str, shard: str) -> str:
    """The etcd key of a ShardSpec: also the shard's *FQN* (the SQL store's ``shard_fqn``)."""
    return root + ITEMS + shard


def member_key(root: str, zone: str, suffix: str) -> str:
    return root + MEMBERS + zone + SEP + suffix


def shard_assignments_prefix(root: str, shard: str) -> str:
    # The trailing separator keeps shard "a" from matching the assignments of "ab".
    return root + ASSIGN + shard + SEP


# --- ReplicaStatus ----------------------------------------------------------------------------


def validate_replica_status(status: cpb.ReplicaStatus) -> None:
    """Gazette's rules: a known code; errors iff FAILED."""
    if status.code not in _CODES:
        raise ValidationError(f"must be a ReplicaStatus.Code (got {status.code})", "code")
    if status.code == FAILED and not status.errors:
        raise ValidationError("must not be empty when code is FAILED", "errors")
    if status.code != FAILED and status.errors:
        raise ValidationError(
            f"must be empty unless code is FAILED (code is {Code.Name(status.code)})", "errors"
        )


def decode_status(value: bytes) -> cpb.ReplicaStatus:
    """An assignment value as a ReplicaStatus (empty: IDLE). Raises DecodeError or
    ValidationError."""
    status = cpb.ReplicaStatus.FromString(value)
    validate_replica_status(status)
    return status


def reduce_status(a: cpb.ReplicaStatus, b: cpb.ReplicaStatus) -> cpb.ReplicaStatus:
    """The combination of two statuses: the larger code (IDLE < BACKFILL < STANDBY < PRIMARY <
    FAILED), with the errors of both when FAILED. A replica's status only moves forward: a
    FAILED replica stays FAILED until its assignment is removed."""
    out = cpb.ReplicaStatus(code=max(a.code, b.code))
    if out.code == FAILED:
        errors = list(dict.fromkeys([*a.errors, *b.errors]))
        out.errors.extend(errors[:status_errors_max])
    return out


def status_text(status: cpb.ReplicaStatus) -> str:
    text = Code.Name(status.code)
    return f"{text}: {'; '.join(status.errors)}" if status.errors else text


# --- Decoding ---------------------------------------------------------------------------------


def _decode_item(shard: str, value: bytes) -> ShardItem:
    spec = cpb.ShardSpec.FromString(value)
    validate_shard_spec(spec)
    if spec.id != shard:
        raise TopologyDecodeError(f"ShardSpec.id {spec.id!r} does not match its key")
    return ShardItem(shard, spec)


def _decode_member(rest: str, value: bytes) -> ConsumerMember:
    zone, suffix = split_member_key(rest)
    spec = cpb.ConsumerSpec.FromString(value)
    validate_consumer_spec(spec)
    if spec.process_spec.id.zone != zone or spec.process_spec.id.suffix != suffix:
        raise TopologyDecodeError(f"ConsumerSpec id does not match its key {rest!r}")
    return ConsumerMember(zone, suffix, spec)


def _decode_assignment(rest: str, value: bytes) -> ShardAssignment:
    shard, zone, suffix, slot = split_assignment_key(rest, "shard", validate_shard_id)
    with at("status"):
        status = decode_status(value)
    return ShardAssignment(shard, zone, suffix, slot, status)


def make_decoder(root: str) -> Callable[[KeyValue], Decoded]:
    """The KeySpace decoder of the consumer layout under ``root``."""
    items, members, assign = root + ITEMS, root + MEMBERS, root + ASSIGN

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
        except (ValidationError, DecodeError) as err:
            raise TopologyDecodeError(f"key {key!r}: {err}") from err
        raise TopologyDecodeError(f"key {key!r} is not a shard, member or assignment key")

    return decode


def new_keyspace(root: str) -> KeySpace[Decoded]:
    """An (unloaded) KeySpace mirror of the consumer layout under ``root``."""
    return KeySpace(root, make_decoder(root))


# --- Lookups ----------------------------------------------------------------------------------


def lookup_shard(ks: KeySpace[Decoded], root: str, shard: str) -> Entry[Decoded] | None:
    entry = ks.get(shard_key(root, shard))
    if entry is None or not isinstance(entry.decoded, ShardItem):
        return None
    return entry


def lookup_member(
    ks: KeySpace[Decoded], root: str, zone: str, suffix: str
) -> ConsumerMember | None:
    entry = ks.get(member_key(root, zone, suffix))
    if entry is None or not isinstance(entry.decoded, ConsumerMember):
        return None
    return entry.decoded


def shard_items(ks: KeySpace[Decoded], root: str) -> list[Entry[Decoded]]:
    """Every ShardSpec entry, in shard ID order."""
    return [e for e in ks.search(items_prefix(root)) if isinstance(e.decoded, ShardItem)]


def shard_assignments(ks: KeySpace[Decoded], root: str, shard: str) -> list[Entry[Decoded]]:
    """The assignment entries of ``shard``, in key order (by member, then slot)."""
    return [
        e
        for e in ks.search(shard_assignments_prefix(root, shard))
        if isinstance(e.decoded, ShardAssignment) and e.decoded.shard == shard
    ]


def assignment_of(entry: Entry[Decoded]) -> ShardAssignment:
    a = entry.decoded
    if not isinstance(a, ShardAssignment):
        raise TypeError(f"keyspace entry {entry.kv.key!r} is not a shard assignment")
    return a


def local_assignments(
    ks: KeySpace[Decoded], root: str, zone: str, suffix: str
) -> dict[str, Entry[Decoded]]:
    """This member's assignment entry of each shard that exists (the lowest slot, if a
    hand-written key assigned it twice), by shard ID."""
    out: dict[str, Entry[Decoded]] = {}
    for entry in ks.search(assign_prefix(root)):
        a = entry.decoded
        if not isinstance(a, ShardAssignment) or (a.zone, a.suffix) != (zone, suffix):
            continue
        if lookup_shard(ks, root, a.shard) is None:
            continue  # The shard was deleted; the allocator removes its assignments.
        held = out.get(a.shard)
        if held is None or a.slot < assignment_of(held).slot:
            out[a.shard] = entry
    return out


def shards_with_source(ks: KeySpace[Decoded], root: str, journal: str) -> list[cpb.ShardSpec]:
    """Specs of the shards reading ``journal``, in shard ID order: how an application maps a
    key (through its journal mapping) to the shard responsible for it."""
    out: list[cpb.ShardSpec] = []
    for entry in shard_items(ks, root):
        item = entry.decoded
        assert isinstance(item, ShardItem)
        if any(source.journal == journal for source in item.spec.sources):
            out.append(item.spec)
    return out


# --- Routes -----------------------------------------------------------------------------------


def route_of(assignments: Iterable[ShardAssignment]) -> tuple[pb.Route, list[cpb.ReplicaStatus]]:
    """The Route of a shard and one ReplicaStatus per route member (a member assigned twice,
    which only a hand-written key can do, counts once with its statuses reduced)."""
    route = pb.Route(primary=-1)
    statuses: list[cpb.ReplicaStatus] = []
    for a in sorted(assignments, key=lambda a: (a.zone, a.suffix, a.slot)):
        if route.members and (route.members[-1].zone, route.members[-1].suffix) == (
            a.zone,
            a.suffix,
        ):
            statuses[-1] = reduce_status(statuses[-1], a.status)
        else:
            route.members.add(zone=a.zone, suffix=a.suffix)
            statuses.append(a.status)
        if a.slot == 0:
            route.primary = len(route.members) - 1
    return route, statuses


def attach_endpoints(route: pb.Route, ks: KeySpace[Decoded], root: str) -> None:
    """Fill ``route.endpoints`` from the members' ConsumerSpecs ("" where a member's spec is
    missing: its assignment outlived it, which the allocator soon repairs)."""
    del route.endpoints[:]
    for m in route.members:
        member = lookup_member(ks, root, m.zone, m.suffix)
        route.endpoints.append(member.spec.process_spec.endpoint if member else "")


def shard_route(
    ks: KeySpace[Decoded], root: str, shard: str
) -> tuple[pb.Route, list[cpb.ReplicaStatus]]:
    """The shard's Route (with endpoints) and its members' statuses, from the mirror."""
    route, statuses = route_of(assignment_of(e) for e in shard_assignments(ks, root, shard))
    attach_endpoints(route, ks, root)
    return route, statuses


# --- Allocator rules for shards ---------------------------------------------------------------


def shard_replication(entry: Entry[Any]) -> int:
    """Gazette's ShardSpec.DesiredReplication: none when disabled, else the primary plus its
    hot standbys."""
    item = entry.decoded
    if not isinstance(item, ShardItem):
        raise TypeError(f"expected a ShardItem, got {type(item).__name__}")
    return 0 if item.spec.disable else 1 + item.spec.hot_standbys


def consumer_item_limit(entry: Entry[Any]) -> int:
    """A consumer's shard limit: zero once it announced it is exiting (Gazette's
    ConsumerSpec.exiting), so that it gets nothing new and drains; zero too if an operator set
    its limit so."""
    member = entry.decoded
    if not isinstance(member, ConsumerMember):
        raise TypeError(f"expected a ConsumerMember, got {type(member).__name__}")
    return 0 if member.spec.exiting else member.spec.shard_limit


def _status_or_none(value: bytes) -> cpb.ReplicaStatus | None:
    try:
        return decode_status(value)
    except (DecodeError, ValidationError):
        return None


def shard_is_consistent(
    item: AllocatorItem, assignment: AllocatorAssignment, assignments: Sequence[AllocatorAssignment]
) -> bool:
    """Gazette's ShardIsConsistent: a replica that is STANDBY or PRIMARY can take over; one that
    is IDLE or BACKFILL cannot yet. A FAILED replica counts as consistent only when the primary
    has failed too: swapping one failed replica for another loses nothing, and it frees the
    failed primary to be replaced rather than pinning it in place."""
    del item  # Every shard is judged the same way.
    status = _status_or_none(assignment.value)
    if status is None:
        return False
    if status.code in (STANDBY, PRIMARY):
        return True
    if status.code != FAILED:
        return False
    for a in assignments:
        other = _status_or_none(a.value)
        if a.slot == 0 and other is not None and other.code == FAILED:
            return True
    return False
