"""Streaming offsets and row conversion, without a SparkSession."""

from __future__ import annotations

import json
import random
import time

import pytest

from gazette_consumer.message.clock import clock_from_unix_nanos
from gazette_consumer.message.uuid import new_producer_id
from gazette_consumer.sequencer.types import JournalProducer, ProducerState, SequencerCheckpoint
from spark_integration import offsets
from spark_integration.rows import converter, infer_schema

pytestmark = pytest.mark.spark


def test_offsets_round_trip_through_json() -> None:
    big = (1 << 64) - 1  # Clocks are unsigned 64-bit.
    cp = SequencerCheckpoint(
        read_through={"aa/one": 120},
        producers={
            JournalProducer("aa/one", bytes.fromhex("0100000000ab")): ProducerState(big, -1),
            JournalProducer("aa/one", bytes.fromhex("0300000000cd")): ProducerState(7, 64),
            JournalProducer("aa/one", bytes.fromhex("0500000000ef")): ProducerState(0, 0),
        },
    )
    encoded = json.loads(json.dumps(offsets.to_json({"aa/one": offsets.JournalOffset(cp, 100)})))
    assert encoded["aa/one"]["offset"] == 120 and encoded["aa/one"]["origin"] == 100
    assert offsets.from_json(encoded) == {"aa/one": offsets.JournalOffset(cp, 100)}
    assert offsets.read_through(encoded) == {"aa/one": 120}


def test_offsets_of_the_earlier_form_are_read() -> None:
    """Queries checkpointed before offsets were packed restart from them."""
    earlier = {"aa/one": {"offset": 9, "producers": {"0100000000ab": {"ack": "17", "begin": 4}}}}
    entry = offsets.from_json(earlier)["aa/one"]
    assert entry.origin == 0 and entry.offset("aa/one") == 9
    assert dict(entry.checkpoint.producers) == {
        JournalProducer("aa/one", bytes.fromhex("0100000000ab")): ProducerState(17, 4)
    }


@pytest.mark.parametrize("producers", [3_000, 20_000])
def test_offsets_stay_small(producers: int) -> None:
    """An offset is written to the checkpoint whole at every micro-batch: at most 17 bytes a
    producer (the JSON objects before took 62: 186 KB at 3,000 producers, 1.24 MB at 20,000),
    with clocks spread over 10 days and one producer in ten in a transaction."""
    rng = random.Random(producers)
    now = clock_from_unix_nanos(time.time_ns())
    states = {
        JournalProducer("aa/one", bytes(new_producer_id(rng.randbytes))): ProducerState(
            now - rng.randrange(10 * 86_400 * 10**7 * 16), -1 if i % 10 else rng.randrange(1 << 40)
        )
        for i in range(producers)
    }
    cp = SequencerCheckpoint(read_through={"aa/one": 1 << 40}, producers=states)
    text = json.dumps(offsets.to_json({"aa/one": offsets.JournalOffset(cp)}))
    assert len(text) <= 17 * producers
    assert offsets.from_json(json.loads(text))["aa/one"].checkpoint == cp


def test_offsets_bound_producers() -> None:
    producers = {
        JournalProducer("aa/one", i.to_bytes(6, "big")): ProducerState(1, -1)
        for i in range(offsets.producers_max + 1)
    }
    cp = SequencerCheckpoint(read_through={"aa/one": 1}, producers=producers)
    with pytest.raises(offsets.GazetteOffsetError, match="lower option producerHorizonSeconds"):
        offsets.to_json({"aa/one": offsets.JournalOffset(cp)})


def test_converters_null_what_does_not_fit() -> None:
    from pyspark.sql.types import ArrayType, DoubleType, LongType, StringType, StructType

    struct = (
        StructType().add("a", LongType()).add("b", ArrayType(DoubleType())).add("c", StringType())
    )
    convert = converter(struct)
    assert convert({"a": 2.0, "b": [1, 2.5, "x"], "c": {"k": 1}}) == (
        2,
        [1.0, 2.5, None],
        '{"k":1}',
    )
    assert convert({"a": True, "b": "no"}) == (None, None, None)
    assert convert([1]) is None


def test_infer_schema_types_top_level_fields() -> None:
    lines = [b'{"a": 1, "b": true, "c": 1.5, "UUID": "x"}', b'{"a": 2, "d": {"e": 1}}', b"[1]"]
    fields = {f.name: f.dataType.simpleString() for f in infer_schema(lines).fields}
    assert fields == {
        "journal": "string",
        "offset": "bigint",
        "uuid": "string",
        "producer": "string",
        "clock": "bigint",
        "timestamp": "timestamp",
        "content": "string",
        "a": "bigint",
        "b": "boolean",
        "c": "double",
        "d": "string",
    }
