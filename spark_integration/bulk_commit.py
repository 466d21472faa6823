"""Read-committed by columns: what the Sequencer decides for a decoded batch, taken in bulk
where it is certain (sans-IO).

A partition's Sequencer (range_read.py) was handed one Python object per message (`BatchRow`)
and decided each in turn: ~1-2 µs a row, the largest cost of a read. Most rows need no such
care. Within one batch, a producer whose messages have strictly rising clocks, flags OUTSIDE_TXN,
CONTINUE_TXN or ACK_TXN, and no OUTSIDE_TXN message right after a CONTINUE_TXN one (which would
discard a pending span, and log it), is decided by its columns alone, given its state before
the batch (its `Partial`):

- every clock is new (above the producer's largest clock so far), so nothing is a duplicate;
- an OUTSIDE_TXN message commits alone, at its own position;
- an ACK commits the CONTINUE_TXN messages before it (all of them: their clocks are below the
  ACK's), at the ACK's position, and is consumed (readers never see ACKs); an ACK with nothing
  pending commits nothing;
- CONTINUE_TXN messages after the producer's last ACK or OUTSIDE_TXN message in the batch are a
  pending span: its begin and largest clock are recorded, and it is left unlinked from the
  ring, as a span that lost its start is (its ACK, in a later batch, replays it by columns).

Such a producer's state after those rows follows, and is set as the one-by-one path would
leave it (`Partial`: last ACK, largest clock, begin; `checkpoint()` reports the same) by the
Sequencer's `commit_columns`, given a few facts of the rows (`ColumnRun`). A
producer's rows are so decided up to the first that is not certain (what a prefix decides does
not depend on what follows it); from there on they go down the one-by-one path
(`commit_pending`), in journal order: a duplicate or out-of-order clock (a re-sent message, a
rollback), unknown flags, OUTSIDE_TXN right after CONTINUE_TXN, the ACK (or OUTSIDE_TXN
message) of a span pending from an earlier batch (the span's earlier part is replayed), any
row of a producer whose first clock here is not new or whose span is still linked in the
ring, and messages without a UUID that are not OUTSIDE_TXN.
Producers are independent of each other in the Sequencer (the ring only decides whether a
commit is served from it or replayed, which delivers the same messages), so each producer's
rows may take either path. `BulkPlan.commits` gives each delivered row the position of the
message that commits it, which is how the caller interleaves the two paths' output in the
order one walk would deliver it.

Messages without a UUID (clock 0) are delivered where they are, and change no state.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gazette_consumer.sequencer.column_runs import ColumnRun
from gazette_consumer.sequencer.sequencer import Sequencer
from gazette_consumer.sequencer.types import FLAG_ACK_TXN, FLAG_CONTINUE_TXN, FLAG_OUTSIDE_TXN
from spark_integration.message_batch import BatchRow, MessageBatch, ProducerIntern

IntpArray = npt.NDArray[np.intp]


@dataclass(frozen=True)
class BulkPlan:
    """What `BulkSequencer.commit_bulk` decided for rows [lo, hi) of a batch: `delivered`
    (indices into the batch, in delivery order) each committed by the message at `commits`
    (non-decreasing), and the rows left to the one-by-one path (`fallback`, in journal
    order)."""

    delivered: IntpArray
    commits: IntpArray
    fallback: IntpArray


class BulkSequencer(Sequencer[BatchRow]):
    """A Sequencer of batch rows that also decides rows by columns (see the module docstring).

    `commit_bulk` updates the state of the producers it decides at once; the caller then
    feeds the fallback rows to `commit_pending` in journal order, and ends the batch with
    `read_through_to`. Between the two, only the fallback producers' rows may be queued."""

    def pending_clocks(self, journal: str, since: int) -> dict[bytes, int]:
        """The largest clock of each pending transaction of `journal` that began at or after
        `since` (what a walk from `since` saw whole): a later partition's replay of it needs
        that clock, which a checkpoint does not hold (stream_read.py)."""
        return {
            producer: partial.max_clock
            for (j, producer), partial in self._partials.items()
            if j == journal and partial.begin >= since
        }

    def pending_acks(self, journal: str) -> dict[int, int]:
        """The last ACK clock of each producer of `journal` with a transaction pending (by
        ProducerID as an integer): which later message of the producer resolves that
        transaction depends only on it (range_read.py, `CommittedRange.resolving_at`)."""
        return {
            int.from_bytes(producer, "big"): partial.min_clock
            for (j, producer), partial in self._partials.items()
            if j == journal and partial.begin != -1
        }

    def commit_bulk(
        self, batch: MessageBatch, lo: int, hi: int, intern: ProducerIntern
    ) -> BulkPlan | None:
        """Decide rows [lo, hi) of `batch` in bulk where the module docstring says it is
        certain; None (nothing changed) if no row is so decided."""
        journal = batch.journal
        if hi <= lo:
            return None
        clocks = batch.clocks[lo:hi]
        flags = batch.flags[lo:hi]
        producers = batch.producers[lo:hi]
        n = hi - lo
        positions = np.arange(n)

        untracked = clocks == 0
        tracked = np.flatnonzero(~untracked)
        order = tracked[np.argsort(producers[tracked], kind="stable")]
        p, c, f = producers[order], clocks[order], flags[order]
        m = len(order)
        first = np.ones(m, np.bool_)
        first[1:] = p[1:] != p[:-1]
        starts = np.flatnonzero(first)
        stops = np.append(starts[1:], m)
        group = np.cumsum(first) - 1
        prev_c = np.roll(c, 1)
        prev_f = np.roll(f, 1)
        bad = (f > FLAG_ACK_TXN) | (
            ~first & ((c <= prev_c) | ((f == FLAG_OUTSIDE_TXN) & (prev_f == FLAG_CONTINUE_TXN)))
        )
        closing = f != FLAG_CONTINUE_TXN
        sorted_at = np.arange(m)
        alone = np.flatnonzero(untracked & (flags == FLAG_OUTSIDE_TXN))
        runs: list[tuple[bytes, ColumnRun]] = []
        if m:
            # Each producer's rows are certain up to its first `bad` one (its `cut`), the rest
            # go one by one: what the prefix decides does not depend on what follows it.
            cuts = np.minimum(np.minimum.reduceat(np.where(bad, sorted_at, m), starts), stops)
            first_close = np.minimum(
                np.minimum.reduceat(np.where(closing, sorted_at, m), starts), cuts
            )
            last_close = np.maximum.accumulate(np.where(closing, sorted_at, -1))
            last = np.maximum(cuts - 1, starts)  # (A run of no rows: any row of its own.)
            close = np.where(last_close[last] >= starts, last_close[last], -1)
            begins = batch.begins[lo:hi]
            runs = [
                (producer, ColumnRun(*fields))
                for producer, fields in zip(
                    intern.objects(p[starts]),
                    zip(
                        (cuts - starts).tolist(),
                        c[starts].tolist(),
                        begins[order[starts]].tolist(),
                        c[last].tolist(),
                        (first_close - starts).tolist(),
                        c[np.maximum(first_close - 1, starts)].tolist(),
                        np.where(close >= 0, close - starts, -1).tolist(),
                        c[np.maximum(close, 0)].tolist(),
                        begins[order[np.minimum(close + 1, m - 1)]].tolist(),
                        strict=True,
                    ),
                    strict=True,
                )
            ]
        taken = self.commit_columns(journal, int(batch.begins[lo]), runs, len(alone))
        if taken is None:
            return None
        cuts = starts + np.asarray(taken, np.intp)
        in_bulk = sorted_at < cuts[group] if m else np.zeros(0, np.bool_)

        # A CONTINUE_TXN message is committed by the next closing message of its producer,
        # when there is one in its bulk prefix (an ACK: an OUTSIDE_TXN one after it is `bad`).
        next_close = np.minimum.accumulate(np.where(closing, sorted_at, m)[::-1])[::-1]
        committed_txn = in_bulk & ~closing & (next_close < cuts[group])
        outside = in_bulk & (f == FLAG_OUTSIDE_TXN)
        delivered_sorted = np.flatnonzero(committed_txn | outside)
        commit_sorted = np.where(
            closing[delivered_sorted], delivered_sorted, next_close[delivered_sorted]
        )
        delivered = np.concatenate((order[delivered_sorted], alone))
        commits = np.concatenate((order[commit_sorted], alone))
        by_commit = np.lexsort((delivered, commits))

        fallback_rows = np.ones(n, np.bool_)
        fallback_rows[order[in_bulk]] = False
        fallback_rows[alone] = False
        return BulkPlan(
            (delivered[by_commit] + lo).astype(np.intp),
            (commits[by_commit] + lo).astype(np.intp),
            (positions[fallback_rows] + lo).astype(np.intp),
        )
