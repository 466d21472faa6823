"""Typed exceptions for the wire ``Status`` codes of Gazette RPCs.

Gazette reports most failures in-band: a response carries ``status != OK``
rather than a gRPC error. Each non-OK value of ``protocol.Status`` (broker)
and ``consumer.Status`` (shards) has exactly one exception class here, so
callers can ``except JournalNotFoundError`` instead of comparing integers.

The generated enums are the single source of truth: the registries are built
from the classes below and checked against the enums at import time, so a
regenerated proto with a new status and no class fails loudly rather than
silently mapping to a generic error.

``retriable`` follows what Gazette's own Go client does with a status:
true only where a later identical request can succeed without the caller
changing anything, because the condition is a routing or assignment state the
cluster converges out of (the Go client's Append and RetryReader loop on
exactly these, with backoff). Statuses that are answers (OFFSET_NOT_YET_
AVAILABLE), precondition failures (WRONG_APPEND_OFFSET, REGISTER_MISMATCH,
ETCD_TRANSACTION_FAILED: a compare-and-swap lost, so the caller must re-read
before retrying) or need an operator (INDEX_HAS_GREATER_OFFSET) are not.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import ClassVar, TypeVar

from broker.protocol import consumer_pb2, protocol_pb2

__all__ = [
    "EtcdTransactionFailedError",
    "FragmentStoreUnhealthyError",
    "GazetteError",
    "IndexHasGreaterOffsetError",
    "InsufficientJournalBrokersError",
    "JournalNotFoundError",
    "NoJournalPrimaryBrokerError",
    "NoShardPrimaryError",
    "NotAllowedError",
    "NotJournalBrokerError",
    "NotJournalPrimaryBrokerError",
    "NotShardPrimaryError",
    "OffsetNotYetAvailableError",
    "ProposalMismatchError",
    "RegisterMismatchError",
    "ShardEtcdTransactionFailedError",
    "ShardNotFoundError",
    "ShardStatusError",
    "ShardStoppedError",
    "StatusError",
    "StatusLookupError",
    "StatusRegistryError",
    "SuspendedError",
    "WrongAppendOffsetError",
    "WrongRouteError",
    "build_registry",
    "for_shard_status",
    "for_status",
    "raise_for_shard_status",
    "raise_for_status",
]


class StatusLookupError(ValueError):
    """A status code has no exception class (it is OK, or not in the enum)."""


class StatusRegistryError(RuntimeError):
    """The exception classes and the generated enum disagree."""


class StatusError(Exception):
    """Root of every exception that stands for a wire status code.

    ``status`` is the integer code and ``message`` the caller's detail. The
    rendered text is ``"<STATUS_NAME>: <message>"`` (or just the name).
    """

    # Fully qualified proto enum name, for messages ("protocol.Status").
    enum_name: ClassVar[str] = ""
    retriable: ClassVar[bool] = False
    # The code a per-status class stands for. Declared here for typing only:
    # the bases (GazetteError, ShardStatusError) do not define it.
    STATUS: ClassVar[int]

    def __init__(self, status: int, message: str = "") -> None:
        self.status = int(status)
        self.message = message
        super().__init__(self._render())

    @classmethod
    def _name_of(cls, status: int) -> str:
        return str(status)

    @property
    def status_name(self) -> str:
        return self._name_of(self.status)

    def _render(self) -> str:
        name = self._name_of(self.status)
        return f"{name}: {self.message}" if self.message else name

    def __reduce__(self) -> tuple[object, ...]:
        # Exceptions pickle by re-calling cls(*self.args), but our args are the
        # rendered text. Spark ships exceptions between processes, so pickle
        # the constructor arguments instead.
        return (type(self), (self.status, self.message))


class GazetteError(StatusError):
    """A broker RPC answered with a non-OK ``protocol.Status``."""

    enum_name = "protocol.Status"

    @classmethod
    def _name_of(cls, status: int) -> str:
        return _enum_name(protocol_pb2.Status.items(), status)


class ShardStatusError(StatusError):
    """A Shard RPC answered with a non-OK ``consumer.Status``."""

    enum_name = "consumer.Status"

    @classmethod
    def _name_of(cls, status: int) -> str:
        return _enum_name(consumer_pb2.Status.items(), status)


def _enum_name(items: Iterable[tuple[str, int]], status: int) -> str:
    for name, number in items:
        if number == status:
            return name
    return f"UNKNOWN_STATUS_{status}"


class _JournalStatus(GazetteError):
    """Base of the per-status broker classes: the code is fixed by the class."""

    def __init__(self, message: str = "") -> None:
        super().__init__(self.STATUS, message)

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.message,))


class _ShardStatus(ShardStatusError):
    """Base of the per-status shard classes: the code is fixed by the class."""

    def __init__(self, message: str = "") -> None:
        super().__init__(self.STATUS, message)

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.message,))


# --- protocol.Status ---------------------------------------------------------


class JournalNotFoundError(_JournalStatus):
    # Not retried: the Go RetryReader allows a few attempts only to ride out
    # etcd propagation right after creation; a Python caller wanting that
    # should wait for the etcd revision instead.
    STATUS = protocol_pb2.JOURNAL_NOT_FOUND


class NoJournalPrimaryBrokerError(_JournalStatus):
    STATUS = protocol_pb2.NO_JOURNAL_PRIMARY_BROKER
    retriable = True  # Assignment converges; Go's Append retries it.


class NotJournalPrimaryBrokerError(_JournalStatus):
    STATUS = protocol_pb2.NOT_JOURNAL_PRIMARY_BROKER
    retriable = True  # Stale route; the response header carries a fresh one.


class NotJournalBrokerError(_JournalStatus):
    STATUS = protocol_pb2.NOT_JOURNAL_BROKER
    retriable = True  # Stale route; Go's RetryReader retries it.


class InsufficientJournalBrokersError(_JournalStatus):
    STATUS = protocol_pb2.INSUFFICIENT_JOURNAL_BROKERS
    retriable = True  # Allocator is still placing replicas.


class OffsetNotYetAvailableError(_JournalStatus):
    # An answer to a non-blocking read, not a failure: retrying at once would
    # busy-wait. Callers that want to wait should issue a blocking read.
    STATUS = protocol_pb2.OFFSET_NOT_YET_AVAILABLE


class WrongRouteError(_JournalStatus):
    STATUS = protocol_pb2.WRONG_ROUTE
    retriable = True  # Peers disagree until both observe the same revision.


class ProposalMismatchError(_JournalStatus):
    # Resolved by the primary adopting the peer's fragment and proposing
    # again: a different request, not a retry of this one.
    STATUS = protocol_pb2.PROPOSAL_MISMATCH


class EtcdTransactionFailedError(_JournalStatus):
    # A lost compare-and-swap: the same expect_mod_revision fails forever.
    STATUS = protocol_pb2.ETCD_TRANSACTION_FAILED


class NotAllowedError(_JournalStatus):
    STATUS = protocol_pb2.NOT_ALLOWED


class WrongAppendOffsetError(_JournalStatus):
    STATUS = protocol_pb2.WRONG_APPEND_OFFSET


class IndexHasGreaterOffsetError(_JournalStatus):
    # Consistency may have been lost; only an operator may reset the head.
    STATUS = protocol_pb2.INDEX_HAS_GREATER_OFFSET


class RegisterMismatchError(_JournalStatus):
    STATUS = protocol_pb2.REGISTER_MISMATCH


class SuspendedError(_JournalStatus):
    # Persists until an Append resumes the journal.
    STATUS = protocol_pb2.SUSPENDED


class FragmentStoreUnhealthyError(_JournalStatus):
    # The broker already waited for the store before answering, and Go's
    # client surfaces it rather than retrying.
    STATUS = protocol_pb2.FRAGMENT_STORE_UNHEALTHY


# --- consumer.Status ---------------------------------------------------------


class ShardNotFoundError(_ShardStatus):
    STATUS = consumer_pb2.SHARD_NOT_FOUND


class NoShardPrimaryError(_ShardStatus):
    STATUS = consumer_pb2.NO_SHARD_PRIMARY
    retriable = True  # Assignment converges.


class NotShardPrimaryError(_ShardStatus):
    STATUS = consumer_pb2.NOT_SHARD_PRIMARY
    retriable = True  # Stale route; re-resolve the primary.


class ShardEtcdTransactionFailedError(_ShardStatus):
    # A lost compare-and-swap, as for journals.
    STATUS = consumer_pb2.ETCD_TRANSACTION_FAILED


class ShardStoppedError(_ShardStatus):
    # The primary stopped (reassigned or failed); a new primary is assigned
    # and a re-routed request can succeed.
    STATUS = consumer_pb2.SHARD_STOPPED
    retriable = True


# --- registries --------------------------------------------------------------

_E = TypeVar("_E", bound=StatusError)


def build_registry(
    enum_name: str, values: Mapping[str, int], classes: Iterable[type[_E]]
) -> dict[int, type[_E]]:
    """Map each non-OK value of an enum to its one exception class.

    ``values`` is the enum's name -> number mapping; ``classes`` carry their
    code in ``STATUS``. Raises StatusRegistryError naming every value without
    a class, every class without a value, and every value with two classes.
    """
    registry: dict[int, type[_E]] = {}
    problems: list[str] = []
    known = {number for name, number in values.items() if name != "OK"}
    for cls in classes:
        code = int(cls.STATUS)
        if code not in known:
            problems.append(f"{cls.__name__} has STATUS {code}, not a non-OK {enum_name} value")
        elif code in registry:
            problems.append(
                f"{enum_name} {code} has two classes: {registry[code].__name__}, {cls.__name__}"
            )
        else:
            registry[code] = cls
    for name, number in sorted(values.items(), key=lambda item: item[1]):
        if name != "OK" and number not in registry:
            problems.append(f"{enum_name} {name} ({number}) has no exception class")
    if problems:
        raise StatusRegistryError("; ".join(problems))
    return registry


_JOURNAL_ERRORS: dict[int, type[_JournalStatus]] = build_registry(
    GazetteError.enum_name, dict(protocol_pb2.Status.items()), _JournalStatus.__subclasses__()
)
_SHARD_ERRORS: dict[int, type[_ShardStatus]] = build_registry(
    ShardStatusError.enum_name, dict(consumer_pb2.Status.items()), _ShardStatus.__subclasses__()
)


def _lookup(registry: Mapping[int, type[_E]], enum_name: str, code: int) -> type[_E]:
    try:
        return registry[code]
    except KeyError:
        reason = "OK is not an error" if code == 0 else "not a known value"
        raise StatusLookupError(f"{enum_name} {code}: {reason}") from None


def for_status(code: int) -> type[_JournalStatus]:
    """Exception class of a non-OK ``protocol.Status`` code."""
    return _lookup(_JOURNAL_ERRORS, GazetteError.enum_name, code)


def for_shard_status(code: int) -> type[_ShardStatus]:
    """Exception class of a non-OK ``consumer.Status`` code."""
    return _lookup(_SHARD_ERRORS, ShardStatusError.enum_name, code)


def raise_for_status(code: int, message: str = "") -> None:
    """Return if ``code`` is OK; otherwise raise its GazetteError subclass.

    A code this build does not know (a newer broker) raises the base
    GazetteError, non-retriable, so it is still caught as a broker error.
    """
    if code == protocol_pb2.OK:
        return
    cls = _JOURNAL_ERRORS.get(code)
    if cls is None:
        raise GazetteError(code, message)
    raise cls(message)


def raise_for_shard_status(code: int, message: str = "") -> None:
    """Return if ``code`` is OK; otherwise raise its ShardStatusError subclass."""
    if code == consumer_pb2.OK:
        return
    cls = _SHARD_ERRORS.get(code)
    if cls is None:
        raise ShardStatusError(code, message)
    raise cls(message)
