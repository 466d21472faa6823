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
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

from broker.keyspace.backend import (
    CompactedError,
    Compare,
    CompareResult,
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
    OpGet,
    OpPut,
    RangeResponse,
    TxnResponse,
)

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


class InvalidRequestError(KeySpaceError):
    """The request is malformed (empty key, duplicate keys in a txn branch, too many operations,
    too large, wrong compare value type...). Nothing was changed."""


class LeaseExistsError(KeySpaceError):
    """A grant asked for a lease ID that is already in use."""

    def __init__(self, lease_id: int) -> None:
        super().__init__(f"lease {lease_id:#x} already exists")
        self.lease_id = lease_id


@dataclass(frozen=True, slots=True)
class Commit:
    """One mutating revision: its events in order and, for each event, the KeyValue its key had
    just before it (None if absent). The priors are what a read of an older revision undoes."""

    revision: int
    events: tuple[Event, ...]
    priors: tuple[KeyValue | None, ...]

    def events_in(self, key: bytes, range_end: bytes | None) -> tuple[Event, ...]:
        return tuple(e for e in self.events if in_range(e.kv.key, key, range_end))


@dataclass(slots=True)
class _Lease:
    lease_id: int
    ttl_s: int
    deadline: float
    keys: set[bytes] = field(default_factory=set)


def in_range(candidate: bytes, key: bytes, range_end: bytes | None) -> bool:
    """Whether ``candidate`` lies in etcd's range [key, range_end): just ``key`` when range_end
    is None, everything from ``key`` on when it is ``b"\\x00"``."""
    if range_end is None:
        return candidate == key
    if range_end == b"\x00":
        return candidate >= key
    return key <= candidate < range_end


def _check_key(what: str, key: bytes) -> None:
    if not key:
        raise InvalidRequestError(f"{what}: key is empty")


class MVCCStore:
    """The store. Not thread-safe; the caller serialises calls."""

    def __init__(
        self,
        *,
        history_revisions_max: int = history_revisions_max_default,
        lease_ttl_min_s: int = lease_ttl_min_s_default,
        txn_ops_max: int = txn_ops_max_default,
        request_bytes_max: int = request_bytes_max_default,
    ) -> None:
        if history_revisions_max < 1:
            raise ValueError(f"history_revisions_max: must be >= 1 (got {history_revisions_max})")
        if lease_ttl_min_s < 0:
            raise ValueError(f"lease_ttl_min_s: must be >= 0 (got {lease_ttl_min_s})")
        if txn_ops_max < 1 or request_bytes_max < 1:
            raise ValueError("txn_ops_max and request_bytes_max: must be >= 1")
        self._history_revisions_max = history_revisions_max
        self._lease_ttl_min_s = lease_ttl_min_s
        self._txn_ops_max = txn_ops_max
        self._request_bytes_max = request_bytes_max

        self._revision = _initial_revision
        self._compact_revision = 0
        self._kvs: dict[bytes, KeyValue] = {}
        self._keys: list[bytes] = []  # live keys, sorted
        # Commits of every revision >= compact revision (revision 1 has none: nothing happened).
        self._log: dict[int, Commit] = {}
        self._leases: dict[int, _Lease] = {}
        self._next_lease_id = 1

    # -- Reads ------------------------------------------------------------------------------

    @property
    def revision(self) -> int:
        return self._revision

    @property
    def compact_revision(self) -> int:
        return self._compact_revision

    def header(self) -> Header:
        return Header(revision=self._revision)

    def range(self, key: bytes, range_end: bytes | None = None, revision: int = 0) -> RangeResponse:
        _check_key("range", key)
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
        self._check_put(OpPut(key, value, lease))
        if lease and lease not in self._leases:
            raise LeaseNotFoundError(lease)
        pending = _Pending(self._revision + 1)
        self._put(pending, key, value, lease)
        commit = self._commit(pending)
        assert commit is not None, "a put always mutates"
        return self.header(), commit

    def delete(
        self, key: bytes, range_end: bytes | None = None
    ) -> tuple[Header, int, Commit | None]:
        _check_key("delete", key)
        pending = _Pending(self._revision + 1)
        deleted = self._delete(pending, key, range_end)
        commit = self._commit(pending)
        return self.header(), deleted, commit

    def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> tuple[TxnResponse, Commit | None]:
        """Evaluate ``compares`` (all must hold), then run one branch as one revision (if it
        mutates anything). Every check that can fail runs before the first change."""
        self._check_txn(compares, success, failure)
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
            self.compact(floor)
        return commit

    # -- Validation -------------------------------------------------------------------------

    def _check_put(self, op: OpPut) -> None:
        _check_key("put", op.key)
        if op.lease < 0:
            raise InvalidRequestError(f"put {op.key!r}: lease must be >= 0 (got {op.lease})")
        size = len(op.key) + len(op.value)
        if size > self._request_bytes_max:
            raise InvalidRequestError(
                f"put {op.key!r}: request of {size} bytes exceeds {self._request_bytes_max}"
            )

    def _check_txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op]
    ) -> None:
        for name, items in (("compares", compares), ("success", success), ("failure", failure)):
            if len(items) > self._txn_ops_max:
                raise InvalidRequestError(
                    f"txn {name}: {len(items)} operations exceed the limit of {self._txn_ops_max}"
                )
        for i, c in enumerate(compares):
            _check_key(f"txn compares[{i}]", c.key)
            wants_bytes = c.target == CompareTarget.VALUE
            if isinstance(c.value, bytes) != wants_bytes or isinstance(c.value, bool):
                raise InvalidRequestError(
                    f"txn compares[{i}]: a {c.target.name} compare needs "
                    f"{'bytes' if wants_bytes else 'an int'} (got {type(c.value).__name__})"
                )
        size = sum(
            len(c.key) + (len(c.value) if isinstance(c.value, bytes) else 0) for c in compares
        )
        for name, ops in (("success", success), ("failure", failure)):
            size += self._check_branch(name, ops)
        if size > self._request_bytes_max:
            raise InvalidRequestError(
                f"txn: request of {size} bytes exceeds {self._request_bytes_max}"
            )

    def _check_branch(self, name: str, ops: Sequence[Op]) -> int:
        """Validate one branch; returns its key and value bytes. As etcd does, refuse a branch
        that writes one key twice (or puts a key it also deletes): the outcome would depend on
        op order within one revision, which watchers cannot see."""
        size = 0
        puts: set[bytes] = set()
        deletes: list[OpDelete] = []
        for i, op in enumerate(ops):
            what = f"txn {name}[{i}]"
            if isinstance(op, OpPut):
                self._check_put(op)
                if op.key in puts:
                    raise InvalidRequestError(f"{what}: duplicate key {op.key!r} in one branch")
                puts.add(op.key)
                size += len(op.key) + len(op.value)
            elif isinstance(op, OpDelete):
                _check_key(what, op.key)
                deletes.append(op)
                size += len(op.key) + len(op.range_end or b"")
            elif isinstance(op, OpGet):
                _check_key(what, op.key)
                size += len(op.key) + len(op.range_end or b"")
            else:
                raise InvalidRequestError(
                    f"{what}: expected OpPut, OpDelete or OpGet (got {type(op).__name__})"
                )
        for d in deletes:
            for k in puts:
                if in_range(k, d.key, d.range_end):
                    raise InvalidRequestError(
                        f"txn {name}: key {k!r} is both put and deleted in one branch"
                    )
        return size

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
        return _holds(actual, c.result, c.value)

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


def _holds(actual: int | bytes, result: CompareResult, expected: int | bytes) -> bool:
    if isinstance(actual, bytes) and isinstance(expected, bytes):
        sign = (actual > expected) - (actual < expected)
    elif isinstance(actual, int) and isinstance(expected, int):
        sign = (actual > expected) - (actual < expected)
    else:  # The txn checks rule this out; keep the store's state safe if they are bypassed.
        raise InvalidRequestError(f"compare: cannot compare {actual!r} with {expected!r}")
    match result:
        case CompareResult.EQUAL:
            return sign == 0
        case CompareResult.NOT_EQUAL:
            return sign != 0
        case CompareResult.GREATER:
            return sign > 0
        case CompareResult.LESS:
            return sign < 0
    raise InvalidRequestError(f"compare: unknown result {result!r}")
