"""A sans-IO, in-memory MVCC key/value store with etcd v3 semantics.

This is the core of the embedded backend: values in, responses and commits out. It imports no
asyncio and reads no clock; lease expiry is driven by the ``now`` its caller passes in. The async
shell (``embedded.py``) serialises calls, runs lease expiry on a timer and feeds watchers from the
``Commit`` each mutation returns.

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
from collections.abc import Sequence
from dataclasses import dataclass, field

from broker.keyspace.backend import (
    CompactedError,
    Compare,
    CompareTarget,
    Event,
    EventType,
    FutureRevisionError,
    Header,
    KeySpaceError,
    KeyValue,
    LeaseNotFoundError,
    Op,
    OpDelete,
    OpPut,
    RangeResponse,
    TxnResponse,
)
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
from broker.keyspace.request_checks import (
    InvalidRequestError,
    RequestLimits,
    check_key,
    holds,
    in_range,
)

__all__ = [
    "Commit",
    "InvalidRequestError",
    "LeaseExistsError",
    "MVCCStore",
    "in_range",
]

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
_initial_revision = 1


class LeaseExistsError(KeySpaceError):
    """A grant asked for a lease ID that is already in use."""

    def __init__(self, lease_id: int) -> None:
        super().__init__(f"lease {lease_id:#x} already exists")
        self.lease_id = lease_id


@dataclass(slots=True)
class _Lease:
    lease_id: int
    ttl_s: int
    deadline: float
    keys: set[bytes] = field(default_factory=set)


class MVCCStore:
    """The store. Not thread-safe; the caller serialises calls."""

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

        self._revision = _initial_revision
        self._compact_revision = 0
        self._kvs: dict[bytes, KeyValue] = {}
        self._keys: list[bytes] = []  # live keys, sorted
        # Commits of every revision >= compact revision (revision 1 has none: nothing happened).
        self._log: dict[int, Commit] = {}
        self._leases: dict[int, _Lease] = {}
        self._next_lease_id = 1
        # The store's identity in response headers, as etcd's (zero until the embedded store
        # sets it: see EmbeddedStore). Not part of the state: it belongs to whoever runs it.
        self.cluster_id = 0
        self.member_id = 0
        self.raft_term = 0
        # Changes made since the last take_changes() (None: not recorded).
        self._changes: list[Change] | None = [] if record_changes else None

    # -- Reads ------------------------------------------------------------------------------

    @property
    def revision(self) -> int:
        return self._revision

    @property
    def compact_revision(self) -> int:
        return self._compact_revision

    def header(self) -> Header:
        return self.header_at(self._revision)

    def header_at(self, revision: int) -> Header:
        """A response header at ``revision``, with the store's identity."""
        return Header(revision, self.cluster_id, self.member_id, self.raft_term)

    def range(self, key: bytes, range_end: bytes | None = None, revision: int = 0) -> RangeResponse:
        check_key("range", key)
        if revision < 0:
            raise InvalidRequestError(f"range: revision must be >= 0 (got {revision})")
        if revision > self._revision:
            raise FutureRevisionError(
                f"range: revision {revision} is in the future (current revision is "
                f"{self._revision})"
            )
        if revision == 0 or revision == self._revision:
            return RangeResponse(self.header(), tuple(self._live_range(key, range_end)))
        if revision < self._compact_revision:
            raise CompactedError(revision, self._compact_revision)

        state = {kv.key: kv for kv in self._live_range(key, range_end)}
        for rev in range(self._revision, revision, -1):
            commit = self._log[rev]
            for event, prior in zip(reversed(commit.events), reversed(commit.priors), strict=True):
                k = event.kv.key
                if not in_range(k, key, range_end):
                    continue
                if prior is None:
                    state.pop(k, None)
                else:
                    state[k] = prior
        return RangeResponse(self.header(), tuple(state[k] for k in sorted(state)))

    def replay(
        self, key: bytes, range_end: bytes | None, start: int, end: int, events_max: int
    ) -> tuple[tuple[Event, ...], int]:
        """Events in [key, range_end) of revisions start..end, stopping after the first revision
        that brings the count to ``events_max`` or more (a revision is never split). Returns the
        events and the last revision scanned."""
        if start < self._compact_revision:
            raise CompactedError(start, self._compact_revision)
        if end > self._revision:
            raise FutureRevisionError(
                f"replay: revision {end} is in the future (current revision is {self._revision})"
            )
        events: list[Event] = []
        last = start - 1
        for rev in range(start, end + 1):
            commit = self._log.get(rev)
            if commit is not None:
                events.extend(commit.events_in(key, range_end))
            last = rev
            if len(events) >= events_max:
                break
        return tuple(events), last

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

    # -- Writes -----------------------------------------------------------------------------

    def put(self, key: bytes, value: bytes, lease: int = 0) -> tuple[Header, Commit]:
        self._limits.check_put(OpPut(key, value, lease))
        if lease and lease not in self._leases:
            raise LeaseNotFoundError(lease)
        pending = _Pending(self._revision + 1)
        self._put(pending, key, value, lease)
        commit = self._commit(pending)
        assert commit is not None, "a put always mutates"
        self._record(Committed(commit))
        return self.header(), commit

    def delete(
        self, key: bytes, range_end: bytes | None = None
    ) -> tuple[Header, int, Commit | None]:
        check_key("delete", key)
        pending = _Pending(self._revision + 1)
        deleted = self._delete(pending, key, range_end)
        commit = self._commit(pending)
        if commit is not None:
            self._record(Committed(commit))
        return self.header(), deleted, commit

    def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> tuple[TxnResponse, Commit | None]:
        """Evaluate ``compares`` (all must hold), then run one branch as one revision (if it
        mutates anything). Every check that can fail runs before the first change."""
        self._limits.check_txn(compares, success, failure)
        succeeded = all(self._compare(c) for c in compares)
        ops = success if succeeded else failure
        for op in ops:
            if isinstance(op, OpPut) and op.lease and op.lease not in self._leases:
                raise LeaseNotFoundError(op.lease)

        pending = _Pending(self._revision + 1)
        results: list[tuple[KeyValue, ...] | int | None] = []
        for op in ops:
            if isinstance(op, OpPut):
                self._put(pending, op.key, op.value, op.lease)
                results.append(None)
            elif isinstance(op, OpDelete):
                results.append(self._delete(pending, op.key, op.range_end))
            else:
                # Reads inside a txn see the branch's earlier writes, as in etcd.
                results.append(tuple(self._live_range(op.key, op.range_end)))
        commit = self._commit(pending)
        if commit is not None:
            self._record(Committed(commit))
        return TxnResponse(succeeded, self.header(), tuple(results)), commit

    def compact(self, revision: int) -> None:
        """Discard history before ``revision``; it stays readable itself."""
        if revision <= self._compact_revision:
            raise CompactedError(revision, self._compact_revision)
        if revision > self._revision:
            raise FutureRevisionError(
                f"compact: revision {revision} is in the future (current revision is "
                f"{self._revision})"
            )
        self._compact_to(revision)
        self._record(Compacted(revision))

    def _compact_to(self, revision: int) -> None:
        for rev in range(max(self._compact_revision, _initial_revision), revision):
            self._log.pop(rev, None)
        self._compact_revision = revision

    def _put(self, pending: _Pending, key: bytes, value: bytes, lease: int) -> None:
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

    def _delete(self, pending: _Pending, key: bytes, range_end: bytes | None) -> int:
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

    def _commit(self, pending: _Pending) -> Commit | None:
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

    def _compare(self, c: Compare) -> bool:
        kv = self._kvs.get(c.key)
        if kv is None:
            if c.target == CompareTarget.VALUE:
                # etcd: an absent key has no value to compare, so every VALUE compare fails.
                return False
            kv = KeyValue(c.key, b"", 0, 0, 0, 0)
        actual: int | bytes
        match c.target:
            case CompareTarget.VERSION:
                actual = kv.version
            case CompareTarget.CREATE:
                actual = kv.create_revision
            case CompareTarget.MOD:
                actual = kv.mod_revision
            case CompareTarget.VALUE:
                actual = kv.value
            case CompareTarget.LEASE:
                actual = kv.lease
        return holds(actual, c.result, c.value)

    # -- Leases -----------------------------------------------------------------------------

    def lease_grant(self, ttl_s: int, now: float, lease_id: int = 0) -> tuple[int, int]:
        """Grant a lease expiring at ``now + ttl``; ``lease_id`` 0 picks a free ID. Returns the
        ID and the TTL granted (raised to the minimum TTL, as etcd does)."""
        if lease_id < 0:
            raise InvalidRequestError(f"lease grant: ID must be >= 0 (got {lease_id})")
        if ttl_s > lease_ttl_max_s:
            raise InvalidRequestError(f"lease grant: TTL {ttl_s}s exceeds {lease_ttl_max_s}s")
        if lease_id in self._leases:
            raise LeaseExistsError(lease_id)
        if lease_id == 0:
            while self._next_lease_id in self._leases:
                self._next_lease_id += 1
            lease_id = self._next_lease_id
            self._next_lease_id += 1
        ttl = max(ttl_s, self._lease_ttl_min_s)
        self._leases[lease_id] = _Lease(lease_id, ttl, now + ttl)
        self._record(LeaseGranted(lease_id, ttl))
        return lease_id, ttl

    def lease_keepalive(self, lease_id: int, now: float) -> int:
        """Extend a lease to ``now + ttl``; returns the TTL. A lease past its deadline is gone
        even if expire() has not run yet (etcd answers a refresh of it with not-found)."""
        lease = self._leases.get(lease_id)
        if lease is None or lease.deadline <= now:
            raise LeaseNotFoundError(lease_id)
        lease.deadline = now + lease.ttl_s
        return lease.ttl_s

    def lease_revoke(self, lease_id: int) -> tuple[Header, Commit | None]:
        """Drop a lease and delete its keys, in one revision (none if it had no keys)."""
        lease = self._leases.pop(lease_id, None)
        if lease is None:
            raise LeaseNotFoundError(lease_id)
        pending = _Pending(self._revision + 1)
        for key in sorted(lease.keys):
            self._delete(pending, key, None)
        commit = self._commit(pending)
        self._record(LeaseRevoked(lease_id, commit))
        return self.header(), commit

    def lease_keys(self, lease_id: int) -> list[bytes]:
        lease = self._leases.get(lease_id)
        if lease is None:
            raise LeaseNotFoundError(lease_id)
        return sorted(lease.keys)

    def next_lease_deadline(self) -> float | None:
        # A linear scan: leases are few (one per broker or consumer process).
        return min((lease.deadline for lease in self._leases.values()), default=None)

    def expire(self, now: float) -> list[Commit]:
        """Revoke every lease whose deadline is <= ``now``, earliest first; one revision per
        lease that had keys."""
        due = sorted(
            (lease.deadline, lease.lease_id)
            for lease in self._leases.values()
            if lease.deadline <= now
        )
        commits: list[Commit] = []
        for _, lease_id in due:
            _, commit = self.lease_revoke(lease_id)
            if commit is not None:
                commits.append(commit)
        return commits

    def expire_all(self) -> list[Commit]:
        """Revoke every lease (as expire() at the end of time): what a store reopened after its
        process ended does, since no holder of those leases can still be refreshing them."""
        return self.expire(math.inf)

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
        if self._revision != _initial_revision or self._kvs or self._leases or self._log:
            raise ValueError("load_state: the store is not fresh")
        if not 0 <= state.compact_revision <= state.revision or state.revision < 1:
            raise RedoError(
                f"snapshot: revision {state.revision} and compact revision "
                f"{state.compact_revision} are inconsistent"
            )
        for lease_id, ttl_s in state.leases:
            if lease_id <= 0 or lease_id in self._leases:
                raise RedoError(f"snapshot: lease {lease_id:#x} is invalid or listed twice")
            self._leases[lease_id] = _Lease(lease_id, ttl_s, -math.inf)
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
                self._leases[lease_id] = _Lease(lease_id, ttl_s, -math.inf)
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
        pending = _Pending(rev)
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


class _Pending:
    """Changes being made at one revision, before they are committed."""

    __slots__ = ("events", "priors", "revision")

    def __init__(self, revision: int) -> None:
        self.revision = revision
        self.events: list[Event] = []
        self.priors: list[KeyValue | None] = []

    def add(self, event: Event, prior: KeyValue | None) -> None:
        self.events.append(event)
        self.priors.append(prior)
