"""Read-committed sequencing of read-uncommitted messages (sans-IO), and the read iterators."""

from typing import TYPE_CHECKING

from broker.lazy_exports import lazy_getattr
from gazette_consumer.sequencer.column_runs import ColumnRun
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
    Sequenced,
    SequencerCheckpoint,
    SequencerError,
)

__all__ = [
    "FLAG_ACK_TXN",
    "FLAG_CONTINUE_TXN",
    "FLAG_OUTSIDE_TXN",
    "RING_SIZE_MAX",
    "ColumnRun",
    "InvalidCheckpointError",
    "InvalidEnvelopeError",
    "JournalProducer",
    "OffsetRegressionError",
    "ProducerState",
    "QueueOutcome",
    "ReadCommittedIter",
    "ReadIterClosedError",
    "ReadUncommittedIter",
    "ReplayMismatchError",
    "ReplayRequired",
    "SeqEnvelope",
    "Sequenced",
    "Sequencer",
    "SequencerCheckpoint",
    "SequencerError",
    "SequencerStateError",
]

# The read iterators are asyncio shells over the broker client; they are imported on first use
# so that importing the sans-IO Sequencer does not pull in grpc and asyncio.
if TYPE_CHECKING:
    from gazette_consumer.sequencer.read_iter import ReadCommittedIter, ReadIterClosedError
    from gazette_consumer.sequencer.read_uncommitted import ReadUncommittedIter

_EXPORTS = {
    "ReadCommittedIter": "gazette_consumer.sequencer.read_iter",
    "ReadIterClosedError": "gazette_consumer.sequencer.read_iter",
    "ReadUncommittedIter": "gazette_consumer.sequencer.read_uncommitted",
}

__getattr__ = lazy_getattr(__name__, _EXPORTS)
