"""What a running shard derives from its ShardSpec: durations, sizes, start offsets (sans-IO).

`validate_shard_spec` (broker.protocol.validate) checks Gazette's rules, shared with Go
consumers through etcd. `check_runnable` adds what this implementation needs to run the spec
(bounds of its Sequencer and read channel), with the field named, so that a spec that cannot
run is refused before anything starts.
"""

from __future__ import annotations

from typing import Final

from broker.protocol import consumer_pb2 as cpb
from broker.protocol.validate import ValidationError, validate_shard_spec
from gazette_consumer.sequencer.read_iter import (
    READ_CHANNEL_SIZE_DEFAULT,
    READ_CHANNEL_SIZE_MAX,
    RING_SIZE_DEFAULT,
)
from gazette_consumer.sequencer.sequencer import RING_SIZE_MAX
from gazette_consumer.sequencer.types import SequencerCheckpoint

__all__ = [
    "PRODUCER_PRUNE_HORIZON_S",
    "check_runnable",
    "read_channel_size",
    "recovery_log",
    "ring_size",
    "start_checkpoint",
    "txn_durations_s",
]

PRODUCER_PRUNE_HORIZON_S: Final = 24 * 3600.0
"""Producers whose last ACK is this much older than the newest producer state of their journal
are dropped from checkpoints (Gazette's 24 h, measured as its Sequencer.Checkpoint does, on
the journal's clocks rather than the wall clock): without pruning, every producer ever seen
would stay in every checkpoint."""


def check_runnable(spec: cpb.ShardSpec) -> None:
    """Raise ValidationError (field named) unless `spec` is valid and this runner can run it."""
    validate_shard_spec(spec)
    if spec.ring_buffer_size > RING_SIZE_MAX:
        raise ValidationError(
            f"must be <= {RING_SIZE_MAX} (got {spec.ring_buffer_size})", "ring_buffer_size"
        )


def txn_durations_s(spec: cpb.ShardSpec) -> tuple[float, float]:
    """(min, max) transaction durations in seconds."""
    return (
        spec.min_txn_duration.ToNanoseconds() / 1e9,
        spec.max_txn_duration.ToNanoseconds() / 1e9,
    )


def ring_size(spec: cpb.ShardSpec) -> int:
    """Sequencer ring entries: the spec's, or the default for zero."""
    return spec.ring_buffer_size or RING_SIZE_DEFAULT


def read_channel_size(spec: cpb.ShardSpec) -> int:
    """Decoded chunks read ahead of the transaction loop.

    Gazette counts this channel in messages (default 8192); ours holds decoded chunks of up to
    128 KiB each, so large Gazette values are capped at READ_CHANNEL_SIZE_MAX rather than
    refused: the spec is shared with Go consumers, and a bigger read-ahead is only a hint.
    """
    if spec.read_channel_size == 0:
        return READ_CHANNEL_SIZE_DEFAULT
    return min(spec.read_channel_size, READ_CHANNEL_SIZE_MAX)


def recovery_log(spec: cpb.ShardSpec) -> str:
    """The shard's recovery log journal, or "" if it has none."""
    if not spec.recovery_log_prefix:
        return ""
    return f"{spec.recovery_log_prefix}/{spec.id}"


def start_checkpoint(
    spec: cpb.ShardSpec, restored: SequencerCheckpoint
) -> tuple[dict[str, int], SequencerCheckpoint]:
    """Where each source journal is read from, and the checkpoint to resume the Sequencer with.

    A source starts at its checkpoint offset, raised to the spec's `min_offset` (an operator
    skipping ahead). Journals of the checkpoint that are no longer sources keep their offsets
    and producer states (as Gazette's do): should one become a source again, reading resumes
    where it stopped instead of re-processing it from `min_offset`.
    """
    offsets: dict[str, int] = {}
    for source in spec.sources:
        offsets[source.journal] = max(
            restored.read_through.get(source.journal, 0), source.min_offset
        )
    read_through = {**restored.read_through, **offsets}
    return offsets, SequencerCheckpoint(read_through=read_through, producers=restored.producers)
