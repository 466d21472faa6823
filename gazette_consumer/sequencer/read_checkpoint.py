"""The read-committed iterator's checkpoint: consistent with the messages it *returned*
(sans-IO).

The Sequencer's own checkpoint stands where it was stepped to, which may be past what the
iterator returned: messages committed at once are held in a run and returned one by one, and
to know `in_sequence` the iterator steps one message past the one it returns. `checkpoint_of`
puts back where committing and returning them one by one would stand, so that a new iterator
built from it returns exactly the messages not returned yet.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from gazette_consumer.message.message import Envelope
from gazette_consumer.sequencer.sequencer import Sequencer
from gazette_consumer.sequencer.types import (
    JournalProducer,
    ProducerState,
    SequencerCheckpoint,
    prune_bounds,
    pruned,
)


def checkpoint_of(
    seq: Sequencer[Envelope[Any]],
    floors: Mapping[str, int],
    run_all: Sequence[Envelope[Any]],
    left: int,
    span_through: int | None,
    ahead: Envelope[Any] | None,
    ahead_after: Envelope[Any] | None,
    horizon: int = 0,
    before: Mapping[tuple[str, bytes], int | None] | None = None,
) -> SequencerCheckpoint:
    """The checkpoint of an iterator over `seq`: `floors` (per journal, the offset through which
    every queued envelope was consumed), the run committed at once `run_all` of which the last
    `left` are not returned yet (`span_through`: for one ACK's messages, the offset of their
    journal read up to the ACK; else None), and `ahead`, the message stepped to but not
    returned, held after `ahead_after` of its sequence (None: nothing to look past).
    `horizon` prunes idle producers (see `Sequencer.checkpoint`). `before`, for a run
    of several producers' messages that each commit alone (`Sequencer.commit_alone_mixed`):
    each one's last ACK before the run (None: it had no state)."""
    # The last returned message of a run some of which is not returned yet.
    held = run_all[len(run_all) - left - 1] if left else None
    if held is not None and before is not None:
        return _mixed_checkpoint(seq, floors, run_all[: len(run_all) - left], before, horizon)
    seq_cp = seq.checkpoint()  # Pruned below, as of the messages returned.
    read_through = dict(floors)
    for journal, offset in seq_cp.read_through.items():
        read_through[journal] = max(read_through.get(journal, 0), offset)
    producers = seq_cp.producers
    if held is not None:
        # Where committing the run's messages one by one, through `held`, would stand.
        journal = held.journal
        producers = dict(producers)
        jp = JournalProducer(journal, held.producer)
        if span_through is not None:
            # Within one ACK's messages: its journal read up to the ACK, and the producer's
            # span pending from the message after `held` (a restart replays it from there
            # when it reads the ACK again). Never pruned: a pending span is not.
            read_through[journal] = max(floors.get(journal, 0), span_through)
            producers[jp] = ProducerState(last_ack=held.clock, begin=held.end)
        else:
            read_through[journal] = max(floors.get(journal, 0), held.end)
            producers[jp] = ProducerState(last_ack=held.clock, begin=-1)
    if ahead is not None and ahead_after is not None and not left:
        # Where stepping `ahead_after` (non-final, of the same producer) left the state.
        producers = dict(producers)
        producers[JournalProducer(ahead.journal, ahead.producer)] = ProducerState(
            last_ack=ahead_after.clock, begin=ahead_after.end
        )
    keep = set() if held is None else {(held.journal, held.producer)}
    return _pruned(seq, read_through, producers, horizon, keep)


def _pruned(
    seq: Sequencer[Envelope[Any]],
    read_through: dict[str, int],
    producers: Mapping[JournalProducer, ProducerState],
    horizon: int,
    keep: AbstractSet[tuple[str, bytes]],
) -> SequencerCheckpoint:
    """The checkpoint of `read_through` and `producers` (as of the messages returned), its
    idle producers pruned relative to its own newest clocks, as a Sequencer that stood there
    would prune them (`Sequencer.checkpoint`); the Sequencer itself forgets them too, but for
    those of `keep` (its state of them is past the checkpoint's)."""
    states = ((jp.journal, state.last_ack) for jp, state in producers.items())
    bounds = prune_bounds(states, horizon)
    seq.prune(bounds, keep)
    return SequencerCheckpoint(read_through=read_through, producers=pruned(producers, bounds))


def _mixed_checkpoint(
    seq: Sequencer[Envelope[Any]],
    floors: Mapping[str, int],
    returned: Sequence[Envelope[Any]],
    before: Mapping[tuple[str, bytes], int | None],
    horizon: int,
) -> SequencerCheckpoint:
    """`checkpoint_of` within a run of several producers' messages that each commit alone, of
    which `returned` were returned: each producer of the run stands at its last returned
    message, or where it stood before the run if none of its messages was returned (absent if
    it had no state), pruned as `Sequencer.checkpoint` would prune it there; the Sequencer
    itself prunes none of them (it is past the run)."""
    seq_cp = seq.checkpoint()  # Pruned below, as of the messages returned.
    held = returned[-1]
    read_through = dict(floors)
    for journal, offset in seq_cp.read_through.items():
        read_through[journal] = max(read_through.get(journal, 0), offset)
    read_through[held.journal] = max(floors.get(held.journal, 0), held.end)
    last: dict[tuple[str, bytes], int | None] = dict(before)
    for env in returned:  # A checkpoint is rare: a pass over a piece's messages at most.
        last[(env.journal, env.producer)] = env.clock
    producers = dict(seq_cp.producers)
    for (journal, producer), clock in last.items():
        jp = JournalProducer(journal, producer)
        if clock is None:
            producers.pop(jp, None)
        else:
            producers[jp] = ProducerState(last_ack=clock, begin=-1)
    return _pruned(seq, read_through, producers, horizon, set(before))
