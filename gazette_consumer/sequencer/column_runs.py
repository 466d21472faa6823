"""The Sequencer's entry point for a caller that decides messages by columns (sans-IO).

A reader holding a decoded batch as columns (clocks, flags, offsets: spark_integration's
bulk_commit.py) can tell, without an envelope per message, which of a producer's messages
commit where, when they are certain: clocks strictly rising, flags OUTSIDE_TXN, CONTINUE_TXN
or ACK_TXN, no OUTSIDE_TXN message right after a CONTINUE_TXN one. What such a run does to its
producer's state depends only on that state and a few facts of the run (`ColumnRun`), which
`commit_columns` applies, and declines where the state makes the run uncertain (a duplicate, a
span linked in the ring, the close of a span pending from an earlier batch): those messages go
one by one. The ring is not used: a span left pending is unlinked, as one that lost its start
is, and its ACK replays it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gazette_consumer.sequencer.classify import SequencerQueueing
from gazette_consumer.sequencer.ring import Partial
from gazette_consumer.sequencer.state import E


@dataclass(frozen=True, slots=True)
class ColumnRun:
    """What `Sequencer.commit_columns` needs of one producer's run of `count` certain
    messages of one journal (see the module docstring), numbered 0..count-1 in journal order.

    `first_close`: the number of the first OUTSIDE_TXN or ACK_TXN message (`count` if none),
    `pre_close_clock` the clock of the message before it (any value if `first_close` is 0);
    `last_close`: the number of the last one (-1 if none), `last_close_clock` its clock,
    `reopen_begin` the offset of the message after it (any value if none follows)."""

    count: int
    first_clock: int
    first_begin: int
    last_clock: int
    first_close: int
    pre_close_clock: int
    last_close: int
    last_close_clock: int
    reopen_begin: int


class SequencerColumnRuns(SequencerQueueing[E]):
    """`commit_columns` and `read_through_to` (see the module docstring)."""

    def commit_columns(
        self,
        journal: str,
        begin: int,
        runs: Sequence[tuple[bytes, ColumnRun]],
        untracked: int = 0,
    ) -> list[int] | None:
        """Commit at once, for each `(producer, run)` of `runs` (distinct producers of
        `journal`), the longest prefix of `run` whose outcome its producer's state makes
        certain, and return each prefix's length; the caller delivers those messages itself
        (an OUTSIDE_TXN message at its own position, a CONTINUE_TXN message at the ACK after it
        in its prefix; a span left open is delivered later by its ACK, replayed), and
        `untracked` messages without a UUID (OUTSIDE_TXN, clock 0, which change no state).

        The messages not in a prefix then go one by one (`queue_trusted`, `commit_pending`),
        in journal order, and the batch ends with `read_through_to`. Each producer's state is
        left as the one-by-one path would leave it (`checkpoint()` reports the same), save
        that nothing is linked into the ring. A prefix is 0 for a producer whose first clock
        here is not new (a duplicate, a rollback) or whose pending span is linked in the ring,
        and stops before the first ACK_TXN or OUTSIDE_TXN message of a span pending from an
        earlier batch (it replays that span).

        None, changing nothing, if an emission is in progress, `begin` (where the batch's
        messages begin) is before `journal`'s read-through offset (`queue_trusted` raises
        there), or nothing is committed. Trusts `runs` as `queue_trusted` trusts an envelope:
        the caller read them from the messages' UUIDs."""
        if self._emit is not None or begin < self._read_through.get(journal, 0):
            return None
        partials = self._partials
        taken: list[int] = []
        for producer, run in runs:
            take = run.count
            key = (journal, producer)
            partial = partials.get(key)
            if partial is not None and take:
                if run.first_clock <= partial.max_clock or (
                    partial.begin != -1 and partial.ring_start != -1
                ):
                    take = 0  # A duplicate (or a rollback); or a span linked in the ring.
                elif partial.begin != -1:
                    take = min(take, run.first_close)
            taken.append(take)
            if take:
                if partial is None:
                    partial = partials[key] = Partial(run.first_clock - 1, -1)
                    partial.presumed = True  # First sight, as queue_trusted records it.
                _apply(partial, run, take)
        if not untracked and not any(taken):
            return None
        self._dequeued = None
        return taken

    def read_through_to(self, journal: str, offset: int) -> None:
        """End a batch whose messages were committed by `commit_columns` (and one by one):
        everything of `journal` before `offset` was queued, as queueing each would record."""
        self._read_through[journal] = max(self._read_through.get(journal, 0), offset)


def _apply(partial: Partial, run: ColumnRun, take: int) -> None:
    """Set `partial` as the first `take` messages of `run` leave it, one by one."""
    if take < run.count:
        # Stopped before the close of a span pending from an earlier batch: extended only.
        partial.max_clock = run.pre_close_clock
        partial.unlinked += take
        return
    close = run.last_close
    if close == take - 1:
        partial.reset(run.last_clock)  # Ends with its last commit: nothing pending.
    elif close >= 0:
        partial.reset(run.last_close_clock)
        partial.begin = run.reopen_begin
        partial.max_clock = run.last_clock
        partial.unlinked = take - 1 - close
    elif partial.begin == -1:
        partial.begin = run.first_begin
        partial.max_clock = run.last_clock
        partial.unlinked = take
    else:
        partial.max_clock = run.last_clock
        partial.unlinked += take
