"""What the MVCC core reports of each change it makes, and what a snapshot of it holds.

A ``Change`` is the durable record of one state transition of the core (mvcc.py): a revision
committed, a lease granted or revoked, history compacted. The persisted store (persisted.py)
writes each change to its write-ahead log before the request that made it is answered, and
replays them into a fresh core at start-up (``MVCCStore.redo``). Changes are *physical*: a commit
carries its events, not the request that produced them, so replaying never re-evaluates a
transaction (whose outcome could differ if the code did) and never reads a clock.

Lease keep-alives are no change: they only move a deadline, and deadlines do not outlive the
process (see MVCCStore.load_state).
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.keyspace.backend import Event, KeySpaceError, KeyValue
from broker.keyspace.request_checks import in_range


class RedoError(KeySpaceError):
    """A logged change or a snapshot does not follow from the state it is applied to (a bug, or
    a log from another store): replay stops rather than build a state that never existed."""


@dataclass(frozen=True, slots=True)
class Commit:
    """One mutating revision: its events in order and, for each event, the KeyValue its key had
    just before it (None if absent). The priors are what a read of an older revision undoes."""

    revision: int
    events: tuple[Event, ...]
    priors: tuple[KeyValue | None, ...]

    def events_in(self, key: bytes, range_end: bytes | None) -> tuple[Event, ...]:
        return tuple(e for e in self.events if in_range(e.kv.key, key, range_end))


@dataclass(frozen=True, slots=True)
class Committed:
    """A put, delete or txn that changed something."""

    commit: Commit


@dataclass(frozen=True, slots=True)
class LeaseGranted:
    lease_id: int
    ttl_s: int


@dataclass(frozen=True, slots=True)
class LeaseRevoked:
    """A lease revoked or expired, and the deletion of its keys in one revision (None if it had
    no keys)."""

    lease_id: int
    commit: Commit | None


@dataclass(frozen=True, slots=True)
class Compacted:
    """An explicit compaction (the automatic ones follow from the commits, so replay redoes
    them by itself)."""

    revision: int


Change = Committed | LeaseGranted | LeaseRevoked | Compacted


@dataclass(frozen=True, slots=True)
class StoreState:
    """The core's live state at ``revision``, without history: what a snapshot holds."""

    revision: int
    compact_revision: int
    next_lease_id: int
    # (lease ID, TTL in seconds), by ID. Their keys are the KeyValues that name them.
    leases: tuple[tuple[int, int], ...]
    # Live KeyValues, sorted by key.
    kvs: tuple[KeyValue, ...]
    # The events of ``revision`` itself: a watch from the revision a snapshot was taken at must
    # still deliver them after a restart.
    last_events: tuple[Event, ...]
