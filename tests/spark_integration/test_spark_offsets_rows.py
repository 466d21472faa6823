"""Streaming offsets and row conversion, without a SparkSession."""

from __future__ import annotations

import json

import pytest

from gazette_consumer.sequencer.types import JournalProducer, ProducerState, SequencerCheckpoint
from spark_integration import offsets
from spark_integration.rows import converter, infer_schema

pytestmark = pytest.mark.spark


def test_offsets_round_trip_through_json() -> None:
    big = (1 << 64) - 1  # Clocks are unsigned 64-bit: kept as text in the JSON.
    cp = SequencerCheckpoint(
        read_through={"aa/one": 120},
        producers={
            JournalProducer("aa/one", bytes.fromhex("0100000000ab")): ProducerState(big, -1),
            JournalProducer("aa/one", bytes.fromhex("0300000000cd")): ProducerState(7, 64),
        },
    )
    encoded = json.loads(json.dumps(offsets.to_json({"aa/one": cp})))
    assert encoded["aa/one"]["producers"]["0100000000ab"] == {"ack": str(big), "begin": -1}
    assert offsets.from_json(encoded) == {"aa/one": cp}
    assert offsets.read_through(encoded) == {"aa/one": 120}


def test_offsets_bound_producers() -> None:
    producers = {
        JournalProducer("aa/one", i.to_bytes(6, "big")): ProducerState(1, -1)
        for i in range(offsets.producers_max + 1)
    }
    cp = SequencerCheckpoint(read_through={"aa/one": 1}, producers=producers)
    with pytest.raises(offsets.GazetteOffsetError, match="lower option producerHorizonSeconds"):
        offsets.to_json({"aa/one": cp})


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
        "content": "string",
        "a": "bigint",
        "b": "boolean",
        "c": "double",
        "d": "string",
    }
