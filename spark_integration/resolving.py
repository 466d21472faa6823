"""Which later messages resolve the transactions pending at a point of a journal (sans-IO): what
a streaming planner's walk notes at each split, so that the partition ending there reads only
those messages ahead (range_read.py, `CommittedRange._look_ahead`).

A partition's look-ahead feeds its Sequencer the messages of the producers pending at its end
that are not CONTINUE_TXN, in order, until each is resolved. For a producer P with a
transaction pending, whose last ACK clock was A there, the first such message resolving it is
the first ACK_TXN (a commit, or a rollback: every ACK ends the pending span), or the first other
message with a clock above A (it commits alone, dropping the span); those before it have clocks
at or below A: already acknowledged, they change nothing (gazette_consumer's classify.py).
Which message it is depends on A alone, the same at the partition's end as in the planner's
walk there (the partition's walk reaches the state the planner checkpoints at the split).
"""

from __future__ import annotations

import numpy as np

from gazette_consumer.sequencer.types import FLAG_ACK_TXN, FLAG_CONTINUE_TXN
from spark_integration.message_batch import MessageBatch


class Resolutions:
    """The resolving messages after each watched point (`at`), [begin, end) each, in journal
    order. `watch` a point with the producers pending there (by ProducerID as an integer, with
    their last ACK clock), then `note` every row after it, in order."""

    def __init__(self) -> None:
        self.at: dict[int, list[tuple[int, int]]] = {}
        self._unresolved: dict[int, dict[int, int]] = {}

    def watch(self, point: int, pending: dict[int, int]) -> None:
        self.at[point] = []
        if pending:
            self._unresolved[point] = dict(pending)

    def note(self, batch: MessageBatch, lo: int, hi: int) -> None:
        """Rows [lo, hi) of `batch`, which follow every point watched so far."""
        if not self._unresolved or hi <= lo:
            return
        keys = np.fromiter({p for watched in self._unresolved.values() for p in watched}, np.uint64)
        candidates = np.flatnonzero(
            np.isin(batch.producers[lo:hi], keys) & (batch.flags[lo:hi] != FLAG_CONTINUE_TXN)
        )
        for i in (candidates + lo).tolist():
            producer, clock = int(batch.producers[i]), int(batch.clocks[i])
            ack = int(batch.flags[i]) == FLAG_ACK_TXN
            for point, watched in list(self._unresolved.items()):
                last_ack = watched.get(producer)
                if last_ack is None or not (ack or clock > last_ack):
                    continue
                self.at[point].append((int(batch.begins[i]), int(batch.ends[i])))
                del watched[producer]
                if not watched:
                    del self._unresolved[point]
