"""A sans-IO allocator keyspace for tests, over the embedded MVCC core.

Values are plain text, as in Gazette's allocator tests: an item's value is its replication, a
member's its item limit, and an assignment is consistent when its value is ``consistent``.
``Fixture.converge()`` plays the allocator shell's loop without asyncio: solve (cached on the
network key, as the shell does), plan, apply every transaction (each must succeed), and repeat
until a round has nothing to do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from broker.allocator.converge import Plan, plan
from broker.allocator.solver import Solution, solve_state
from broker.allocator.state import (
    ASSIGN,
    Assignment,
    Item,
    MemberId,
    State,
    assignment_key,
    item_key,
    member_key,
    parse_member_id,
    parse_state,
)
from broker.keyspace.backend import KeyValue, prefix_end
from broker.keyspace.keyspace import Entry
from broker.keyspace.mvcc import MVCCStore

ROOT = "/root"
CONSISTENT = b"consistent"


def int_value(entry: Entry[object]) -> int:
    return int(entry.kv.value)


def value_is_consistent(item: Item, a: Assignment, all_assignments: Sequence[Assignment]) -> bool:
    del item, all_assignments
    return a.value == CONSISTENT


def entries(kvs: Sequence[KeyValue]) -> list[Entry[object]]:
    return [Entry(kv, None) for kv in kvs]


@dataclass
class Fixture:
    store: MVCCStore = field(default_factory=MVCCStore)
    leases: dict[MemberId, int] = field(default_factory=dict)
    is_consistent: Callable[[Item, Assignment, Sequence[Assignment]], bool] = value_is_consistent
    txn_ops_max: int = 128
    _cache: tuple[object, Solution] | None = None

    # -- Writing the keyspace -----------------------------------------------------------------

    def item(self, item_id: str, replication: int) -> None:
        self.store.put(item_key(ROOT, item_id), str(replication).encode())

    def member(self, name: str, limit: int) -> MemberId:
        m = parse_member_id(name)
        if m not in self.leases:
            self.leases[m], _ = self.store.lease_grant(60, now=0.0)
        self.store.put(member_key(ROOT, m), str(limit).encode(), self.leases[m])
        return m

    def assign(self, item_id: str, member: str, slot: int, value: bytes = CONSISTENT) -> None:
        m = parse_member_id(member)
        self.store.put(assignment_key(ROOT, item_id, m, slot), value, self.leases.get(m, 0))

    def insert(self, *pairs: tuple[str, str | int]) -> None:
        """Gazette-style fixtures: ("items/x", 3), ("members/z#s", 10), ("assign/x#z#s#0", "")."""
        for path, value in pairs:
            kind, _, rest = path.partition("/")
            if kind == "items":
                self.item(rest, int(value))
            elif kind == "members":
                self.member(rest, int(value))
            elif kind == "assign":
                item_id, zone, suffix, slot = rest.split("#")
                self.assign(item_id, f"{zone}#{suffix}", int(slot), str(value).encode())
            else:
                raise ValueError(path)

    def delete_item(self, item_id: str) -> None:
        self.store.delete(item_key(ROOT, item_id))

    def revoke(self, name: str) -> None:
        """The member's lease ends: its key and assignments vanish in one revision."""
        self.store.lease_revoke(self.leases.pop(parse_member_id(name)))

    def mark_all_consistent(self) -> None:
        """Every replica catches up: each assignment's value becomes ``consistent``."""
        for kv in self._assignment_kvs():
            if kv.value != CONSISTENT:
                self.store.put(kv.key, CONSISTENT, kv.lease)

    # -- Reading it ---------------------------------------------------------------------------

    def state(self) -> State:
        root = ROOT.encode()
        kvs = self.store.range(root, prefix_end(root)).kvs
        return parse_state(
            ROOT,
            self.store.revision,
            entries(kvs),
            replication_of=int_value,
            item_limit_of=int_value,
        )

    def keys(self) -> list[str]:
        """Assignment keys, relative to <root>/assign/, in key order."""
        prefix = len(ROOT + ASSIGN)
        return [kv.key.decode()[prefix:] for kv in self._assignment_kvs()]

    def _assignment_kvs(self) -> list[KeyValue]:
        prefix = (ROOT + ASSIGN).encode()
        return list(self.store.range(prefix, prefix_end(prefix)).kvs)

    # -- Playing the allocator ----------------------------------------------------------------

    def solution(self, state: State) -> Solution:
        network = state.network_key()
        if self._cache is None or self._cache[0] != network:
            self._cache = (network, solve_state(state))
        return self._cache[1]

    def plan(self) -> Plan:
        state = self.state()
        assert state.leader is not None
        return plan(
            state,
            self.solution(state).desired,
            state.leader,
            is_consistent=self.is_consistent,
            txn_ops_max=self.txn_ops_max,
        )

    def apply(self, p: Plan, after_each: Callable[[], None] | None = None) -> None:
        for txn in p.txns:
            resp, _ = self.store.txn(txn.compares, txn.ops)
            assert resp.succeeded, "a freshly planned transaction must pass its compares"
            if after_each is not None:
                after_each()

    def converge(self, rounds_max: int = 20, after_each: Callable[[], None] | None = None) -> int:
        """Plan and apply rounds until one is idle; returns the rounds that changed something."""
        for rounds in range(rounds_max):
            p = self.plan()
            if p.idle:
                return rounds
            self.apply(p, after_each)
        raise AssertionError(f"not idle after {rounds_max} rounds")
