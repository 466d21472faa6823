"""Planning the etcd transactions that move the current assignments towards the desired ones.

Given a State, a desired assignment (from the solver) and a judge of consistency, ``plan``
returns the transactions of one convergence round, in the order to apply them. It never does
I/O; the allocator shell applies the transactions one at a time and, once its mirror has caught
up, plans the next round. Convergence therefore takes several rounds: a new replica must become
consistent (the item's primary has synchronised it and written its assignment value) before an
old one may go.

Per item, in one atomic step (a *checkpoint*, never split across transactions):

* **Add** each desired member the item lacks, while that member is below its item limit
  (counting this round's earlier adds and removals). The value is empty: the new replica is not
  consistent until the item's primary says so. Additions come first so that replacements exist
  before anything is taken away.
* **Remove** undesired assignments only while the item keeps at least R consistent replicas
  (R its desired replication), most loaded members first. If fewer than R are consistent now,
  nothing is removed: an inconsistent replica may be one sync away from counting, and throwing
  it away would only delay recovery. So no item ever drops below min(R, consistent replicas
  now), and a member being drained keeps its replicas until others can take over.
* **Promote**: if the item is left without a slot-0 assignment, move the best remaining one to
  slot 0 (consistent first, then desired, then the member with the fewest primaries per limit).
  An item with no assignment at all gets its primary among the additions, on the member with the
  fewest primaries per limit, so that a fresh cluster spreads primaries instead of piling them
  on the first member.
* **Pack**: when nothing else changes for the item, move one assignment to a lower free slot,
  so that slots stay dense (0..n-1) rather than growing with every replacement.

A move (promote, pack) deletes the old key and puts the new one with the same value and lease,
atomically: the replica keeps its consistency.

Guards. Every transaction compares the leader's member key's mod revision (a deposed leader's
plan must not apply). Each checkpoint compares its item key's mod revision (a change of the
desired replication could make a removal unsafe), the mod revision of every assignment it
deletes or moves, the mod revision of every member it adds to (the limit may have dropped),
and the absence of every key it creates. Assignments of deleted items are removed under a
compare that the item key is still absent, so a removal cannot race the item's re-creation.
If any compare fails, the transaction changes nothing; the shell waits for the next revision
and plans again from the new state.

Bounds. etcd refuses a transaction with more than ``--max-txn-ops`` (default 128) compares or
ops; checkpoints are packed into transactions of at most ``txn_ops_max`` of each, and one
item's checkpoint is truncated (the rest waits for the next round) to fit within one.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from broker.allocator.state import (
    Assignment,
    Item,
    MemberId,
    State,
    assignment_key,
    item_key,
)
from broker.keyspace.backend import Compare, CompareResult, CompareTarget, OpDelete, OpPut

# etcd's default --max-txn-ops: the most compares, and the most ops, in one transaction.
txn_ops_max_default = 128
# Below this a checkpoint could not hold even one addition and one promotion.
txn_ops_min = 8

# Judges whether ``assignment`` (one of the item's ``assignments``) is consistent: brokers, its
# value is the item's current route; consumers, the shard's replica status is ready.
IsConsistent = Callable[[Item, Assignment, Sequence[Assignment]], bool]

TxnOp = OpPut | OpDelete


class PlanError(ValueError):
    """The planner was given an impossible request (an unknown leader, a tiny txn limit)."""


@dataclass(frozen=True, slots=True)
class Txn:
    compares: tuple[Compare, ...]
    ops: tuple[TxnOp, ...]


@dataclass(frozen=True, slots=True)
class Plan:
    txns: tuple[Txn, ...]
    added: int = 0
    removed: int = 0
    promoted: int = 0
    packed: int = 0
    # Assignments of items that no longer exist.
    removed_dead: int = 0
    # Desired additions left for a later round: the member is at its limit (until removals
    # elsewhere free it), or the item's checkpoint was full.
    deferred_adds: int = 0
    # Undesired assignments kept because removing them would leave too few consistent replicas.
    deferred_removals: int = 0

    @property
    def idle(self) -> bool:
        return not self.txns


@dataclass(slots=True)
class _Checkpoint:
    compares: list[Compare] = field(default_factory=list)
    ops: list[TxnOp] = field(default_factory=list)


@dataclass(slots=True)
class _Room:
    """What is left of one checkpoint's budget."""

    compares: int
    ops: int


@dataclass(slots=True)
class _Tally:
    added: int = 0
    removed: int = 0
    promoted: int = 0
    packed: int = 0
    removed_dead: int = 0
    deferred_adds: int = 0
    deferred_removals: int = 0


def _mod_unchanged(key: bytes, mod_revision: int) -> Compare:
    return Compare(key, CompareTarget.MOD, CompareResult.EQUAL, mod_revision)


def _absent(key: bytes) -> Compare:
    return Compare(key, CompareTarget.CREATE, CompareResult.EQUAL, 0)


class _Batcher:
    """Packs checkpoints into transactions, each carrying the fixed compares once."""

    def __init__(self, fixed: Sequence[Compare], txn_ops_max: int) -> None:
        self._fixed = list(fixed)
        self._max = txn_ops_max
        self.txns: list[Txn] = []
        self._compares: dict[Compare, None] = dict.fromkeys(self._fixed)
        self._ops: list[TxnOp] = []

    def add(self, cp: _Checkpoint) -> None:
        if not cp.ops:
            return
        fresh = [c for c in dict.fromkeys(cp.compares) if c not in self._compares]
        if len(self._compares) + len(fresh) > self._max or len(self._ops) + len(cp.ops) > self._max:
            self.flush()
            fresh = [c for c in dict.fromkeys(cp.compares) if c not in self._compares]
        if len(self._compares) + len(fresh) > self._max or len(self._ops) + len(cp.ops) > self._max:
            # The per-item budget makes this impossible; never send etcd a txn it refuses.
            raise AssertionError(f"checkpoint of {len(cp.ops)} ops exceeds txn_ops_max={self._max}")
        self._compares.update(dict.fromkeys(fresh))
        self._ops.extend(cp.ops)

    def flush(self) -> None:
        if self._ops:
            self.txns.append(Txn(tuple(self._compares), tuple(self._ops)))
        self._compares = dict.fromkeys(self._fixed)
        self._ops = []


class _Planner:
    def __init__(
        self,
        state: State,
        desired: Mapping[str, Collection[MemberId]],
        is_consistent: IsConsistent,
        budget: int,
    ) -> None:
        self.state = state
        self.desired = desired
        self.is_consistent = is_consistent
        # Compares (and ops) one checkpoint may use: a transaction's limit less the leader's.
        self.budget = budget
        # Updated as the plan adds, removes and promotes, so that later items see the load the
        # earlier ones leave behind.
        self.total = dict(state.member_total)
        self.primary = dict(state.member_primary)
        self.tally = _Tally()

    # -- Items that exist ------------------------------------------------------------------------

    def item(self, item: Item) -> _Checkpoint:
        """The checkpoint of one existing item (no ops if it needs nothing)."""
        s = self.state
        current = s.assignments_of(item.id)
        want = set(self.desired.get(item.id, ()))
        consistent = {a.kv.key for a in current if self.is_consistent(item, a, current)}

        # The lowest slot of each desired member is kept; everything else is a candidate for
        # removal (undesired members, members that are gone, duplicate keys of one member).
        keep: list[Assignment] = []
        candidates: list[Assignment] = []
        held: set[MemberId] = set()
        for a in current:
            if a.member in want and a.member not in held:
                keep.append(a)
                held.add(a.member)
            else:
                candidates.append(a)

        cp = _Checkpoint(compares=[_mod_unchanged(item_key(s.root, item.id), item.kv.mod_revision)])
        # Room for a promotion (a move: 2 compares, 2 ops) is always kept back: a removal of
        # the primary must never go out without it.
        room = _Room(compares=self.budget - 1 - 2, ops=self.budget - 2)
        adds = self._admit_adds(sorted(want - held), room)
        removes, deferred = self._constrain_removals(item, candidates, consistent)
        # Each removal takes a compare and an op; the least urgent wait if they do not all fit.
        while len(removes) > min(room.compares, room.ops):
            deferred.append(removes.pop())
        self.tally.deferred_removals += len(deferred)

        remaining = sorted(keep + deferred, key=lambda a: (a.slot, a.member))
        existing = {a.kv.key for a in current}
        self._write_adds(cp, item.id, adds, current, primary_needed=not remaining)
        self._write_removes(cp, removes)
        promoted = False
        if remaining and remaining[0].slot != 0:
            promoted = self._promote(cp, remaining, want, consistent, existing)
        if not adds and not removes and not promoted:
            self._pack(cp, remaining, existing)
        return cp

    def _admit_adds(self, missing: list[MemberId], room: _Room) -> list[MemberId]:
        """The desired members to add now: those below their limit, while the checkpoint has
        room (2 compares, 1 op each). The rest wait for a later round."""
        adds: list[MemberId] = []
        for m in missing:
            member = self.state.members.get(m)
            full = member is None or self.total.get(m, 0) >= member.item_limit
            if full or room.compares < 2 or room.ops < 1:
                self.tally.deferred_adds += 1
                continue
            adds.append(m)
            self.total[m] = self.total.get(m, 0) + 1
            room.compares, room.ops = room.compares - 2, room.ops - 1
        return adds

    def _write_adds(
        self,
        cp: _Checkpoint,
        item_id: str,
        adds: list[MemberId],
        current: Sequence[Assignment],
        *,
        primary_needed: bool,
    ) -> None:
        """Put an empty assignment per addition, under the member's lease. Slots follow the
        highest in use; if no assignment will remain, the addition on the member with the
        fewest primaries per limit takes slot 0."""
        s = self.state
        next_slot = max((a.slot for a in current), default=-1) + 1
        primary: MemberId | None = None
        if adds and primary_needed:
            primary = min(adds, key=lambda m: (s.load_ratio(m, self.primary), m))
            self.primary[primary] = self.primary.get(primary, 0) + 1
            next_slot = max(next_slot, 1)
        for m in adds:
            if m == primary:
                slot = 0
            else:
                slot, next_slot = next_slot, next_slot + 1
            key = assignment_key(s.root, item_id, m, slot)
            member = s.members[m]
            cp.compares += [_mod_unchanged(member.kv.key, member.kv.mod_revision), _absent(key)]
            cp.ops.append(OpPut(key, b"", lease=member.kv.lease))
        self.tally.added += len(adds)

    def _write_removes(self, cp: _Checkpoint, removes: list[Assignment]) -> None:
        for a in removes:
            cp.compares.append(_mod_unchanged(a.kv.key, a.kv.mod_revision))
            cp.ops.append(OpDelete(a.kv.key))
            self.total[a.member] = self.total.get(a.member, 0) - 1
            if a.slot == 0:
                self.primary[a.member] = self.primary.get(a.member, 0) - 1
        self.tally.removed += len(removes)

    def _promote(
        self,
        cp: _Checkpoint,
        remaining: list[Assignment],
        want: set[MemberId],
        consistent: set[bytes],
        existing: set[bytes],
    ) -> bool:
        """Move the best remaining assignment to slot 0: a consistent one (it can serve at
        once), then one that stays (not about to be removed), then on the member with the
        fewest primaries per limit."""
        s = self.state
        best = min(
            remaining,
            key=lambda a: (
                a.kv.key not in consistent,
                a.member not in want,
                s.load_ratio(a.member, self.primary),
                a.slot,
                a.member,
            ),
        )
        if not self._move(cp, best, 0, existing):
            return False
        self.primary[best.member] = self.primary.get(best.member, 0) + 1
        self.tally.promoted += 1
        return True

    def _constrain_removals(
        self, item: Item, candidates: list[Assignment], consistent: set[bytes]
    ) -> tuple[list[Assignment], list[Assignment]]:
        """Split removal candidates into those that may go now and those that must stay."""
        s = self.state
        # Most loaded members shed first; a member that is gone or drained is infinitely loaded.
        ordered = sorted(candidates, key=lambda a: (-s.load_ratio(a.member, self.total), a.kv.key))
        n = sum(1 for a in s.assignments_of(item.id) if a.kv.key in consistent)
        removes: list[Assignment] = []
        deferred: list[Assignment] = []
        for a in ordered:
            if n < item.replication:
                # Too few consistent replicas: remove nothing, not even inconsistent ones.
                deferred.append(a)
            elif a.kv.key in consistent:
                if n == item.replication:
                    deferred.append(a)
                else:
                    n -= 1
                    removes.append(a)
            else:
                removes.append(a)
        return removes, deferred

    def _move(self, cp: _Checkpoint, a: Assignment, slot: int, existing: set[bytes]) -> bool:
        """Re-key ``a`` to ``slot``, keeping its value (hence its consistency) and lease."""
        key = assignment_key(self.state.root, a.item_id, a.member, slot)
        if key in existing:
            return False  # A duplicate key of this member holds it; left for its removal.
        cp.compares += [_mod_unchanged(a.kv.key, a.kv.mod_revision), _absent(key)]
        cp.ops += [OpDelete(a.kv.key), OpPut(key, a.kv.value, lease=a.kv.lease)]
        return True

    def _pack(self, cp: _Checkpoint, remaining: list[Assignment], existing: set[bytes]) -> None:
        if not remaining or remaining[0].slot != 0:
            return
        for index, a in enumerate(remaining):
            # Sorted by slot: the assignments before this one hold slots below ``index``.
            if a.slot != index:
                if self._move(cp, a, index, existing):
                    self.tally.packed += 1
                return

    # -- Items that are gone ---------------------------------------------------------------------

    def dead(self, item_id: str, batcher: _Batcher) -> None:
        s = self.state
        absent = _absent(item_key(s.root, item_id))
        # Each deletion takes one compare and one op, besides the item's absence.
        chunk = self.budget - 1
        current = s.assignments_of(item_id)
        for start in range(0, len(current), chunk):
            cp = _Checkpoint(compares=[absent])
            for a in current[start : start + chunk]:
                cp.compares.append(_mod_unchanged(a.kv.key, a.kv.mod_revision))
                cp.ops.append(OpDelete(a.kv.key))
            batcher.add(cp)
        self.tally.removed_dead += len(current)


def plan(
    state: State,
    desired: Mapping[str, Collection[MemberId]],
    leader: MemberId,
    *,
    is_consistent: IsConsistent,
    txn_ops_max: int = txn_ops_max_default,
) -> Plan:
    """The transactions of one convergence round, in order (see the module docstring).

    ``desired`` maps item ids to their desired members (``Solution.desired``); items it does not
    name are desired nowhere. ``leader`` is the member planning, whose key guards every
    transaction.
    """
    if txn_ops_max < txn_ops_min:
        raise PlanError(f"txn_ops_max: must be >= {txn_ops_min} (got {txn_ops_max})")
    me = state.members.get(leader)
    if me is None:
        raise PlanError(f"leader {leader}: no member key in the state")
    fixed = [_mod_unchanged(me.kv.key, me.kv.mod_revision)]
    batcher = _Batcher(fixed, txn_ops_max)
    planner = _Planner(state, desired, is_consistent, budget=txn_ops_max - len(fixed))

    for item_id in sorted(state.items.keys() | state.assignments.keys()):
        item = state.items.get(item_id)
        if item is None:
            planner.dead(item_id, batcher)
        else:
            batcher.add(planner.item(item))
    batcher.flush()
    t = planner.tally
    return Plan(
        txns=tuple(batcher.txns),
        added=t.added,
        removed=t.removed,
        promoted=t.promoted,
        packed=t.packed,
        removed_dead=t.removed_dead,
        deferred_adds=t.deferred_adds,
        deferred_removals=t.deferred_removals,
    )
