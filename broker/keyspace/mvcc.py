"""A sans-IO, in-memory MVCC key/value store with etcd v3 semantics.

This is the core of the embedded backend: values in, responses and commits out. It imports no
asyncio and reads no clock; lease expiry is driven by the ``now`` its caller passes in. The async
shell (``embedded.py``) serialises calls, runs lease expiry on a timer and feeds watchers from the
``Commit`` each mutation returns.

The state (the live keys, the log of commits, the leases), its primitive changes, and its
durable form (changes recorded, snapshot, redo) are MVCCState's (mvcc_state.py), which explains
how history is kept and how the store persists; this module is the requests on it: reads,
writes, transactions, compaction and leases, each checked before it changes anything.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from broker.keyspace.backend import (
    CompactedError,
    Compare,
    CompareTarget,
    Event,
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
    Commit,
    Committed,
    Compacted,
    LeaseGranted,
    LeaseRevoked,
)
from broker.keyspace.mvcc_state import (
    Lease,
    MVCCState,
    Pending,
    history_revisions_max_default,
    lease_ttl_max_s,
    lease_ttl_min_s_default,
    request_bytes_max_default,
    txn_ops_max_default,
)
from broker.keyspace.request_checks import (
    InvalidRequestError,
    check_key,
    holds,
    in_range,
)

# Re-exported: the store's bounds' defaults are set where its state is (mvcc_state.py).
__all__ = [
    "Commit",
    "InvalidRequestError",
    "LeaseExistsError",
    "MVCCStore",
    "history_revisions_max_default",
    "in_range",
    "lease_ttl_max_s",
    "lease_ttl_min_s_default",
    "request_bytes_max_default",
    "txn_ops_max_default",
]


class LeaseExistsError(KeySpaceError):
    """A grant asked for a lease ID that is already in use."""

    def __init__(self, lease_id: int) -> None:
        super().__init__(f"lease {lease_id:#x} already exists")
        self.lease_id = lease_id


class MVCCStore(MVCCState):
    """The store (MVCCState's state, with the requests on it). Not thread-safe; the caller
    serialises calls."""

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

    def range(
        self,
        key: bytes,
        range_end: bytes | None = None,
        revision: int = 0,
        *,
        min_mod_revision: int = 0,
    ) -> RangeResponse:
        kvs = self._range_at(key, range_end, revision)
        if min_mod_revision:
            return RangeResponse(
                self.header(),
                tuple(kv for kv in kvs if kv.mod_revision >= min_mod_revision),
                len(kvs),
            )
        return RangeResponse(self.header(), kvs, len(kvs))

    def _range_at(self, key: bytes, range_end: bytes | None, revision: int) -> tuple[KeyValue, ...]:
        check_key("range", key)
        if revision < 0:
            raise InvalidRequestError(f"range: revision must be >= 0 (got {revision})")
        if revision > self._revision:
            raise FutureRevisionError(
                f"range: revision {revision} is in the future (current revision is "
                f"{self._revision})"
            )
        if revision == 0 or revision == self._revision:
            return tuple(self._live_range(key, range_end))
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
        return tuple(state[k] for k in sorted(state))

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

    # -- Writes -----------------------------------------------------------------------------

    def put(self, key: bytes, value: bytes, lease: int = 0) -> tuple[Header, Commit]:
        self._limits.check_put(OpPut(key, value, lease))
        if lease and lease not in self._leases:
            raise LeaseNotFoundError(lease)
        pending = Pending(self._revision + 1)
        self._put(pending, key, value, lease)
        commit = self._commit(pending)
        assert commit is not None, "a put always mutates"
        self._record(Committed(commit))
        return self.header(), commit

    def delete(
        self, key: bytes, range_end: bytes | None = None
    ) -> tuple[Header, int, Commit | None]:
        check_key("delete", key)
        pending = Pending(self._revision + 1)
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

        pending = Pending(self._revision + 1)
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
        self._leases[lease_id] = Lease(lease_id, ttl, now + ttl)
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
        pending = Pending(self._revision + 1)
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
