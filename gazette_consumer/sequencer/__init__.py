"""Read-committed sequencing of read-uncommitted messages (sans-IO)."""

from gazette_consumer.sequencer.sequencer import (
    RING_SIZE_MAX,
    OffsetRegressionError,
    ReplayMismatchError,
    Sequencer,
    SequencerStateError,
)
from gazette_consumer.sequencer.types import (
    FLAG_ACK_TXN,
    FLAG_CONTINUE_TXN,
    FLAG_OUTSIDE_TXN,
    InvalidCheckpointError,
    InvalidEnvelopeError,
    JournalProducer,
    ProducerState,
    QueueOutcome,
    ReplayRequired,
    SeqEnvelope,
    SequencerCheckpoint,
    SequencerError,
)

__all__ = [
    "FLAG_ACK_TXN",
    "FLAG_CONTINUE_TXN",
    "FLAG_OUTSIDE_TXN",
    "RING_SIZE_MAX",
    "InvalidCheckpointError",
    "InvalidEnvelopeError",
    "JournalProducer",
    "OffsetRegressionError",
    "ProducerState",
    "QueueOutcome",
    "ReplayMismatchError",
    "ReplayRequired",
    "SeqEnvelope",
    "Sequencer",
    "SequencerCheckpoint",
    "SequencerError",
    "SequencerStateError",
]
