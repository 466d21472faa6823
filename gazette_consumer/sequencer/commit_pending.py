"""Commit what a batch of read envelopes commits, into a list: the Sequencer's fast paths in one
call per batch (sans-IO).

A reader that hands out committed messages a batch at a time (a Spark partition building Arrow
record batches, a bounded range walk) needs no per-message protocol: it queues a decoded
batch and wants every message that batch commits, in delivery order. `commit_pending` drives
the Sequencer's fast entry points for it, exactly as `ReadCommittedIter` does one message at
a time:

- a run of one producer's OUTSIDE_TXN messages with rising clocks: `commit_alone_run`;
- any other message that commits by itself: `commit_alone`;
- a whole transaction (one producer's CONTINUE_TXN messages, then its ACK) at the front:
  `commit_span_run`, looking at most `span_look_max` messages ahead for its ACK;
- otherwise `queue_span` links the transaction's messages into the ring, and when an ACK
  commits them from it they are taken at once (`dequeue_all`).

Every entry point leaves the Sequencer as the general protocol would (their property tests),
so this does too (tests/gazette_consumer/sequencer/test_commit_pending.py holds it to the
general protocol, replays included). ACKs are consumed, never appended to `out`.

An ACK that commits a span the ring no longer holds needs a replay: `commit_pending` then stops
and returns that ACK, with `replay_required` set; the caller `replay()`s the range, takes the
committed messages with `dequeue()` (skipping the ACK, delivered last), and calls again.
"""

from __future__ import annotations

from collections import deque
from typing import Final, TypeVar

from gazette_consumer.sequencer.sequencer import Sequencer
from gazette_consumer.sequencer.types import FLAG_ACK_TXN, FLAG_OUTSIDE_TXN, Sequenced

E = TypeVar("E", bound=Sequenced)

SPAN_LOOK_MAX_DEFAULT: Final = 32
"""Messages looked at for a transaction's ACK before it is linked into the ring instead (a
longer transaction most often continues in the next batch: the look would be wasted)."""


def commit_pending(
    seq: Sequencer[E],
    pending: deque[E],
    out: list[E],
    *,
    span_look_max: int | None = SPAN_LOOK_MAX_DEFAULT,
) -> E | None:
    """Queue `pending` (popped from its front) and append what it commits to `out`, in
    delivery order, without ACKs. Returns None once `pending` is empty, or the ACK whose
    commit needs a replay (see the module docstring). Trusts the envelopes as
    `Sequencer.queue_trusted` does. An error propagates with the envelope that raised it
    popped, as from `queue_span`; what was committed before it is in `out`."""
    append, extend, popleft = out.append, out.extend, pending.popleft
    while pending:
        first = pending[0]
        if (
            first.flags == FLAG_OUTSIDE_TXN
            and len(pending) > 1
            and (run := seq.commit_alone_run(pending))
        ):
            extend([popleft() for _ in range(run)])
            continue
        if seq.commit_alone(first):
            append(popleft())
            continue
        if (taken := seq.commit_span_run(pending, span_look_max)) > 0:
            extend([popleft() for _ in range(taken - 1)])
            popleft()  # The ACK: consumed.
            continue
        committing = seq.queue_span(pending)
        if committing is None:
            continue  # Queued; nothing committed yet.
        if seq.replay_required is not None:
            return committing
        # The committing ACK comes last (a message that commits alone is delivered).
        extend([env for env in seq.dequeue_all() if env.flags != FLAG_ACK_TXN])
    return None
