"""Values the Sequencer consumes and produces.

The Sequencer is deliberately independent of the message layer: it sees a read-uncommitted
message only as something `Sequenced` (where it was read, which producer wrote it, its clock and
its transaction flags). `SeqEnvelope` is this module's own such value, validated when built; the
message layer's decoded `Envelope` has the same attributes, so the read iterators queue those
directly, which keeps this sans-IO core free of framings and UUID parsing.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

# Transaction flags, as carried in the low 10 bits of a Gazette UUID's clock sequence.
FLAG_OUTSIDE_TXN = 0x0
"""Not part of a transaction: the message commits itself as soon as it is read."""
FLAG_CONTINUE_TXN = 0x1
"""Begins or extends a transaction, held until an ACK_TXN with a larger clock commits it."""
FLAG_ACK_TXN = 0x2
"""Commits the producer's pending messages with smaller clocks; rolls back larger ones."""

FLAGS_MAX = 0x3FF
"""Flags are 10 bits wide. Unknown values within them are tolerated (see `Sequencer`)."""

PRODUCER_ID_BYTES = 6
"""A ProducerID is the 6-byte node field of the UUID."""

CLOCK_MAX = (1 << 64) - 1
"""A clock is a 60-bit timestamp (100 ns units) shifted left over a 4-bit sequence counter."""

OFFSET_MAX = (1 << 63) - 1
"""Journal offsets are int64 on the wire."""


class SequencerError(Exception):
    """Base of every error the Sequencer raises."""


class InvalidEnvelopeError(SequencerError, ValueError):
    """A `SeqEnvelope` field is out of its domain."""


class InvalidCheckpointError(SequencerError, ValueError):
    """A checkpoint (or a `ProducerState`/`JournalProducer` in it) is out of its domain."""


def _check_journal(journal: object, path: str, error: type[SequencerError]) -> None:
    if not isinstance(journal, str) or not journal:
        raise error(f"{path}: must be a non-empty str (got {journal!r})")


def _check_producer(producer: object, path: str, error: type[SequencerError]) -> None:
    if not isinstance(producer, bytes) or len(producer) != PRODUCER_ID_BYTES:
        raise error(f"{path}: must be {PRODUCER_ID_BYTES} bytes (got {producer!r})")


def _check_int(value: object, lo: int, hi: int, path: str, error: type[SequencerError]) -> None:
    # bool is an int subclass; accepting True as an offset would hide a caller's bug.
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise error(f"{path}: must be an int in [{lo}, {hi}] (got {value!r})")


class Sequenced(Protocol):
    """What the Sequencer reads of a queued envelope (`SeqEnvelope`, or the message layer's
    `Envelope`); it hands the envelope itself back when the message is dequeued."""

    @property
    def journal(self) -> str: ...

    @property
    def begin(self) -> int: ...

    @property
    def end(self) -> int: ...

    @property
    def producer(self) -> bytes: ...

    @property
    def clock(self) -> int: ...

    @property
    def flags(self) -> int: ...


def check_envelope(env: Sequenced) -> None:
    """Raise InvalidEnvelopeError unless every field of `env` is in its domain."""
    _check_journal(env.journal, "envelope.journal", InvalidEnvelopeError)
    _check_int(env.begin, 0, OFFSET_MAX, "envelope.begin", InvalidEnvelopeError)
    _check_int(env.end, 0, OFFSET_MAX, "envelope.end", InvalidEnvelopeError)
    # Every framed message occupies at least one byte; an empty range would make the
    # offsets the Sequencer checkpoints ambiguous.
    if env.end <= env.begin:
        raise InvalidEnvelopeError(
            f"envelope.end: must be > begin (got begin={env.begin}, end={env.end})"
        )
    _check_producer(env.producer, "envelope.producer", InvalidEnvelopeError)
    _check_int(env.clock, 0, CLOCK_MAX, "envelope.clock", InvalidEnvelopeError)
    _check_int(env.flags, 0, FLAGS_MAX, "envelope.flags", InvalidEnvelopeError)


@dataclass(frozen=True, slots=True)
class SeqEnvelope:
    """One read-uncommitted message: the journal byte range it was read from, and its UUID parts.

    `message` is opaque to the Sequencer and handed back unchanged when the envelope is dequeued.
    A clock of zero marks a message without a usable UUID: it is always delivered, never
    de-duplicated (Gazette's at-least-once fallback).
    """

    journal: str
    begin: int
    end: int
    producer: bytes
    clock: int
    flags: int
    message: object = None

    def __post_init__(self) -> None:
        check_envelope(self)

    @property
    def is_ack(self) -> bool:
        """True for the ACK_TXN message that closes a committed sequence.

        ACKs are delivered to the reader like any other committed message, so that it can see
        where a producer's transaction ended; applications usually skip them.
        """
        return self.flags == FLAG_ACK_TXN


@dataclass(frozen=True, slots=True, order=True)
class JournalProducer:
    """A producer as seen within one journal: sequencing state is kept per pair."""

    journal: str
    producer: bytes

    def __post_init__(self) -> None:
        _check_journal(self.journal, "journal_producer.journal", InvalidCheckpointError)
        _check_producer(self.producer, "journal_producer.producer", InvalidCheckpointError)


@dataclass(frozen=True, slots=True)
class ProducerState:
    """What must survive a restart about one JournalProducer.

    `last_ack` is the exclusive lower bound of clocks still to be delivered: the last ACK (or the
    last dequeued message of a sequence being delivered). `begin` is the journal offset from
    which a pending span must be replayed, or -1 if the producer has no pending span.
    """

    last_ack: int
    begin: int = -1

    def __post_init__(self) -> None:
        _check_int(self.last_ack, 0, CLOCK_MAX, "producer_state.last_ack", InvalidCheckpointError)
        _check_int(self.begin, -1, OFFSET_MAX, "producer_state.begin", InvalidCheckpointError)


def _frozen_offsets(offsets: Mapping[str, int]) -> Mapping[str, int]:
    for journal, offset in offsets.items():
        _check_journal(journal, "checkpoint.read_through", InvalidCheckpointError)
        _check_int(
            offset, 0, OFFSET_MAX, f"checkpoint.read_through[{journal}]", InvalidCheckpointError
        )
    return MappingProxyType(dict(offsets))


def _frozen_producers(
    producers: Mapping[JournalProducer, ProducerState],
) -> Mapping[JournalProducer, ProducerState]:
    for jp, state in producers.items():
        if not isinstance(jp, JournalProducer) or not isinstance(state, ProducerState):
            raise InvalidCheckpointError(
                f"checkpoint.producers: must map JournalProducer to ProducerState "
                f"(got {jp!r}: {state!r})"
            )
    return MappingProxyType(dict(producers))


@dataclass(frozen=True, slots=True)
class SequencerCheckpoint:
    """A snapshot from which a new Sequencer resumes exactly where this one stood.

    `read_through` maps each journal to the offset from which reading must resume: everything
    before it has been decided. Pending spans that began before it are not re-read but replayed
    on demand, from the `begin` kept in `producers`.
    """

    read_through: Mapping[str, int] = field(default_factory=dict)
    producers: Mapping[JournalProducer, ProducerState] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Copies, so that neither the caller nor the Sequencer can alter a taken checkpoint.
        object.__setattr__(self, "read_through", _frozen_offsets(self.read_through))
        object.__setattr__(self, "producers", _frozen_producers(self.producers))


@dataclass(frozen=True, slots=True)
class ReplayRequired:
    """The byte range `[begin, end)` of `journal` the caller must re-read and pass to `replay()`.

    Asked for when a committed sequence began before what the ring buffer still holds (a long
    transaction, many interleaved producers, or a restart from a checkpoint).
    """

    journal: str
    begin: int
    end: int


class QueueOutcome(enum.Enum):
    """What `Sequencer.queue_uncommitted` decided. Values match Gazette's metric labels."""

    OUTSIDE_ALREADY_ACKED = "outsideAlreadyAcked"
    """An OUTSIDE_TXN duplicate of an already-delivered message: ignored."""
    OUTSIDE_COMMIT = "outsideCommit"
    """An OUTSIDE_TXN message that commits itself: dequeue it."""
    CONTINUE_ALREADY_ACKED = "continueAlreadyAcked"
    """A CONTINUE_TXN duplicate of an already-acknowledged message: ignored."""
    CONTINUE_TXN_CLOCK_LARGER = "continueTxnClockLarger"
    """A CONTINUE_TXN duplicate within the pending span (its clock is not larger): ignored."""
    CONTINUE_BEGIN_SPAN = "continueBeginSpan"
    """A CONTINUE_TXN message that begins a pending span."""
    CONTINUE_EXTEND_SPAN = "continueExtendSpan"
    """A CONTINUE_TXN message that extends the pending span."""
    ACK_ROLLBACK = "ackRollback"
    """An ACK_TXN not newer than the last ACK: the pending span is discarded."""
    ACK_EMPTY = "ackEmpty"
    """An ACK_TXN with no pending span: dequeue the ACK alone."""
    ACK_COMMIT_RING = "ackCommitRing"
    """An ACK_TXN committing a span held entirely in the ring: dequeue it."""
    ACK_COMMIT_REPLAY = "ackCommitReplay"
    """An ACK_TXN committing a span the ring no longer fully holds: replay, then dequeue."""

    @property
    def commits(self) -> bool:
        """True if the caller must now dequeue (step) before queueing anything else."""
        return self in _COMMITTING


_COMMITTING = frozenset(
    {
        QueueOutcome.OUTSIDE_COMMIT,
        QueueOutcome.ACK_EMPTY,
        QueueOutcome.ACK_COMMIT_RING,
        QueueOutcome.ACK_COMMIT_REPLAY,
    }
)


def prune_bounds(states: Iterable[tuple[str, int]], horizon: int) -> dict[str, int]:
    """Per journal, the clock below which a producer with no pending span is pruned from a
    checkpoint, given its producers' (journal, last ACK clock) `states`: the journal's newest
    last ACK less `horizon` (a span of clock units), as Gazette's Sequencer.Checkpoint bounds
    it. None if `horizon` is 0 (nothing is pruned)."""
    if isinstance(horizon, bool) or not isinstance(horizon, int):
        raise ValueError(f"horizon: must be an int (got {horizon!r})")
    if not 0 <= horizon <= CLOCK_MAX:
        raise ValueError(f"horizon: must be in [0, {CLOCK_MAX}] (got {horizon})")
    if not horizon:
        return {}
    newest: dict[str, int] = {}
    for journal, clock in states:
        if clock > newest.get(journal, 0):
            newest[journal] = clock
    return {journal: max(0, clock - horizon) for journal, clock in newest.items()}


def pruned(
    producers: Mapping[JournalProducer, ProducerState], bounds: Mapping[str, int]
) -> dict[JournalProducer, ProducerState]:
    """`producers` without those with no pending span whose last ACK is below their journal's
    bound (`prune_bounds`)."""
    return {
        jp: state
        for jp, state in producers.items()
        if state.begin != -1 or state.last_ack >= bounds.get(jp.journal, 0)
    }
