"""The term register: one compare-and-swap value per journal, in the keyspace.

It holds the journal's current `TermRecord`: the term, the coordinator that owns it, the
ensemble, and the leader once chosen. Every change is a compare-and-swap on the revision the
writer read, so that two coordinators can never both own a term or appoint two leaders in one:
the broker keeps it in etcd (or the embedded keyspace) under a key such as
`<root>/quorum/<journal>`, with the same mod-revision discipline as assignments. The core only
needs the `CasRegister` protocol; `MemoryCasRegister` is the linearizable in-memory one the
simulation and tests use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class TermRecord:
    term: int
    owner: str  # the coordinator that claimed the term ("" for the initial record)
    ensemble: tuple[str, ...]
    leader: str = ""  # "" until the owner appoints one
    # An ensemble change not yet established (Rules.next_ensemble): the ensemble of the last
    # term known to have established (its barrier committed) when `ensemble` differs from it;
    # () once a term of `ensemble` is known to have established (settled). While unsettled,
    # committed entries may be held by a quorum of either (they differ by one member, so
    # their quorums intersect): no further change until it settles (docs/design/quorum.md,
    # "Ensemble changes").
    previous: tuple[str, ...] = ()

    @property
    def settled(self) -> bool:
        return not self.previous


@dataclass(frozen=True, slots=True)
class Versioned:
    record: TermRecord
    revision: int


@dataclass(frozen=True, slots=True)
class CasResult:
    ok: bool
    current: Versioned  # the register after the attempt (the new value when ok)


class CasRegister(Protocol):
    def read(self) -> Versioned: ...

    def compare_and_swap(self, expect_revision: int, record: TermRecord) -> CasResult: ...


class MemoryCasRegister:
    """A linearizable register in memory. Revisions start at 1 and grow with each write."""

    def __init__(self, initial: TermRecord) -> None:
        self._value = Versioned(initial, 1)
        self.writes = 0

    def read(self) -> Versioned:
        return self._value

    def compare_and_swap(self, expect_revision: int, record: TermRecord) -> CasResult:
        if expect_revision != self._value.revision:
            return CasResult(False, self._value)
        self._value = Versioned(record, self._value.revision + 1)
        self.writes += 1
        return CasResult(True, self._value)


# Messages between a coordinator and its register, for shells where the register is remote
# (etcd; the simulation's register node). `request_id` pairs an answer with its request.


@dataclass(frozen=True, slots=True)
class RegisterRead:
    coordinator: str
    request_id: int


@dataclass(frozen=True, slots=True)
class RegisterCas:
    coordinator: str
    request_id: int
    expect_revision: int
    record: TermRecord


@dataclass(frozen=True, slots=True)
class RegisterReply:
    request_id: int
    ok: bool
    current: Versioned
