"""Sequencer: turns read-uncommitted messages into read-committed ones (sans-IO).

Journal appends are at-least-once and producers write transactions as CONTINUE_TXN messages
closed by an ACK_TXN, so a journal read in order holds duplicates, pending messages that may yet
roll back, and the messages of many producers interleaved. The Sequencer is fed that stream one
envelope at a time and hands back exactly the committed messages, each once, in per-producer order.

Per (journal, producer) it keeps a `Partial` (ring.py): the clock of the last delivered ACK
(`min_clock`, exclusive), the largest clock of the pending span (`max_clock`), and the offset at
which that span began. Messages are de-duplicated by clock alone: a producer's clock ticks with every UUID it
generates, so anything not larger than what was already seen is a re-append.

Committed messages are normally served from a fixed ring of recently queued envelopes, in which
the envelopes of one producer's span are linked together (`SpanRing`, ring.py). A span that began before what the ring
still holds (long transactions, busy journals, a restart from a checkpoint) is re-read instead:
the Sequencer names the byte range (`ReplayRequired`) and the caller supplies those envelopes
through `replay()`. Either way no producer waits on another: an ACK delivers its span at once,
however many other producers have spans pending around it.

Protocol, for the caller:

    outcome = seq.queue_uncommitted(env)
    if seq.replay_required is not None:
        r = seq.replay_required
        seq.replay(read_uncommitted(r.journal, r.begin, r.end))
    while seq.step():
        consume(seq.dequeued)

An envelope returned by `step()` counts as consumed for `checkpoint()`: a checkpoint taken after
it resumes with the next one. Checkpointing only between `queue_uncommitted` calls keeps the
messages of one ACK within one consumer transaction, as Gazette's consumers do.

Entry points: `queue_uncommitted` validates what it is given (a `SeqEnvelope` was validated when
built). The others trust it, for envelopes that are valid by construction (the message layer's
decoders derive them from the framing and the UUID layout), and are what a reader uses:

- `queue_trusted(env)`: `queue_uncommitted` without the validation;
- `commit_alone(env)`: the commonest case, an OUTSIDE_TXN message that commits by itself, in one
  call and without touching the ring: what `queue_trusted` and two `step()`s would do; or it
  declines, changing nothing;
- `commit_alone_run(envs)`: `commit_alone` for the longest run at the front of a decoded
  piece that it would deliver one by one (one producer's OUTSIDE_TXN messages, clocks
  rising), in one call;
- `commit_alone_mixed(envs, before)`: the same for a run of several producers' OUTSIDE_TXN
  messages of one journal (producers alternating), naming each one's last ACK before the run
  for a reader's checkpoints within it;
- `queue_span(pending)`: `queue_trusted` for each envelope of a deque, up to one that commits
  (a transaction's messages are linked into the ring without per-message outcomes, a
  producer's run of them into free slots at once);
- `dequeue()`: `step()` returning the envelope stepped to;
- `dequeue_all()`: every envelope `dequeue()` would return for the emission in progress, in
  one call (not while a replay serves it);
- `commit_span_run(envs)`: a whole transaction at the front of `envs` (one producer's
  CONTINUE_TXN messages, then its ACK) committed at once, without the ring.
- `commit_columns(journal, begin, runs)`: for a reader holding a batch as columns, each
  producer's run of messages whose outcome is certain committed at once from a few facts of
  it (`ColumnRun`), then `read_through_to(journal, offset)` once the rest went one by one
  (column_runs.py; the same state, save that nothing is linked into the ring).

They leave the Sequencer exactly as the general protocol above would (a property test holds
them to it; `commit_columns`, the ring aside, the differential test of spark_integration's
bulk_commit.py), so a caller may mix them freely.
"""

from __future__ import annotations

from gazette_consumer.sequencer.column_runs import SequencerColumnRuns
from gazette_consumer.sequencer.dequeue import SequencerDequeuing
from gazette_consumer.sequencer.fast_paths import SequencerFastPaths
from gazette_consumer.sequencer.state import (
    RING_SIZE_MAX,
    E,
    OffsetRegressionError,
    ReplayMismatchError,
    SequencerStateError,
)

__all__ = [
    "RING_SIZE_MAX",
    "OffsetRegressionError",
    "ReplayMismatchError",
    "Sequencer",
    "SequencerStateError",
]


class Sequencer(SequencerFastPaths[E], SequencerColumnRuns[E], SequencerDequeuing[E]):
    """Sequences read-uncommitted envelopes into read-committed ones. See the module docstring.

    Generic in the envelopes it is given (`SeqEnvelope`, or anything `Sequenced`), which it
    hands back unchanged when they are dequeued. Its parts, one concept per module:
    state.py (`SequencerState`), classify.py (the general path), fast_paths.py (a reader's
    entry points), column_runs.py (a columnar reader's), dequeue.py (dequeuing, replays,
    checkpoints).
    """
