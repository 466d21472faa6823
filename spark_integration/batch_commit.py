"""Committing a batch write: the ACKs of every task, one append per journal.

Gazette has no transaction across journals: each journal's ACK append lands, or not, on its
own. So the commit first checks every journal it will append to (it exists, its flags allow
appends, and a primary answers an append of nothing), in parallel, before appending any ACK: a
journal made read-only, deleted, or without a broker since the tasks wrote refuses the commit
with nothing committed anywhere (GazetteJournalError), and Spark's abort rolls every task
back. Only a failure in the window between that check and the ACK appends (a broker dying
then, past the appends' own retries) can leave some journals committed and others not; that
is reported as GazettePartialCommitError, naming both sets, so that no one re-runs the whole
write believing nothing of it landed. (Spark's abort then rolls back the journals whose ACKs
did not land; the committed ones keep their rows, since an ACK older than the producer's last
one is ignored.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence

from broker.client.appender import append, maybe_landed
from broker.client.list_apply import get_journal
from broker.client.route_cache import JournalClient
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import JournalNotFoundError
from spark_integration.journal_io import GazetteJournalError


class GazettePartialCommitError(GazetteJournalError):
    """A batch write's commit landed in some journals and not in others (or, in `unknown`,
    perhaps: an ACK append that failed after an attempt whose response was lost)."""

    def __init__(
        self,
        committed: Sequence[str],
        failed: Mapping[str, BaseException],
        unknown: Sequence[str] = (),
    ) -> None:
        self.committed = sorted(committed)
        self.failed = dict(sorted(failed.items()))
        self.unknown = sorted(unknown)
        refused = sorted(j for j in self.failed if j not in self.unknown)
        reasons = "; ".join(f"{j}: {type(e).__name__}: {e}" for j, e in self.failed.items())
        super().__init__(
            f"the write's rows were committed to {len(self.committed)} journal(s)"
            f" {self.committed} but not to {refused}"
            + (
                f", and may or may not have been to {self.unknown} (an ACK append whose"
                " response was lost may have landed: read those journals' committed rows"
                " before writing their rows again)"
                if self.unknown
                else ""
            )
            + f" ({reasons}). Re-running the whole write would add the committed journals'"
            " rows again: write only the rows of the journals not committed"
        )


class GazetteCommitOutcomeUnknownError(GazetteJournalError):
    """A batch write's commit failed in every journal, but in `unknown` after an ACK append
    whose response was lost: its rows there may be committed."""

    def __init__(self, failed: Mapping[str, BaseException], unknown: Sequence[str]) -> None:
        self.failed = dict(sorted(failed.items()))
        self.unknown = sorted(unknown)
        reasons = "; ".join(f"{j}: {type(e).__name__}: {e}" for j, e in self.failed.items())
        super().__init__(
            f"the write's commit failed, and whether its rows were committed to {self.unknown}"
            " is unknown: an ACK append whose response was lost may have landed. Read those"
            " journals' committed rows before writing their rows again (re-running the whole"
            f" write could add them twice) ({reasons})"
        )


def commit_outcome(journals: Sequence[str], results: Sequence[object]) -> None:
    """Raise what the ACK appends' `results` (None or the exception, per journal) mean for
    the write: nothing if all landed; the error as it came if every journal refused (a status:
    nothing appended); GazetteCommitOutcomeUnknownError if none is known to have landed but
    some failed after an attempt that may have (not a status: a lost response, a timeout, retries
    exhausted, or a status after such an attempt: appender.maybe_landed); else
    GazettePartialCommitError naming the three sets."""
    failed = {j: r for j, r in zip(journals, results, strict=True) if isinstance(r, BaseException)}
    if not failed:
        return
    # A status answer to every attempt means the broker refused the append: nothing of it
    # was written. An attempt that failed otherwise may have landed without its response
    # reaching us, whatever the attempts after it were told (appender.maybe_landed).
    unknown = [j for j, err in failed.items() if maybe_landed(err)]
    committed = [journal for journal in journals if journal not in failed]
    if not committed:
        if unknown:
            raise GazetteCommitOutcomeUnknownError(failed, unknown)
        raise next(iter(failed.values()))  # Nothing committed: the error as it came.
    raise GazettePartialCommitError(committed, failed, unknown)


async def check_writable(client: JournalClient, journal: str) -> None:
    """Raise GazetteJournalError unless `journal` exists, may be appended to, and a primary
    takes an append (of nothing)."""
    try:
        spec = await get_journal(client, journal)
    except JournalNotFoundError:
        raise GazetteJournalError(
            f"journal {journal!r} no longer exists: nothing of the write was committed"
        ) from None
    flags = spec.flags
    if flags != pb.JournalSpec.NOT_SPECIFIED and not flags & (
        pb.JournalSpec.O_WRONLY | pb.JournalSpec.O_RDWR
    ):
        raise GazetteJournalError(
            f"journal {journal!r} no longer takes appends (its flags, {flags}, allow no writes):"
            " nothing of the write was committed"
        )
    try:
        await append(client, pb.AppendRequest(journal=journal), b"")
    except Exception as err:
        raise GazetteJournalError(
            f"journal {journal!r} does not take appends ({type(err).__name__}: {err}): nothing"
            " of the write was committed"
        ) from err


async def commit_acks(
    client: JournalClient,
    acks: Mapping[str, list[bytes]],
    check: Callable[[JournalClient, str], Awaitable[None]] = check_writable,
) -> None:
    """Append each journal's ACKs (all of a journal in one append) once every journal passed
    `check` (see the module docstring). A retried ACK append may land twice: readers
    take the repeated ACK as a rollback of whatever the producer began since, which is nothing
    (a batch write's producers publish nothing more)."""
    journals = [journal for journal, pieces in acks.items() if pieces]
    await asyncio.gather(*(check(client, journal) for journal in journals))
    results = await asyncio.gather(
        *(
            append(client, pb.AppendRequest(journal=journal), b"".join(acks[journal]))
            for journal in journals
        ),
        return_exceptions=True,
    )
    commit_outcome(journals, results)


async def roll_back(client: JournalClient, rollbacks: Mapping[str, list[bytes]]) -> None:
    """Spark's abort of a batch write: append each journal's rollback ACKs, in every journal
    that takes them (one that refuses does not keep the others from being rolled back), then
    raise GazetteJournalError naming those that refused (their rows stay uncommitted: pending
    under producers never used again)."""
    journals = [journal for journal, pieces in rollbacks.items() if pieces]
    results = await asyncio.gather(
        *(
            append(client, pb.AppendRequest(journal=journal), b"".join(rollbacks[journal]))
            for journal in journals
        ),
        return_exceptions=True,
    )
    failed = {j: r for j, r in zip(journals, results, strict=True) if isinstance(r, BaseException)}
    if failed:
        reasons = "; ".join(f"{j}: {type(e).__name__}: {e}" for j, e in sorted(failed.items()))
        raise GazetteJournalError(
            f"the write's rollback was refused in {sorted(failed)} ({reasons}): its rows there"
            " stay uncommitted, invisible to read-committed readers"
        )
