"""Checkpoints Go writes decode here, including what our stricter validation used to refuse.

The bytes below are Gazette's own, copied when this test was written from
gazette/core consumer/protocol/checkpoint_extensions_test.go (TestProducerIDMapRegression: a
Checkpoint written by an older Go implementation that kept producers in a map). Go decodes them
without validating anything; we must accept them too: journal names shorter than a journal name
may be ("foo"), and a producer whose pending span begins past its journal's read-through offset
(foo: begin 789, read through 111).
"""

from __future__ import annotations

from gazette_consumer.checkpoint import (
    Checkpoint,
    decode_checkpoint,
    encode_checkpoint,
    flatten_producer_states,
    flatten_read_through,
    to_sequencer_checkpoint,
)
from gazette_consumer.sequencer.types import JournalProducer, ProducerState

# fmt: off
GO_PRODUCER_ID_MAP_REGRESSION = bytes([
    0xa, 0x21, 0xa, 0x3, 0x62, 0x61, 0x72, 0x12, 0x1a, 0x8, 0xde, 0x1, 0x12, 0x15, 0xa, 0x6,
    0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff, 0x12, 0xb, 0x9, 0x15, 0x3, 0x0, 0x0, 0x0, 0x0, 0x0,
    0x0, 0x10, 0x65, 0xa, 0x21, 0xa, 0x3, 0x66, 0x6f, 0x6f, 0x12, 0x1a, 0x8, 0x6f, 0x12, 0x16,
    0xa, 0x6, 0x1, 0x2, 0x3, 0x4, 0x5, 0x6, 0x12, 0xc, 0x9, 0xc8, 0x1, 0x0, 0x0, 0x0, 0x0, 0x0,
    0x0, 0x10, 0x95, 0x6, 0x12, 0xd, 0xa, 0x3, 0x62, 0x61, 0x7a, 0x12, 0x6, 0x69, 0x6e, 0x74,
    0x65, 0x6e, 0x74, 0x12, 0x14, 0xa, 0x4, 0x62, 0x69, 0x6e, 0x67, 0x12, 0xc, 0x6f, 0x74, 0x68,
    0x65, 0x72, 0x2d, 0x69, 0x6e, 0x74, 0x65, 0x6e, 0x74,
])
# fmt: on

FOO_PRODUCER = bytes([1, 2, 3, 4, 5, 6])
BAR_PRODUCER = bytes([0xAA, 0xBB, 0xCC, 0xDD, 0xEE, 0xFF])


def test_gazettes_regression_fixture_decodes_as_go_decodes_it() -> None:
    cp = decode_checkpoint(GO_PRODUCER_ID_MAP_REGRESSION)
    # What Gazette's test expects of FlattenProducerStates, FlattenReadThrough, AckIntents.
    assert flatten_producer_states(cp) == {
        JournalProducer("bar", BAR_PRODUCER): ProducerState(last_ack=789, begin=101),
        JournalProducer("foo", FOO_PRODUCER): ProducerState(last_ack=456, begin=789),
    }
    assert flatten_read_through(cp) == {"foo": 111, "bar": 222}
    assert dict(cp.ack_intents) == {"baz": b"intent", "bing": b"other-intent"}
    # It encodes again, and the bytes decode to the same checkpoint.
    assert decode_checkpoint(encode_checkpoint(cp)) == cp


def test_a_span_beginning_past_the_read_through_offset_needs_no_replay() -> None:
    # Reading resumes at foo's offset 111, before the span's begin 789: every message of the
    # span is read again, so the Sequencer is seeded with no pending span (nothing before the
    # read-through offset to replay). bar's span began at 101, before its offset 222: kept.
    snapshot = to_sequencer_checkpoint(decode_checkpoint(GO_PRODUCER_ID_MAP_REGRESSION))
    assert snapshot.read_through == {"foo": 111, "bar": 222}
    assert snapshot.producers == {
        JournalProducer("bar", BAR_PRODUCER): ProducerState(last_ack=789, begin=101),
        JournalProducer("foo", FOO_PRODUCER): ProducerState(last_ack=456, begin=-1),
    }


def test_an_empty_ack_intent_as_go_writes_it() -> None:
    # gogoproto omits an empty bytes value inside a map entry: ack_intents (field 2) entry
    # {key "ns/acks"} and no value. Go decodes it as an empty intent, and so do we.
    go_bytes = bytes.fromhex("12090a07" + b"ns/acks".hex())
    cp = decode_checkpoint(go_bytes)
    assert dict(cp.ack_intents) == {"ns/acks": b""}
    # protobuf-python writes the empty value (12 00); Go decodes that as the same checkpoint.
    assert encode_checkpoint(cp) == bytes.fromhex("120b0a07" + b"ns/acks".hex() + "1200")
    assert decode_checkpoint(encode_checkpoint(cp)) == Checkpoint(ack_intents={"ns/acks": b""})
