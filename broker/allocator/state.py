"""The allocator's view of its keyspace: items, members and assignments, parsed from key-values.

Gazette's allocator layout, shared by brokers (items are journals) and consumers (items are
shards):

    <root>/items/<id>                           what to serve; its value gives the desired
                                                replication
    <root>/members/<zone>#<suffix>              a process able to serve items; its value gives
                                                its item limit. Under the member's lease.
    <root>/assign/<id>#<zone>#<suffix>#<slot>   one member serving one item; slot 0 is the
                                                primary. The value is opaque to the allocator
                                                (the item's primary writes it; brokers use the
                                                Route) and only judged by ``is_consistent``.
                                                Under the member's lease.

Parsing is pure and deliberately lenient: a malformed key or a value the caller's rules cannot
interpret is left out and reported in ``State.issues``, never raised. One bad key written by
hand must not stop the allocator from serving every other item; the KeySpace mirror follows the
same rule. Building a State from already-parsed parts (``build_state``), on the other hand,
checks its input and raises ``InvalidStateError``: that is a programming error, not data.

Everything here is sans-IO: values in, values out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

from broker.keyspace.backend import KeyValue
from broker.keyspace.keyspace import Entry

T = TypeVar("T")

ITEMS = "/items/"
MEMBERS = "/members/"
ASSIGN = "/assign/"
# '#' is the lowest printable ASCII character a shell does not interpret, and no token may
# contain it or anything sorting below it: so the byte order of "<zone>#<suffix>" keys is the
# order of (zone, suffix) tuples, and a range read returns an item's assignments already sorted
# by member.
SEP = "#"

# A slot index above this is a malformed key rather than a very large replica set (Gazette caps
# replication at 5); it also keeps a hostile key from making the planner count to 10**100.
slot_max = 1 << 16


class InvalidStateError(ValueError):
    """A State was built from inconsistent parts (duplicate ids, negative limits, ...)."""


class MemberId(NamedTuple):
    """A member's identity. Tuple order is the key order of member and assignment keys."""

    zone: str
    suffix: str

    def __str__(self) -> str:
        return f"{self.zone}{SEP}{self.suffix}"


@dataclass(frozen=True, slots=True)
class Item:
    id: str
    # Desired number of replicas (0 = serve nowhere, e.g. a fully suspended journal).
    replication: int
    kv: KeyValue


@dataclass(frozen=True, slots=True)
class Member:
    id: MemberId
    # Most items this member may be assigned (0 = drain it).
    item_limit: int
    kv: KeyValue


@dataclass(frozen=True, slots=True)
class Assignment:
    item_id: str
    member: MemberId
    slot: int
    kv: KeyValue

    @property
    def value(self) -> bytes:
        return self.kv.value

    @property
    def is_primary(self) -> bool:
        return self.slot == 0


def _check_token(what: str, token: str) -> None:
    if not token:
        raise InvalidStateError(f"{what}: must not be empty")
    low = min(token)
    if low <= SEP:
        raise InvalidStateError(f"{what} {token!r}: must not contain {low!r} (<= {SEP!r})")


# --- Keys ---------------------------------------------------------------------------------------


def item_key(root: str, item_id: str) -> bytes:
    return (root + ITEMS + item_id).encode()


def member_key(root: str, member: MemberId) -> bytes:
    return (root + MEMBERS + member.zone + SEP + member.suffix).encode()


def item_assignments_prefix(root: str, item_id: str) -> bytes:
    """Prefix of every assignment key of ``item_id``. The trailing separator matters: without
    it, item "a/b" would also match the assignments of "a/bc"."""
    return (root + ASSIGN + item_id + SEP).encode()


def assignment_key(root: str, item_id: str, member: MemberId, slot: int) -> bytes:
    return (
        item_assignments_prefix(root, item_id)
        + f"{member.zone}{SEP}{member.suffix}{SEP}{slot}".encode()
    )


def parse_member_id(text: str) -> MemberId:
    """Parse ``<zone>#<suffix>``."""
    zone, sep, suffix = text.partition(SEP)
    if not sep:
        raise InvalidStateError(f"member {text!r}: expected <zone>{SEP}<suffix>")
    _check_token("member zone", zone)
    _check_token("member suffix", suffix)
    return MemberId(zone, suffix)


def _parse_assignment_key(rest: str) -> tuple[str, MemberId, int]:
    fields = rest.split(SEP)
    if len(fields) != 4:
        raise InvalidStateError(
            f"assignment key {rest!r}: expected <item>{SEP}<zone>{SEP}<suffix>{SEP}<slot>"
        )
    item_id, zone, suffix, slot_text = fields
    _check_token("assignment item", item_id)
    _check_token("assignment zone", zone)
    _check_token("assignment suffix", suffix)
    # Exactly the decimal form strconv.Itoa writes: no sign, no leading zeros, no spaces.
    if not (slot_text.isascii() and slot_text.isdigit()) or str(int(slot_text)) != slot_text:
        raise InvalidStateError(f"assignment key {rest!r}: slot must be a decimal integer")
    slot = int(slot_text)
    if slot > slot_max:
        raise InvalidStateError(f"assignment key {rest!r}: slot must be <= {slot_max}")
    return item_id, MemberId(zone, suffix), slot


# --- State --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class State:
    """A consistent snapshot of the allocator keyspace at ``revision``. Read-only by convention
    (its mappings are plain dicts, for speed)."""

    root: str
    revision: int
    # Sorted by id.
    items: Mapping[str, Item]
    # Sorted by (zone, suffix).
    members: Mapping[MemberId, Member]
    # Assignments grouped by item id, each group sorted by (member, slot). Includes groups of
    # items that no longer exist ("dead" assignments, removed by the planner).
    assignments: Mapping[str, tuple[Assignment, ...]]
    # Sorted, unique zones of the members.
    zones: tuple[str, ...]
    # The member whose key has the lowest create revision (ties: lowest key), or None.
    leader: MemberId | None
    # Assignments of existing items to each member (members without any are absent), and how
    # many of them are primary. Assignments of dead items do not count: they are about to go.
    member_total: Mapping[MemberId, int]
    member_primary: Mapping[MemberId, int]
    # Keys left out while parsing, with the reason.
    issues: tuple[str, ...] = ()

    @property
    def item_slots(self) -> int:
        """Replicas wanted, summed over the items."""
        return sum(item.replication for item in self.items.values())

    @property
    def member_slots(self) -> int:
        """Replicas the members may hold, summed over the members."""
        return sum(member.item_limit for member in self.members.values())

    def network_key(self) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[MemberId, int], ...]]:
        """What the desired assignment depends on besides the current one: items with their
        replication, members with their limits. The allocator re-solves only when it changes
        (as Gazette does with its network hash): in between, it keeps converging towards the
        solution it already has, which is still a valid one, and re-solving against a
        half-converged state could flip between equally good answers."""
        return (
            tuple((i.id, i.replication) for i in self.items.values()),
            tuple((m.id, m.item_limit) for m in self.members.values()),
        )

    def assignments_of(self, item_id: str) -> tuple[Assignment, ...]:
        return self.assignments.get(item_id, ())

    def local_assignments(self, member: MemberId) -> list[Assignment]:
        """Assignments of ``member`` to items that exist, in item order."""
        return [
            a
            for item_id in self.items
            for a in self.assignments.get(item_id, ())
            if a.member == member
        ]

    def load_ratio(self, member: MemberId, counts: Mapping[MemberId, int]) -> float:
        """``counts[member]`` over the member's limit; infinite for a missing or drained member,
        so that it sheds assignments first and is promoted last."""
        m = self.members.get(member)
        if m is None or m.item_limit == 0:
            return math.inf
        return counts.get(member, 0) / m.item_limit


def build_state(
    root: str,
    revision: int,
    items: Iterable[Item],
    members: Iterable[Member],
    assignments: Iterable[Assignment],
    issues: Sequence[str] = (),
) -> State:
    """A State from parsed parts; raises InvalidStateError on inconsistent input."""
    if revision < 0:
        raise InvalidStateError(f"revision: must be >= 0 (got {revision})")
    item_map: dict[str, Item] = {}
    for item in sorted(items, key=lambda i: i.id):
        _check_token("item id", item.id)
        if item.replication < 0:
            raise InvalidStateError(f"item {item.id!r}: replication must be >= 0")
        if item.id in item_map:
            raise InvalidStateError(f"item {item.id!r}: duplicate")
        item_map[item.id] = item

    member_map: dict[MemberId, Member] = {}
    for member in sorted(members, key=lambda m: m.id):
        _check_token("member zone", member.id.zone)
        _check_token("member suffix", member.id.suffix)
        if member.item_limit < 0:
            raise InvalidStateError(f"member {member.id}: item limit must be >= 0")
        if member.id in member_map:
            raise InvalidStateError(f"member {member.id}: duplicate")
        member_map[member.id] = member

    grouped: dict[str, list[Assignment]] = {}
    seen: set[tuple[str, MemberId, int]] = set()
    for a in assignments:
        _check_token("assignment item", a.item_id)
        if not 0 <= a.slot <= slot_max:
            raise InvalidStateError(f"assignment {a.item_id}/{a.member}: slot out of range")
        ident = (a.item_id, a.member, a.slot)
        if ident in seen:
            raise InvalidStateError(f"assignment {a.item_id}/{a.member}/{a.slot}: duplicate")
        seen.add(ident)
        grouped.setdefault(a.item_id, []).append(a)
    assignment_map = {
        item_id: tuple(sorted(group, key=lambda a: (a.member, a.slot)))
        for item_id, group in sorted(grouped.items())
    }

    total: dict[MemberId, int] = {}
    primary: dict[MemberId, int] = {}
    for item_id in item_map:
        for a in assignment_map.get(item_id, ()):
            total[a.member] = total.get(a.member, 0) + 1
            if a.slot == 0:
                primary[a.member] = primary.get(a.member, 0) + 1

    leader = min(member_map.values(), key=lambda m: (m.kv.create_revision, m.kv.key), default=None)
    return State(
        root=root,
        revision=revision,
        items=item_map,
        members=member_map,
        assignments=assignment_map,
        zones=tuple(sorted({m.zone for m in member_map})),
        leader=leader.id if leader is not None else None,
        member_total=total,
        member_primary=primary,
        issues=tuple(issues),
    )


def parse_state(
    root: str,
    revision: int,
    entries: Iterable[Entry[T]],
    *,
    replication_of: Callable[[Entry[T]], int],
    item_limit_of: Callable[[Entry[T]], int],
) -> State:
    """Parse keyspace entries under ``root`` (as ``KeySpace.kvs`` holds them).

    ``replication_of`` and ``item_limit_of`` read an item's desired replication and a member's
    item limit from its entry (brokers: ``JournalSpec.replication`` and
    ``BrokerSpec.journal_limit``; consumers: hot standbys + 1 and ``ConsumerSpec.shard_limit``).
    Keys under ``root`` outside the three allocator prefixes are not the allocator's and are
    ignored; allocator keys that do not parse, or whose value the rules reject (an exception or
    a negative number), are left out and listed in ``State.issues``.
    """
    items_prefix, members_prefix, assign_prefix = root + ITEMS, root + MEMBERS, root + ASSIGN
    items: list[Item] = []
    members: list[Member] = []
    assignments: list[Assignment] = []
    issues: list[str] = []

    for entry in entries:
        kv = entry.kv
        try:
            key = kv.key.decode()
        except UnicodeDecodeError:
            if kv.key.startswith(
                (items_prefix.encode(), members_prefix.encode(), assign_prefix.encode())
            ):
                issues.append(f"{kv.key!r}: key is not UTF-8")
            continue
        try:
            if key.startswith(items_prefix):
                item_id = key[len(items_prefix) :]
                _check_token("item id", item_id)
                items.append(Item(item_id, _non_negative("replication", replication_of(entry)), kv))
            elif key.startswith(members_prefix):
                member = parse_member_id(key[len(members_prefix) :])
                members.append(
                    Member(member, _non_negative("item limit", item_limit_of(entry)), kv)
                )
            elif key.startswith(assign_prefix):
                item_id, member, slot = _parse_assignment_key(key[len(assign_prefix) :])
                assignments.append(Assignment(item_id, member, slot, kv))
        except Exception as exc:  # A rule may fail in any way on a value it does not expect.
            issues.append(f"{key}: {exc} (left out)")
    return build_state(root, revision, items, members, assignments, issues)


def _non_negative(what: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidStateError(f"{what} must be an int >= 0 (got {value!r})")
    return value
