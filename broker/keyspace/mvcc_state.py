"""The state of the MVCC store (mvcc.py) and its durable form: the live keys, the log of
commits, the leases; the primitive changes every request is made of (a put, a delete, a
commit of one revision, a compaction); and the changes recorded, the snapshot and the redo
that rebuild a store from them. Sans-IO, as mvcc.py.

How history is kept. The live state is a dict of current KeyValues plus a sorted list of live keys.
Every mutating revision appends a ``Commit`` to a log: its events, and for each event the key's
KeyValue just before it. That one log serves both reads of the past and watches:

* a watch from revision r replays the commits >= r;
* a range at revision r starts from the live state and undoes, newest first, the commits > r.

Compaction discards commits older than the compact revision, so both reads and watches before it
fail with CompactedError, as in etcd. The log is bounded: beyond ``history_revisions_max``
revisions, the oldest are compacted automatically.

Deviation from etcd worth knowing: etcd's compaction at revision r also drops a tombstone written
exactly at r, so a watch from r may miss that deletion. We keep every event >= r, which is never
less than etcd delivers.

Persistence. With ``record_changes``, every public mutation also records the ``Change`` it made
(changes.py), which the caller takes with ``take_changes`` and makes durable; ``redo`` applies
such a change to a store being rebuilt, and ``state``/``load_state`` are its snapshot.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from broker.keyspace.backend import Event, EventType, KeyValue
from broker.keyspace.changes import (
    Change,
    Commit,
    Committed,
    Compacted,
    LeaseGranted,
    LeaseRevoked,
    RedoError,
    StoreState,
)
from broker.keyspace.request_checks import RequestLimits

# Revisions of history kept readable behind the current one before automatic compaction.
history_revisions_max_default = 10_000
# etcd (default flags) raises smaller TTLs to 1.5 election timeouts, rounded up: 2 s.
lease_ttl_min_s_default = 2
# etcd's MaxLeaseTTL.
lease_ttl_max_s = 9_000_000_000
# etcd's default --max-txn-ops: operations per txn branch (and compares per txn).
txn_ops_max_default = 128
# etcd's default --max-request-bytes (1.5 MiB), applied to the key and value bytes of a request.
request_bytes_max_default = 1_572_864

# etcd starts a fresh store at revision 1.
INITIAL_REVISION = 1


@dataclass(slots=True)
class Lease:
    """A granted lease: its TTL, its deadline (on the caller's clock) and its keys."""

    lease_id: int
    ttl_s: int
    deadline: float
    keys: set[bytes] = field(default_factory=set)


class MVCCState:
    """The store's state (see the module docstring); `MVCCStore` (mvcc.py) is the store over
    it. Not thread-safe; the caller serialises calls."""

    def __init__(
        self,
        *,
        history_revisions_max: int = history_revisions_max_default,
        lease_ttl_min_s: int = lease_ttl_min_s_default,
        txn_ops_max: int = txn_ops_max_default,
        request_bytes_max: int = request_bytes_max_default,
        record_changes: bool = False,
    ) -> None:
        if history_revisions_max < 1:
            raise ValueError(f"history_revisions_max: must be >= 1 (got {history_revisions_max})")
        if lease_ttl_min_s < 0:
            raise ValueError(f"lease_ttl_min_s: must be >= 0 (got {lease_ttl_min_s})")
        if txn_ops_max < 1 or request_bytes_max < 1:
            raise ValueError("txn_ops_max and request_bytes_max: must be >= 1")
        self._history_revisions_max = history_revisions_max
        self._lease_ttl_min_s = lease_ttl_min_s
        self._limits = RequestLimits(txn_ops_max, request_bytes_max)

        self._revision = INITIAL_REVISION
        self._compact_revision = 0
        self._kvs: dict[bytes, KeyValue] = {}
        self._keys: list[bytes] = []  # live keys, sorted
        # Commits of every revision >= compact revision (revision 1 has none: nothing happened).
        self._log: dict[int, Commit] = {}
        self._leases: dict[int, Lease] = {}
        self._next_lease_id = 1
        # The store's identity in response headers, as etcd's (zero until the embedded store
        # sets it: see EmbeddedStore). Not part of the state: it belongs to whoever runs it.
        self.cluster_id = 0
        self.member_id = 0
        self.raft_term = 0
        # Changes made since the last take_changes() (None: not recorded).
        self._changes: list[Change] | None = [] if record_changes else None

    def _live_range(self, key: bytes, range_end: bytes | None) -> list[KeyValue]:
        lo, hi = self._live_bounds(key, range_end)
        return [self._kvs[k] for k in self._keys[lo:hi]]

    def _live_bounds(self, key: bytes, range_end: bytes | None) -> tuple[int, int]:
        lo = bisect.bisect_left(self._keys, key)
        if range_end is None:
            hi = lo + 1 if lo < len(self._keys) and self._keys[lo] == key else lo
        elif range_end == b"\x00":
            hi = len(self._keys)
        else:
            hi = max(lo, bisect.bisect_left(self._keys, range_end))
        return lo, hi

    def _compact_to(self, revision: int) -> None:
        for rev in range(max(self._compact_revision, INITIAL_REVISION), revision):
            self._log.pop(rev, None)
        self._compact_revision = revision

    def _put(self, pending: Pending, key: bytes, value: bytes, lease: int) -> None:
        rev = pending.revision
        prior = self._kvs.get(key)
        if prior is None:
            kv = KeyValue(key, value, rev, rev, 1, lease)
            bisect.insort(self._keys, key)
        else:
            kv = KeyValue(key, value, prior.create_revision, rev, prior.version + 1, lease)
            self._detach(prior)
        if lease:
            self._leases[lease].keys.add(key)
        self._kvs[key] = kv
        pending.add(Event(EventType.PUT, kv), prior)

    def _delete(self, pending: Pending, key: bytes, range_end: bytes | None) -> int:
        lo, hi = self._live_bounds(key, range_end)
        doomed = self._keys[lo:hi]
        del self._keys[lo:hi]
        for k in doomed:
            prior = self._kvs.pop(k)
            self._detach(prior)
            # etcd's DELETE event carries just the key and the revision of the deletion.
            pending.add(Event(EventType.DELETE, KeyValue(k, b"", 0, pending.revision, 0)), prior)
        return len(doomed)

    def _detach(self, kv: KeyValue) -> None:
        lease = self._leases.get(kv.lease) if kv.lease else None
        if lease is not None:
            lease.keys.discard(kv.key)

    def _commit(self, pending: Pending) -> Commit | None:
        """Record the pending revision if it changed anything (etcd does not advance the
        revision for a request that changed nothing)."""
        if not pending.events:
            return None
        commit = Commit(pending.revision, tuple(pending.events), tuple(pending.priors))
        self._revision = pending.revision
        self._log[commit.revision] = commit
        floor = self._revision - self._history_revisions_max
        if floor > self._compact_revision:
            self._compact_to(floor)  # Not recorded: redoing the commits compacts alike.
        return commit

    # -- Persistence ------------------------------------------------------------------------

    def take_changes(self) -> list[Change]:
        """The changes made since the last call, oldest first (empty unless recording)."""
        if not self._changes:
            return []
        changes, self._changes = self._changes, []
        return changes

    def _record(self, change: Change) -> None:
        if self._changes is not None:
            self._changes.append(change)

    def state(self) -> StoreState:
        """A snapshot of the live state (see StoreState)."""
        last = self._log.get(self._revision)
        return StoreState(
            revision=self._revision,
            compact_revision=self._compact_revision,
            next_lease_id=self._next_lease_id,
            leases=tuple((i, self._leases[i].ttl_s) for i in sorted(self._leases)),
            kvs=tuple(self._kvs[k] for k in self._keys),
            last_events=last.events if last is not None else (),
        )

    def load_state(self, state: StoreState) -> None:
        """Make this fresh store the one ``state`` describes. History before ``state.revision``
        is not in a snapshot, so it is compacted there. Leases come back due at once: their
        deadlines were the previous process's clock, and nobody refreshes them any more."""
        if self._revision != INITIAL_REVISION or self._kvs or self._leases or self._log:
            raise ValueError("load_state: the store is not fresh")
        if not 0 <= state.compact_revision <= state.revision or state.revision < 1:
            raise RedoError(
                f"snapshot: revision {state.revision} and compact revision "
                f"{state.compact_revision} are inconsistent"
            )
        for lease_id, ttl_s in state.leases:
            if lease_id <= 0 or lease_id in self._leases:
                raise RedoError(f"snapshot: lease {lease_id:#x} is invalid or listed twice")
            self._leases[lease_id] = Lease(lease_id, ttl_s, -math.inf)
        for i, kv in enumerate(state.kvs):
            if i and kv.key <= state.kvs[i - 1].key:
                raise RedoError(f"snapshot: key {kv.key!r} is out of order or listed twice")
            if not 0 < kv.create_revision <= kv.mod_revision <= state.revision or kv.version < 1:
                raise RedoError(f"snapshot: key {kv.key!r} has inconsistent revisions")
            if kv.lease:
                lease = self._leases.get(kv.lease)
                if lease is None:
                    raise RedoError(f"snapshot: key {kv.key!r} names unknown lease {kv.lease:#x}")
                lease.keys.add(kv.key)
            self._kvs[kv.key] = kv
        if any(e.kv.mod_revision != state.revision for e in state.last_events):
            raise RedoError(f"snapshot: its last events are not of revision {state.revision}")
        self._keys = [kv.key for kv in state.kvs]
        self._revision = state.revision
        self._compact_revision = state.revision
        if state.last_events:
            # No read is ever of a revision before this one, so the priors are never undone.
            priors = (None,) * len(state.last_events)
            self._log[state.revision] = Commit(state.revision, state.last_events, priors)
        self._next_lease_id = max(state.next_lease_id, 1)

    def redo(self, change: Change) -> None:
        """Apply a recorded change again, in a store being rebuilt from its log. Raises
        RedoError if the change does not follow from the current state."""
        match change:
            case Committed(commit):
                self._redo_commit(commit)
            case LeaseGranted(lease_id, ttl_s):
                if lease_id <= 0 or lease_id in self._leases:
                    raise RedoError(f"grant of lease {lease_id:#x}: invalid or already granted")
                self._leases[lease_id] = Lease(lease_id, ttl_s, -math.inf)
                self._next_lease_id = max(self._next_lease_id, lease_id + 1)
            case LeaseRevoked(lease_id, commit):
                lease = self._leases.get(lease_id)
                if lease is None:
                    raise RedoError(f"revocation of lease {lease_id:#x}: it does not exist")
                deleted = {e.kv.key for e in commit.events} if commit is not None else set()
                if deleted != lease.keys:
                    raise RedoError(
                        f"revocation of lease {lease_id:#x}: deletes {len(deleted)} keys, but "
                        f"the lease has {len(lease.keys)}"
                    )
                del self._leases[lease_id]
                if commit is not None:
                    self._redo_commit(commit)
            case Compacted(revision):
                if revision > self._revision:
                    raise RedoError(f"compaction at {revision}: past revision {self._revision}")
                if revision > self._compact_revision:
                    self._compact_to(revision)

    def _redo_commit(self, commit: Commit) -> None:
        rev = commit.revision
        if rev != self._revision + 1 or not commit.events:
            raise RedoError(
                f"commit of revision {rev} ({len(commit.events)} events) does not follow "
                f"revision {self._revision}"
            )
        pending = Pending(rev)
        for event in commit.events:
            kv = event.kv
            prior = self._kvs.get(kv.key)
            if event.type is EventType.PUT:
                created = prior is None
                expected = KeyValue(
                    kv.key,
                    kv.value,
                    rev if prior is None else prior.create_revision,
                    rev,
                    1 if prior is None else prior.version + 1,
                    kv.lease,
                )
                if kv != expected or (kv.lease and kv.lease not in self._leases):
                    raise RedoError(f"revision {rev}: put of {kv.key!r} does not follow")
                if prior is not None:
                    self._detach(prior)
                if kv.lease:
                    self._leases[kv.lease].keys.add(kv.key)
                self._kvs[kv.key] = kv
                if created:
                    bisect.insort(self._keys, kv.key)
            else:
                if prior is None or kv != KeyValue(kv.key, b"", 0, rev, 0):
                    raise RedoError(f"revision {rev}: delete of {kv.key!r} does not follow")
                del self._kvs[kv.key]
                del self._keys[bisect.bisect_left(self._keys, kv.key)]
                self._detach(prior)
            pending.add(event, prior)
        self._commit(pending)


class Pending:
    """Changes being made at one revision, before they are committed."""

    __slots__ = ("events", "priors", "revision")

    def __init__(self, revision: int) -> None:
        self.revision = revision
        self.events: list[Event] = []
        self.priors: list[KeyValue | None] = []

    def add(self, event: Event, prior: KeyValue | None) -> None:
        self.events.append(event)
        self.priors.append(prior)
