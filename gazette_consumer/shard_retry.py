"""Which shard failures are transient, and how a replica retries them (sans-IO).

A replica that fails for a cause the cluster converges out of by itself — a broker restarting
(UNAVAILABLE, a broken connection, a timeout), a journal briefly not found or without a primary
while brokers restart, an etcd hiccup, a recovery log journal not created yet, appends that kept
failing transiently past their own bound, a store's disk full (StoreIOError, ENOSPC) — starts
over after a back-off, instead of parking in FAILED until an operator unassigns it. FAILED is
kept for what an operator (or the application's author) must fix, and its message says what: a
refused append (INDEX_HAS_GREATER_OFFSET: reset the journal's head; NOT_ALLOWED), a recovery
log that is not one, a store fenced by a newer primary, the Application's own exceptions, or a
transient cause that persisted through `attempts_max` attempts.

`classify(err)` decides from the error's type, walking its chain of causes (`__cause__`, then
an unsuppressed `__context__`) outermost first: the first error whose type the table
`TRANSIENCE` (or the typed status or gRPC code) classifies decides; an error chain with none is
permanent. No message text is ever matched.

`ShardRetries` is the state machine of one replica: `on_failure(err, served_s)` answers
`RetryAfter` (the back-off, doubling from `initial_s` up to `max_s`) or `GiveUp` (the FAILED
message). Consecutive transient failures count towards `attempts_max`; an attempt that served
(STANDBY or PRIMARY) for at least `healthy_s` before failing starts the count afresh, so that a
long-lived shard rides out any number of separate outages while a shard that fails as soon as
it starts gives up.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

import grpc
import grpc.aio
import sqlalchemy.exc

from broker.client.append_errors import AppendRetriesExhaustedError
from broker.disk_errors import is_disk_full
from broker.grpc_transport import send_failed
from broker.keyspace.backend import NoSpaceError, UnavailableError
from broker.protocol.status import (
    FragmentStoreUnhealthyError,
    GazetteError,
    JournalNotFoundError,
)
from gazette_consumer.recovery import RecoveryLogError, RecoveryLogMissingError
from gazette_consumer.recoverylog.recorder import RecorderFencedError
from gazette_consumer.source_revisions import SourceRecreatedError, StaleReadError
from gazette_consumer.stores.base import FencedError, StoreIOError
from gazette_consumer.txn_driver import StrayCancelledError

__all__ = [
    "TRANSIENCE",
    "TRANSIENT_GRPC_CODES",
    "GiveUp",
    "RetryAfter",
    "ShardRetries",
    "ShardRetryPolicy",
    "Transience",
    "classify",
]


class Transience(enum.Enum):
    TRANSIENT = "transient"  # Retried after a back-off.
    PERMANENT = "permanent"  # FAILED: someone must change something.


# Error types and their transience, most specific first (the first `isinstance` match wins).
# Statuses of the broker (GazetteError) and gRPC errors not listed here are decided by their
# `retriable` flag and by TRANSIENT_GRPC_CODES.
TRANSIENCE: Final[tuple[tuple[type[BaseException], Transience], ...]] = (
    # Operators create recovery logs; one created late is picked up by a retry.
    (RecoveryLogMissingError, Transience.TRANSIENT),
    # A journal that exists but is not a recovery log (a source named by mistake).
    (RecoveryLogError, Transience.PERMANENT),
    # Another primary took over the store or the log: this one must not come back.
    (FencedError, Transience.PERMANENT),
    (RecorderFencedError, Transience.PERMANENT),
    # Appends that failed transiently for longer than the AppendService retries them.
    (AppendRetriesExhaustedError, Transience.TRANSIENT),
    # A broker whose view of etcd is behind (it just restarted) does not know the journal yet.
    (JournalNotFoundError, Transience.TRANSIENT),
    # A source journal created again while the shard read it: the primary starts over, and
    # its start compares the checkpoint's create revisions (source_revisions.py) under the
    # spec's checkpoint-ahead policy (fail, by default, naming the journal).
    (SourceRecreatedError, Transience.TRANSIENT),
    (StaleReadError, Transience.TRANSIENT),
    # etcd unreachable for a while.
    (UnavailableError, Transience.TRANSIENT),
    # A journal's fragment store found down by the primary's health check: its appends are
    # refused (as in Gazette) until a check passes again (every 100 s at most while down).
    # The append service does not retry it (nor does Gazette's); the shard starts over after a
    # back-off, as for a full disk (a store down past the policy's attempts ends FAILED).
    (FragmentStoreUnhealthyError, Transience.TRANSIENT),
    # etcd out of space (its NOSPACE alarm): the recovered hints cannot be stored until an
    # operator makes room; tried again as for a full local disk (one that stays full gives up
    # as FAILED after the policy's attempts).
    (NoSpaceError, Transience.TRANSIENT),
    # A SQL store's database restarting or unreachable (connection refused or reset, the server
    # shutting down, SQLite's "database is locked"): the shard recovers from its checkpoint,
    # which the failed transaction never committed. Integrity and programming errors stay
    # permanent (they are DBAPIErrors of other classes).
    (sqlalchemy.exc.OperationalError, Transience.TRANSIENT),
    # A store's local files on a full (or failing) disk: a new instance restores from the
    # checkpoint once there is room again (a disk that stays full gives up as FAILED).
    (StoreIOError, Transience.TRANSIENT),
    (ConnectionError, Transience.TRANSIENT),
    (TimeoutError, Transience.TRANSIENT),
    # A CancelledError nobody asked for (txn_driver.StrayCancelledError): an Application's
    # bug, or a call on a channel the client's pool closed (grpc.aio cancels its RPCs; found
    # by review): a bug fails again at every attempt and ends FAILED all the same.
    (StrayCancelledError, Transience.TRANSIENT),
)

# gRPC codes of a broker restarting, overloaded or unreachable. CANCELLED: a broker that
# stops at once (a zombie back from SIGSTOP to find its lease gone) cancels every RPC it
# serves (found by the soak: a recorder's append failed its shard). Our own cancellations
# are asyncio's CancelledError, not AioRpcErrors.
TRANSIENT_GRPC_CODES: Final = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)

# Causes followed at most this deep (a chain is short; this bounds a cyclic one).
_CHAIN_DEPTH_MAX: Final = 32


def _transience_of(err: BaseException) -> Transience | None:
    for kind, transience in TRANSIENCE:
        if isinstance(err, kind):
            return transience
    # A full disk (a recovery log played into a full data directory, a JSON store's file) is
    # transient as a StoreIOError is. Other OSErrors are decided by their types above.
    if is_disk_full(err):
        return Transience.TRANSIENT
    if isinstance(err, GazetteError):
        return Transience.TRANSIENT if err.retriable else Transience.PERMANENT
    if isinstance(err, grpc.aio.AioRpcError):
        transient = err.code() in TRANSIENT_GRPC_CODES or send_failed(err)
        return Transience.TRANSIENT if transient else Transience.PERMANENT
    return None


def _chain(err: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    current: BaseException | None = err
    while current is not None and len(out) < _CHAIN_DEPTH_MAX and current not in out:
        out.append(current)
        if current.__cause__ is not None:
            current = current.__cause__
        elif not current.__suppress_context__:
            current = current.__context__
        else:
            current = None
    return out


def classify(err: BaseException) -> Transience:
    """Whether a replica that failed with `err` may succeed by starting over (see the module
    docstring)."""
    for cause in _chain(err):
        transience = _transience_of(cause)
        if transience is not None:
            return transience
    return Transience.PERMANENT


@dataclass(frozen=True, slots=True)
class ShardRetryPolicy:
    """How a replica retries transient failures (see the module docstring). The defaults give
    up after about two and a half minutes of failing attempts. The back-off's cap is also how
    late a shard may resume after its cause went away (a database back from a restart): kept
    short, with the attempts to fill the same budget. It was 30 s, and a PostgreSQL whose
    crash recovery took 25 s under load left its shards waiting up to 30 s more."""

    initial_s: float = 0.1
    max_s: float = 5.0
    attempts_max: int = 36
    healthy_s: float = 60.0

    def __post_init__(self) -> None:
        if not 0 <= self.initial_s <= self.max_s:
            raise ValueError(
                f"initial_s, max_s: must be 0 <= initial <= max (got {self.initial_s}, "
                f"{self.max_s})"
            )
        if self.attempts_max < 1:
            raise ValueError(f"attempts_max: must be >= 1 (got {self.attempts_max})")
        if self.healthy_s < 0:
            raise ValueError(f"healthy_s: must be >= 0 (got {self.healthy_s})")


@dataclass(frozen=True, slots=True)
class RetryAfter:
    """Start the replica over after `delay_s`: this is failed attempt `attempt` in a row."""

    delay_s: float
    attempt: int
    error: str


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Stop as FAILED with `message` (what to fix)."""

    message: str


class ShardRetries:
    """The retry state of one replica (see the module docstring)."""

    def __init__(self, policy: ShardRetryPolicy) -> None:
        self.policy = policy
        self.failures = 0  # Consecutive transient failures.
        self.failing_s = 0.0  # Back-off slept since the first of them.

    def on_failure(self, err: BaseException, *, served_s: float | None) -> RetryAfter | GiveUp:
        """Decide after a failed attempt that served for `served_s` (None: it never reached
        STANDBY or PRIMARY)."""
        policy = self.policy
        if served_s is not None and served_s >= policy.healthy_s:
            self.failures, self.failing_s = 0, 0.0  # A new incident, not the same one.
        if classify(err) is Transience.PERMANENT:
            return GiveUp(str(err))
        self.failures += 1
        if self.failures >= policy.attempts_max:
            return GiveUp(
                f"{err} (a transient cause, but it persisted through {self.failures} attempts "
                f"over {self.failing_s:.1f}s of back-off: fix it, then restart the shard with "
                "`gazctl shards unassign --failed`)"
            )
        delay = min(policy.max_s, policy.initial_s * 2.0 ** min(self.failures - 1, 62))
        self.failing_s += delay
        return RetryAfter(delay, self.failures, str(err))
