"""The interface every KeySpace backend implements: a small subset of etcd's v3 API.

Two backends implement it: ``EtcdBackend`` (etcd's gRPC API over ``grpc.aio``) and
``EmbeddedBackend`` (in-process, same semantics). Values here are plain, frozen dataclasses so
that the KeySpace mirror, the allocator and the tests never depend on which backend they talk to.

Semantics follow etcd v3 exactly, because code written against the embedded backend must behave
the same against a real cluster:

* One global ``revision`` increments once per mutating request (a put, a delete that deleted
  something, or a transaction whose chosen branch mutated something). Reads do not increment it.
* Each key has ``create_revision`` (revision of its creation; 0 = absent), ``mod_revision``
  (revision of its last change) and ``version`` (number of changes since creation; 1 on create).
* A key attached to a lease is deleted (with a DELETE event) when the lease expires or is revoked.
* A watch from ``start_revision`` delivers every event with revision >= start_revision, in order,
  grouped by revision; events of one revision are never split across two responses. Watching
  from a revision older than the compacted revision fails with ``CompactedError``.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar


class KeySpaceError(Exception):
    """Base class of keyspace backend errors."""


# Errors looked at, at most, in an exception group's tree (it is small; this bounds a cycle).
_ERROR_WALK_MAX = 256


_E = TypeVar("_E", bound=BaseException)


def error_within(err: BaseException, kind: type[_E]) -> _E | None:
    """The first `kind` of error within `err` (itself, an exception group's member, or a
    cause), if any: what a process whose tasks failed reports as it exits, rather than the
    group's traceback."""
    pending, seen = [err], 0
    while pending and seen < _ERROR_WALK_MAX:
        current = pending.pop()
        seen += 1
        if isinstance(current, kind):
            return current
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        if current.__cause__ is not None:
            pending.append(current.__cause__)
    return None


class CompactedError(KeySpaceError):
    """The requested revision has been compacted away; re-load from the current revision."""

    def __init__(self, requested: int, compact_revision: int) -> None:
        super().__init__(
            f"revision {requested} is compacted (compact revision is {compact_revision}): "
            "load the keyspace afresh instead of resuming the watch"
        )
        self.requested = requested
        self.compact_revision = compact_revision


class FutureRevisionError(KeySpaceError):
    """A read asked for a revision the backend has not reached yet."""


class LeaseNotFoundError(KeySpaceError):
    """The lease does not exist (never granted, revoked, or expired)."""

    def __init__(self, lease_id: int) -> None:
        super().__init__(f"lease {lease_id:#x} not found (expired or revoked)")
        self.lease_id = lease_id


class UnavailableError(KeySpaceError):
    """The backend could not be reached; the operation may be retried."""


class BackendFailedError(KeySpaceError):
    """The backend itself cannot serve (its storage failed, or it is closing): not the fault
    of the request, which an API answers as UNAVAILABLE (another broker, or this one once
    restarted, may serve it), never as an invalid argument."""


class NoSpaceError(BackendFailedError):
    """etcd refused a write because its database reached its quota (its NOSPACE alarm is
    raised: ``--quota-backend-bytes``). Reads, watches, lease renewals and deletes still work;
    every write is refused until an operator makes room and disarms the alarm, so the message
    says how. Not retried as a transport failure: a retry is refused alike until then."""

    remedy = (
        "etcd is out of space (its NOSPACE alarm is raised; reads and lease renewals still"
        " work, writes are refused until an operator acts): compact its history and"
        " defragment it (etcdctl compact <revision>; etcdctl defrag), or raise"
        " --quota-backend-bytes, then disarm the alarm (etcdctl alarm disarm)"
    )

    def __init__(self, rpc: str, details: str) -> None:
        super().__init__(f"etcd {rpc}: {details}: {self.remedy}")
        self.details = details


@dataclass(frozen=True, slots=True)
class Header:
    """Response header: the store revision the response reflects."""

    revision: int
    cluster_id: int = 0
    member_id: int = 0
    raft_term: int = 0


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int = 0


class EventType(enum.IntEnum):
    PUT = 0
    DELETE = 1


@dataclass(frozen=True, slots=True)
class Event:
    type: EventType
    # For DELETE events, ``kv`` carries the key, an empty value and ``mod_revision`` equal to the
    # revision of the deletion (as etcd does).
    kv: KeyValue


@dataclass(frozen=True, slots=True)
class WatchResponse:
    header: Header
    events: tuple[Event, ...]


class CompareTarget(enum.IntEnum):
    VERSION = 0
    CREATE = 1
    MOD = 2
    VALUE = 3
    LEASE = 4


class CompareResult(enum.IntEnum):
    EQUAL = 0
    GREATER = 1
    LESS = 2
    NOT_EQUAL = 3


@dataclass(frozen=True, slots=True)
class Compare:
    """Compare ``target`` of ``key`` with ``value`` (an int, or bytes for VALUE).

    An absent key has version, create and mod revision 0, lease 0 and no value (a VALUE compare
    against an absent key is false for every result, as in etcd).
    """

    key: bytes
    target: CompareTarget
    result: CompareResult
    value: int | bytes


@dataclass(frozen=True, slots=True)
class OpPut:
    key: bytes
    value: bytes
    lease: int = 0


@dataclass(frozen=True, slots=True)
class OpDelete:
    key: bytes
    # Exclusive end of a range delete; None deletes just ``key``.
    range_end: bytes | None = None


@dataclass(frozen=True, slots=True)
class OpGet:
    key: bytes
    range_end: bytes | None = None


Op = OpPut | OpDelete | OpGet


@dataclass(frozen=True, slots=True)
class TxnResponse:
    succeeded: bool
    header: Header
    # One entry per executed op: for OpGet the matched KeyValues, for OpDelete the number of
    # deleted keys, for OpPut None.
    results: tuple[tuple[KeyValue, ...] | int | None, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class RangeResponse:
    header: Header
    kvs: tuple[KeyValue, ...]
    # Keys in the range at the revision read, counted before ``min_mod_revision`` leaves any
    # out (etcd's RangeResponse.count).
    count: int


def prefix_end(prefix: bytes) -> bytes:
    """The exclusive range end covering every key that starts with ``prefix`` (as etcd's
    clientv3.GetPrefixRangeEnd)."""
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    # All 0xff (or empty): the range extends to the end of the keyspace.
    return b"\x00"


class Backend(abc.ABC):
    """A connection to an etcd-like store. Implementations must be safe to share between tasks
    of one event loop."""

    @abc.abstractmethod
    async def range(
        self,
        key: bytes,
        range_end: bytes | None = None,
        revision: int = 0,
        *,
        min_mod_revision: int = 0,
    ) -> RangeResponse:
        """Keys in [key, range_end) (just ``key`` when range_end is None; ``b"\\x00"`` means to
        the end), sorted by key, at ``revision`` (0 = current); with ``min_mod_revision``, only
        those last modified at or after it (the count still counts them all)."""

    @abc.abstractmethod
    async def put(self, key: bytes, value: bytes, lease: int = 0) -> Header: ...

    @abc.abstractmethod
    async def delete(self, key: bytes, range_end: bytes | None = None) -> tuple[Header, int]:
        """Delete keys; returns the header and the number of keys deleted."""

    @abc.abstractmethod
    async def txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[Op],
        failure: Sequence[Op] = (),
    ) -> TxnResponse: ...

    @abc.abstractmethod
    async def lease_grant(self, ttl_s: int) -> tuple[int, int]:
        """Grant a lease; returns (lease id, granted TTL in seconds)."""

    @abc.abstractmethod
    async def lease_keepalive_once(self, lease_id: int) -> int:
        """Refresh a lease; returns its new TTL. Raises LeaseNotFoundError if it is gone."""

    @abc.abstractmethod
    async def lease_revoke(self, lease_id: int) -> None:
        """Revoke a lease, deleting its keys. Raises LeaseNotFoundError if it is gone."""

    @abc.abstractmethod
    def watch(
        self, key: bytes, range_end: bytes | None = None, start_revision: int = 0
    ) -> AsyncIterator[WatchResponse]:
        """Events on [key, range_end) from ``start_revision`` (0 = from the next revision).

        The iterator raises CompactedError if start_revision is compacted, and
        UnavailableError if the connection breaks (callers resume from the last revision
        seen + 1). It ends only when the backend is closed. Breaking out of the ``async for``
        (or ``aclose()``) cancels the watch.

        A response without events is a progress notification, sent only after
        ``request_watch_progress()``: every event of the range up to its header's revision
        should have been delivered before it. etcd before 3.4.25 / 3.5.8 may send it ahead of
        events still queued (etcd issue #15220): a caller must not take it on trust (the
        KeySpace checks it with a range, see keyspace.py)."""

    async def request_watch_progress(self) -> None:
        """Ask every open watch of this client for a progress notification (see ``watch``).
        A mirror of a prefix learns this way that the store's revision moved on through
        writes outside its prefix (etcd's RequestProgress). The default sends none: waiters
        then wait for the prefix's next event."""
        return None

    @abc.abstractmethod
    async def compact(self, revision: int) -> None:
        """Discard history before ``revision``."""

    @abc.abstractmethod
    async def close(self) -> None: ...
