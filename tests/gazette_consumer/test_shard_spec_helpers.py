"""What a shard derives from its spec: start offsets, sizes, durations, runnability."""

from __future__ import annotations

import pytest
from google.protobuf.duration_pb2 import Duration

from broker.protocol import consumer_pb2 as cpb
from broker.protocol.validate import ValidationError
from gazette_consumer.sequencer.read_iter import (
    READ_CHANNEL_SIZE_DEFAULT,
    READ_CHANNEL_SIZE_MAX,
    RING_SIZE_DEFAULT,
)
from gazette_consumer.sequencer.types import JournalProducer, ProducerState, SequencerCheckpoint
from gazette_consumer.shard_spec import (
    check_runnable,
    read_channel_size,
    recovery_log,
    ring_size,
    start_checkpoint,
    txn_durations_s,
)

P = b"\x01\x00\x00\x00\x00\x01"


def spec(**fields: object) -> cpb.ShardSpec:
    out = cpb.ShardSpec(id="shard-1", max_txn_duration=Duration(seconds=1))
    for name, value in fields.items():
        if isinstance(value, Duration):
            getattr(out, name).CopyFrom(value)
        else:
            setattr(out, name, value)
    return out


def test_start_offsets_raise_to_min_offset_and_keep_former_sources() -> None:
    s = spec()
    s.sources.add(journal="a/one", min_offset=100)
    s.sources.add(journal="a/two", min_offset=0)
    restored = SequencerCheckpoint(
        read_through={"a/one": 40, "a/two": 70, "a/old": 500},
        producers={JournalProducer("a/old", P): ProducerState(last_ack=9, begin=-1)},
    )
    offsets, resume = start_checkpoint(s, restored)
    assert offsets == {"a/one": 100, "a/two": 70}
    # A journal no longer read keeps its offset and producers, should it be read again.
    assert dict(resume.read_through) == {"a/one": 100, "a/two": 70, "a/old": 500}
    assert dict(resume.producers) == dict(restored.producers)


def test_sizes_default_for_zero_and_read_channel_is_capped() -> None:
    assert ring_size(spec()) == RING_SIZE_DEFAULT
    assert ring_size(spec(ring_buffer_size=64)) == 64
    assert read_channel_size(spec()) == READ_CHANNEL_SIZE_DEFAULT
    assert read_channel_size(spec(read_channel_size=3)) == 3
    # Gazette counts its channel in messages (default 8192): capped, not refused.
    assert read_channel_size(spec(read_channel_size=8192)) == READ_CHANNEL_SIZE_MAX


def test_durations_and_recovery_log() -> None:
    s = spec(min_txn_duration=Duration(nanos=250_000_000))
    assert txn_durations_s(s) == (0.25, 1.0)
    assert recovery_log(s) == ""
    assert recovery_log(spec(recovery_log_prefix="logs", hint_prefix="/hints")) == "logs/shard-1"


def test_runnable_refuses_what_cannot_run_naming_the_field() -> None:
    check_runnable(spec())
    with pytest.raises(ValidationError, match=r"^ring_buffer_size: must be <= 1048576"):
        check_runnable(spec(ring_buffer_size=1 << 21))
    with pytest.raises(ValidationError, match=r"^max_txn_duration: must be > 0s"):
        check_runnable(cpb.ShardSpec(id="shard-1"))
