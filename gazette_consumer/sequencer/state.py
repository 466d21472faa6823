"""The Sequencer's state, and what its parts share (sans-IO).

`SequencerState` holds what every part of the `Sequencer` (sequencer.py) reads and writes: the
ring (`SpanRing`), the read-through offsets, the per-producer `Partial`s, and the emission in
progress (`Emission`: a committed sequence being dequeued). The parts are mixins over it, one
module each: queueing and classifying an envelope (classify.py), the fast entry points a reader
uses (fast_paths.py), dequeuing, replays and checkpoints (dequeue.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Generic, TypeVar

from gazette_consumer.sequencer.ring import Partial, SpanRing
from gazette_consumer.sequencer.types import (
    ReplayRequired,
    Sequenced,
    SequencerCheckpoint,
    SequencerError,
)

if TYPE_CHECKING:
    from gazette_consumer.sequencer.older_acks import OncePer

E = TypeVar("E", bound=Sequenced)
"""The type of envelopes a Sequencer is given, and hands back when they are dequeued."""

RING_SIZE_MAX = 1 << 20
"""Upper bound on `ring_size`: the ring is preallocated, so it bounds the Sequencer's memory."""


class SequencerStateError(SequencerError, RuntimeError):
    """A method was called out of protocol order; nothing was changed."""


class OffsetRegressionError(SequencerError, ValueError):
    """An envelope begins before the journal's read-through offset; nothing was changed."""


class ReplayMismatchError(SequencerError, ValueError):
    """A replayed envelope lies outside the `ReplayRequired` range it was asked for."""


class Emission(Generic[E]):
    """A committed sequence being dequeued."""

    __slots__ = (
        "done",
        "partial",
        "producer",
        "replay",
        "replay_range",
        "replay_required",
        "tracked",
    )

    def __init__(
        self,
        producer: bytes,
        partial: Partial,
        replay_required: ReplayRequired | None,
        *,
        tracked: bool = True,
    ) -> None:
        self.producer = producer
        self.partial = partial
        self.tracked = tracked  # False for a zero-clock envelope, which has no producer state.
        self.replay_required = replay_required  # Set until the caller calls replay().
        self.replay_range: ReplayRequired | None = None
        self.replay: Iterator[E] | None = None
        self.done = False  # The committing envelope was returned: the next step() ends it.


class SequencerState(Generic[E]):
    """The state of a `Sequencer` (see the module docstring); validates its construction."""

    def __init__(self, ring_size: int, checkpoint: SequencerCheckpoint | None = None) -> None:
        if isinstance(ring_size, bool) or not isinstance(ring_size, int):
            raise ValueError(f"ring_size: must be an int (got {ring_size!r})")
        if not 1 <= ring_size <= RING_SIZE_MAX:
            raise ValueError(f"ring_size: must be in [1, {RING_SIZE_MAX}] (got {ring_size})")
        if checkpoint is None:
            checkpoint = SequencerCheckpoint()

        self._ring: SpanRing[E] = SpanRing(ring_size)
        self._read_through: dict[str, int] = dict(checkpoint.read_through)
        # Keyed by (journal, producer): a tuple is cheaper to build than a JournalProducer,
        # and one is looked up per queued envelope.
        self._partials: dict[tuple[str, bytes], Partial] = {}
        for jp, state in checkpoint.producers.items():
            # max_clock is not checkpointed: a restored pending span only needs its begin, and
            # any re-appended duplicate of it is filtered by clock when it is delivered.
            self._partials[(jp.journal, jp.producer)] = Partial(state.last_ack, state.begin)
        self._emit: Emission[E] | None = None
        self._dequeued: E | None = None
        # Rate-limits the log lines of ACKs older than their producer's last (classify.py),
        # made at the first one.
        self._older_ack_log: OncePer | None = None
