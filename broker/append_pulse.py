"""Pulses: zero-byte appends a journal's primary makes by itself (replica.py runs them).

A pulse synchronises the pipeline, advertises the route in the assignments, and rolls a
fragment whose flush interval passed, even when no client appends. It never resumes a suspended
journal (SUSPEND_NO_RESUME, as Gazette's pulses)."""

from __future__ import annotations

from broker.append_fsm import AppendEnv, AppendFSM, State
from broker.append_suspend import NO_RESUME
from broker.logging import get_logger
from broker.protocol import protocol_pb2 as pb
from broker.replica import PulseResult
from broker.resolver import ResolverStoppedError

log = get_logger(__name__)

# Outcomes of a pulse that are not worth a warning: only the primary pulses, and a journal
# may be deleted or reassigned while a pulse runs.
_QUIET_PULSE_STATUSES = frozenset(
    {
        pb.NOT_JOURNAL_PRIMARY_BROKER,
        pb.NO_JOURNAL_PRIMARY_BROKER,
        pb.JOURNAL_NOT_FOUND,
        pb.SUSPENDED,
    }
)
# Outcomes that only a change of the journal's route or spec can alter: that change invalidates
# the pulse's resolution, which pulses again; retrying before it would fail the same way.
_ROUTE_BOUND_PULSE_STATUSES = _QUIET_PULSE_STATUSES | {pb.INSUFFICIENT_JOURNAL_BROKERS}
# Outcomes only an operator can alter: the fragment index holds content past the spool's end
# (the journal's brokers all restarted without their spools, or another cluster wrote its
# store), and an append at an explicit offset (gazctl journals reset-head) must confirm where
# the journal goes on. The route was advertised before the check: the pulse is retried at its
# interval, as Gazette's is, with a warning each time, not every few seconds.
_OPERATOR_BOUND_PULSE_STATUSES = frozenset({pb.INDEX_HAS_GREATER_OFFSET})


async def pulse(env: AppendEnv, journal: str) -> PulseResult:
    """One zero-byte append to ``journal`` from this broker, if it is the primary: it
    synchronises the pipeline, advertises the route, and rolls a fragment whose flush interval
    passed. Failed (``ok`` False, to be retried soon) unless it committed, or what it ran into
    can change only with the journal's route (another primary, too few brokers, no journal,
    suspended) or by an operator (the index ahead of the spool: retried at the interval)."""
    # A pulse never resumes a suspended journal (Gazette's pulses do not either).
    fsm = AppendFSM(env, pb.AppendRequest(journal=journal, do_not_proxy=True, suspend=NO_RESUME))

    async def empty_commit() -> tuple[pb.AppendRequest | None, BaseException | None]:
        # The commit marker, then the end of the stream.
        if not fsm.client_commit:
            return pb.AppendRequest(), None
        return None, None

    await fsm.run(empty_commit)
    finished = fsm.state is State.FINISHED
    if not finished and fsm.status not in _QUIET_PULSE_STATUSES:
        if fsm.status in _OPERATOR_BOUND_PULSE_STATUSES:
            log.warning(
                "journal pulse refused: its fragment index is ahead of its spool; an append at "
                "an explicit offset (gazctl journals reset-head) must confirm the journal's end",
                journal=journal,
                status=pb.Status.Name(fsm.status),
            )
        elif not isinstance(fsm.err, ResolverStoppedError):
            log.warning(
                "journal pulse failed (will retry)",
                journal=journal,
                status=pb.Status.Name(fsm.status),
                error=str(fsm.err) if fsm.err else None,
            )
    ok = finished or (
        fsm.err is None
        and (
            fsm.status in _ROUTE_BOUND_PULSE_STATUSES
            or fsm.status in _OPERATOR_BOUND_PULSE_STATUSES
        )
    )
    invalidated = fsm.resolved.invalidated if fsm.resolved is not None else None
    return PulseResult(ok, invalidated, committed=finished)
