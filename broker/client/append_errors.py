"""How an AppendService's appends fail: which failures are retried, and the typed errors of
those that are not.

An append either commits or its AsyncAppend raises one of these (or the broker's typed status
error, `broker.protocol.status`); nothing is dropped with only a log line.

Retried (with doubling back-off, for at most the service's `retry_s_max` per batch): every
failure that the same request may not meet again, i.e. an unreachable or restarting broker
(gRPC UNAVAILABLE, a broken connection, a timeout), a stale route or a journal without a
primary yet (NOT_JOURNAL_PRIMARY_BROKER, NO_JOURNAL_PRIMARY_BROKER, ...), a replication
pipeline being rebuilt (PROPOSAL_MISMATCH), a lost etcd race of the broker. Not retried (the
batch fails at once with the status's error), as in Gazette's AppendService: the statuses in
`TERMINAL_STATUSES`, which need the caller or an operator to change something, and gRPC codes
no retry can fix (`FATAL_GRPC_CODES`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import grpc
import grpc.aio

from broker.protocol.status import (
    FragmentStoreUnhealthyError,
    GazetteError,
    IndexHasGreaterOffsetError,
    JournalNotFoundError,
    NotAllowedError,
    RegisterMismatchError,
    WrongAppendOffsetError,
)

__all__ = [
    "FATAL_GRPC_CODES",
    "TERMINAL_STATUSES",
    "AppendCancelledError",
    "AppendRetriesExhaustedError",
    "AppendServiceClosedError",
    "AppendsFailedError",
    "DependencyCancelledError",
    "DependencyFailedError",
    "JournalFailedError",
    "backoff_s",
    "is_transient",
]

# Statuses that fail a batch at once: the same request would be refused again (Gazette's
# AppendService breaks its retry loop on exactly these). INDEX_HAS_GREATER_OFFSET needs an
# operator (`gazctl journals reset-head`); the others, the caller.
TERMINAL_STATUSES: Final[frozenset[type[GazetteError]]] = frozenset(
    {
        FragmentStoreUnhealthyError,
        IndexHasGreaterOffsetError,
        JournalNotFoundError,
        NotAllowedError,
        RegisterMismatchError,
        WrongAppendOffsetError,
    }
)

# gRPC codes that no retry of the same request can fix.
FATAL_GRPC_CODES: Final = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.OUT_OF_RANGE,
    }
)


class AppendServiceClosedError(RuntimeError):
    """The service is not running (not entered yet, closing, or closed)."""


class DependencyFailedError(RuntimeError):
    """A dependency of a batch failed, so the batch was not sent (the cause is chained)."""


class JournalFailedError(DependencyFailedError):
    """An earlier batch of the same journal failed, so this one was not sent: a journal's
    appends commit in release order or not at all, never with a hole before them (as in
    Gazette, a journal's failure is sticky for the life of the service). The first failure is
    the `__cause__`; fix it, then append through a new AppendService."""

    def __init__(self, journal: str, first: BaseException) -> None:
        detail = str(first) or type(first).__name__
        super().__init__(
            f"journal {journal}: append not sent: an earlier append to it failed "
            f"({type(first).__name__}: {detail})"
        )
        self.journal = journal
        self.__cause__ = first


class AppendCancelledError(RuntimeError):
    """The append was cancelled, not failed: its service stopped (it was left by an exception,
    or cancelled), or what it depended on was cancelled (`DependencyCancelledError`). The
    owner's choice, so neither logged as a failure nor counted in AppendsFailedError.
    `maybe_committed` is True if its Append RPC was in flight, so that it may have landed;
    False if it was never sent."""

    def __init__(self, journal: str, *, maybe_committed: bool, detail: str = "") -> None:
        outcome = "it may have committed" if maybe_committed else "it was not sent"
        why = detail or "cancelled by the service's stop"
        super().__init__(f"journal {journal}: append {why} ({outcome})")
        self.journal = journal
        self.maybe_committed = maybe_committed


class DependencyCancelledError(AppendCancelledError, DependencyFailedError):
    """A dependency of a batch was cancelled (a store's commit abandoned as its shard stops),
    so the batch was not sent."""

    def __init__(self, journal: str) -> None:
        super().__init__(
            journal, maybe_committed=False, detail="not sent: a dependency of it was cancelled"
        )


class AppendRetriesExhaustedError(RuntimeError):
    """A batch kept failing transiently for longer than the service's `retry_s_max`, and was
    not sent again. The last failure is the `__cause__`; it may have committed if an attempt's
    response was lost."""

    def __init__(self, journal: str, attempts: int, elapsed_s: float, last: BaseException) -> None:
        detail = str(last) or type(last).__name__
        super().__init__(
            f"journal {journal}: append gave up after {attempts} attempts over {elapsed_s:.1f}s; "
            f"last error: {type(last).__name__}: {detail}"
        )
        self.journal = journal
        self.attempts = attempts
        self.elapsed_s = elapsed_s


class AppendsFailedError(RuntimeError):
    """Appends of an AppendService failed: raised by `flush` for the failed batches it waited
    on, and when leaving `async with AppendService(...)` for the failed batches that no writer
    observed (never awaited, nor their result or exception retrieved: fire and forget). `failed`
    counts those batches per journal; the first of them is the `__cause__`."""

    def __init__(self, failed: Mapping[str, int], first: BaseException) -> None:
        counts = ", ".join(f"{journal}: {n}" for journal, n in sorted(failed.items()))
        total = sum(failed.values())
        detail = str(first) or type(first).__name__
        super().__init__(
            f"{total} append batch{'es' if total != 1 else ''} failed ({counts}); "
            f"first: {type(first).__name__}: {detail}"
        )
        self.failed = dict(failed)


def is_transient(err: BaseException) -> bool:
    """Whether a failed append attempt may succeed if the same request is sent again."""
    if isinstance(err, GazetteError):
        return type(err) not in TERMINAL_STATUSES
    if isinstance(err, grpc.aio.AioRpcError):
        return err.code() not in FATAL_GRPC_CODES
    return isinstance(err, TimeoutError | ConnectionError)


def backoff_s(attempt: int, initial_s: float, max_s: float) -> float:
    """Delay after failed attempt number `attempt` (1-based)."""
    return float(min(max_s, initial_s * 2.0 ** min(attempt - 1, 62)))
