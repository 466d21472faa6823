"""The simulation's invariants, checked after every step.

`ref` is the journal as committed so far: every member's committed prefix (read up to its
durable commit offset, from its log or, below its base, from the snapshot store) must agree
with it byte for byte, and extends it. Checked after every step:

  agreement      every member's committed prefix agrees with `ref` (no offset written twice;
                 any two committed logs are prefixes of one another); the store holds only
                 `ref` content;
  durable acks   the newest acknowledged append is held durably by a member of every quorum
                 of the ensemble (or compacted into the store), so no election can lose it; every
                 acknowledged append's bytes are `ref`'s bytes at its offsets;
  reads          every read returned `ref`'s bytes: as `ref` never changes, no reader saw
                 content that was later truncated;
  completeness   every member that a quorum could elect (the most up-to-date durable head of
                 some quorum: the coordinator's rule) holds the newest committed entry. This is
                 what makes a commit safe, checked when the commit happens rather than when a
                 later election would lose it;
  one leader     at most one member leads a term, so at most one commits in it;
  monotonic      no member's commit offset ever goes back (restarts included; a wiped disk
                starts again from nothing);
  registers      every member's registers as of a committed offset agree with `ref_registers`
                (the registers each committed offset was first seen with); an acknowledged
                compare-and-set append found, just before its entry, the registers it checked
                and left the ones it was answered with (a check never passes against registers
                later truncated away); a mismatch was answered with the registers committed
                at its offset (never a value a new leader then truncated).

"The ensemble" is the term register's current one, which ensemble changes move (the members
are a pool, some outside it): whatever the rules, the next election fences a quorum of the
register's ensemble, so every quorum of it must hold what was committed and acknowledged. The
judge's quorum is its own (a majority of that ensemble), never the rules'.

A member whose disk was wiped holds nothing and may not vote until a leader aligns it (the
host's `voter`): "a quorum" above means a quorum of the voters, so with one disk lost of three
the two others must both hold what was committed and acknowledged.

At the end, after the faults stop, every acknowledged append must lie within `ref`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from broker.quorum.entry import NO_REGISTERS, EntryId, Registers
from broker.quorum.errors import QuorumInvariantError
from broker.quorum.log import ReplicaLog
from broker.quorum.member import Member
from broker.quorum.states import ReplicaState


class MemberHost(Protocol):
    """What hosts a member: its name and its running core (None while crashed)."""

    @property
    def name(self) -> str: ...

    @property
    def member(self) -> Member | None: ...

    @property
    def voter(self) -> bool: ...


class Violation(Exception):
    """An invariant failed; `invariant` names it."""

    def __init__(self, invariant: str, detail: str) -> None:
        self.invariant = invariant
        self.detail = detail
        super().__init__(f"{invariant}: {detail}")


@dataclass(frozen=True, slots=True)
class Acked:
    data: bytes
    entry: EntryId
    begin: int
    end: int
    check: Registers | None = None  # what a compare-and-set append checked
    registers: Registers | None = None  # the registers it was answered with


class Checker:
    def __init__(self, pool: tuple[str, ...]) -> None:
        self.pool = pool  # every member, in the order of `check`'s logs and hosts
        self.ref = bytearray()
        # The registers as of each committed offset that ends an entry (0: the empty journal).
        self.ref_registers: dict[int, Registers] = {0: NO_REGISTERS}
        self.registers_verified = 0
        self.mismatches_verified = 0
        self._mismatches: list[tuple[int, Registers]] = []
        self.commit_seen = dict.fromkeys(pool, 0)  # offsets
        self.commit_index_seen = dict.fromkeys(pool, 0)
        self.leader_of_term: dict[int, str] = {}
        self.store_checked = 0
        self.acked_count = 0
        self.read_count = 0
        self.max_acked: EntryId | None = None
        self._unverified: list[Acked] = []
        self._reads: list[tuple[str, int, bytes]] = []
        # (max_acked, total drops of all logs) when a quorum last held max_acked: holding an
        # entry only stops through a drop, so the count is redone only after one.
        self._held_checked: tuple[object, ...] = (None, -1)
        self._quorums: dict[tuple[str, ...], tuple[tuple[int, ...], ...]] = {}
        self._electable_checked: tuple[object, ...] = ()

    # --- Observations (recorded during a step, checked after it) ---------------------------------

    def on_ack(self, acked: Acked) -> None:
        if acked.end - acked.begin != len(acked.data):
            raise Violation(
                "acked append",
                f"{acked.entry} [{acked.begin},{acked.end}) for {len(acked.data)} bytes",
            )
        self.acked_count += 1
        self._unverified.append(acked)
        if self.max_acked is None or acked.entry > self.max_acked:
            self.max_acked = acked.entry

    def on_disk_lost(self, member: str) -> None:
        """`member`'s log was replaced by an empty one: its commit starts from nothing."""
        self.commit_seen[member] = 0
        self.commit_index_seen[member] = 0
        self._held_checked = (None, -1)
        self._electable_checked = ()

    def on_mismatch(self, end: int, registers: Registers) -> None:
        """An append's register check failed against `registers`, committed through `end`."""
        self._mismatches.append((end, registers))

    def on_read(self, member: str, offset: int, data: bytes) -> None:
        self.read_count += 1
        self._reads.append((member, offset, data))

    # --- The check ---------------------------------------------------------------------------------

    def check(
        self,
        logs: dict[str, ReplicaLog],
        members: Sequence[MemberHost],
        store: bytes | bytearray,
        ensemble: tuple[str, ...],
    ) -> None:
        seen = self.commit_index_seen
        for name, log in logs.items():
            if log.commit_index != seen[name]:
                self._check_member(name, log, store)
        if len(store) > self.store_checked:
            self._agree(
                self.store_checked, bytes(store[self.store_checked :]), "the store", extend=False
            )
            self.store_checked = len(store)
        for node in members:
            member = node.member
            if member is not None and member.state is ReplicaState.LEADER:
                name = node.name
                other = self.leader_of_term.setdefault(member.term, name)
                if other != name:
                    raise Violation(
                        "one leader", f"{other} and {name} both lead term {member.term}"
                    )
        if self._reads:
            for name, offset, data in self._reads:
                self._agree(offset, data, f"a read at {name}", extend=False)
            self._reads.clear()
        if self._unverified:
            ref_len = len(self.ref)
            keep = []
            for acked in self._unverified:
                if acked.end <= ref_len:
                    if self.ref[acked.begin : acked.end] != acked.data:
                        raise Violation(
                            "acknowledged append lost",
                            f"{acked.entry} [{acked.begin},{acked.end}) holds {bytes(self.ref[acked.begin : acked.end])!r}, acknowledged {acked.data!r}",
                        )
                    self._verify_registers(acked)
                else:
                    keep.append(acked)
            self._unverified = keep
        if self._mismatches:
            waiting = []
            for end, registers in self._mismatches:
                if end > len(self.ref):
                    waiting.append((end, registers))
                elif end in self.ref_registers:
                    self.mismatches_verified += 1
                    self._registers_agree(end, registers, "a mismatch answer")
            self._mismatches = waiting
        voters = tuple(node.voter for node in members)
        quorums = self._quorums.get(ensemble)
        if quorums is None:
            index = tuple(self.pool.index(m) for m in ensemble)
            quorums = tuple(itertools.combinations(index, len(ensemble) // 2 + 1))
            self._quorums[ensemble] = quorums
        self._check_electable(list(logs.values()), voters, quorums)
        newest = self.max_acked
        if newest is not None:
            drops = sum(log.drops for log in logs.values())
            if self._held_checked == (newest, drops, voters, ensemble):
                return
            self._held_checked = (newest, drops, voters, ensemble)
            # Every quorum of voters of the ensemble must include a holder.
            in_ensemble = [self.pool.index(m) for m in ensemble]
            need = sum(voters[i] for i in in_ensemble) - (len(ensemble) // 2 + 1) + 1
            all_logs = list(logs.values())
            held = sum(1 for i in in_ensemble if voters[i] and all_logs[i].holds_durably(newest))
            if held < need:
                raise Violation(
                    "acknowledged append lost",
                    f"{newest} is held durably by {held} voting members, fewer than the {need} every quorum of voters needs",
                )

    def _check_electable(
        self,
        logs: list[ReplicaLog],
        voters: tuple[bool, ...],
        quorums: tuple[tuple[int, ...], ...],
    ) -> None:
        # Durable heads and commits change only with these counters: skip unchanged steps.
        key = (
            *(x for log in logs for x in (log.commit_index, log.synced_index, log.drops)),
            *voters,
            quorums,
        )
        if key == self._electable_checked:
            return
        self._electable_checked = key
        newest: EntryId | None = None
        for log in logs:
            index = log.commit_index
            if index and (newest is None or index > newest.index):
                newest = EntryId(log.term_at(index) or 0, index)
        if newest is None:
            return
        heads = [EntryId(log.term_at(log.synced_index) or 0, log.synced_index) for log in logs]
        for quorum in quorums:
            if not all(voters[i] for i in quorum):
                continue  # a quorum with a non-voter elects no one
            chosen = max(quorum, key=heads.__getitem__)
            if not logs[chosen].holds_durably(newest):
                names = [self.pool[i] for i in quorum]
                raise Violation(
                    "leader completeness",
                    f"quorum {names} would elect {self.pool[chosen]} (head {heads[chosen]}), "
                    f"which lacks committed entry {newest}",
                )

    def _verify_registers(self, acked: Acked) -> None:
        before = self.ref_registers.get(acked.begin)
        if acked.check is not None and before is not None:
            self.registers_verified += 1
            if before != acked.check:
                raise Violation(
                    "registers",
                    f"{acked.entry} checked registers {acked.check}, but the committed journal "
                    f"held {before} before it",
                )
        if acked.registers is not None and acked.end in self.ref_registers:
            self._registers_agree(acked.end, acked.registers, f"the answer to {acked.entry}")

    def _registers_agree(self, end: int, registers: Registers, what: str) -> None:
        known = self.ref_registers.setdefault(end, registers)
        if known != registers:
            raise Violation(
                "registers", f"{what}: registers {registers} at offset {end}, committed as {known}"
            )

    def check_final(self) -> None:
        if self._unverified:
            first = self._unverified[0]
            raise Violation(
                "acknowledged append lost",
                f"{first.entry} [{first.begin},{first.end}) is not within the committed journal (length {len(self.ref)})",
            )

    # --- Helpers ---------------------------------------------------------------------------------

    def _check_member(self, name: str, log: ReplicaLog, store: bytes | bytearray) -> None:
        if log.commit_index < self.commit_index_seen[name]:
            raise Violation(
                "monotonic commit",
                f"{name}'s commit index went from {self.commit_index_seen[name]} back to {log.commit_index}",
            )
        self.commit_index_seen[name] = log.commit_index
        commit = log.end_at(log.commit_index)
        seen = self.commit_seen[name]
        if commit == seen:
            return
        if commit < seen:
            raise Violation(
                "monotonic commit", f"{name}'s commit offset went from {seen} back to {commit}"
            )
        base_end = log.base.end
        if seen < base_end:
            if len(store) < base_end:
                raise Violation(
                    "agreement",
                    f"{name} compacted through {base_end}; the store holds {len(store)}",
                )
            self._agree(seen, bytes(store[seen:base_end]), f"{name} (snapshot)")
            self._registers_agree(base_end, log.base.registers, f"{name}'s base")
            seen = base_end
        if commit > seen:
            self._agree(seen, log.read(seen, commit), name)
            index = log.first_index_at_or_after(seen)
            while index <= log.commit_index:
                entry = log.entry(index)
                if entry is None:
                    raise QuorumInvariantError(f"{name}: no entry {index} below its commit")
                self._registers_agree(entry.end, log.registers_at(index), name)
                index += 1
        self.commit_seen[name] = commit

    def _agree(self, begin: int, data: bytes, what: str, extend: bool = True) -> None:
        ref = self.ref
        end = begin + len(data)
        if begin > len(ref):
            raise Violation(
                "agreement",
                f"{what}: committed content at {begin}, beyond the committed journal ({len(ref)})",
            )
        overlap = min(end, len(ref))
        if ref[begin:overlap] != data[: overlap - begin]:
            at = next(i for i in range(begin, overlap) if ref[i] != data[i - begin])
            raise Violation(
                "agreement",
                f"{what}: offset {at} holds {data[at - begin : at - begin + 16]!r}, committed as {bytes(ref[at : at + 16])!r}",
            )
        if end > len(ref):
            if not extend:
                raise Violation(
                    "agreement",
                    f"{what}: read through {end}, beyond the committed journal ({len(ref)})",
                )
            ref.extend(data[overlap - begin :])
