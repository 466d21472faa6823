"""Checkpoints: Gazette's wire bytes (computed by hand from consumer.proto's field numbers),
validation with field paths, conversion to and from Sequencer snapshots, comparing, merging."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gazette_consumer.checkpoint import (
    Checkpoint,
    CheckpointDecodeError,
    CheckpointRegressionError,
    InvalidCheckpointError,
    build_checkpoint,
    decode_checkpoint,
    encode_checkpoint,
    equivalent,
    flatten_producer_states,
    flatten_read_through,
    from_sequencer_checkpoint,
    merge,
    to_sequencer_checkpoint,
    validate_checkpoint,
)
from gazette_consumer.sequencer.types import JournalProducer, ProducerState, SequencerCheckpoint

Entry = Checkpoint.Source.ProducerEntry
State = Checkpoint.ProducerState

P1 = bytes([1, 2, 3, 4, 5, 6])
P2 = bytes([9, 9, 9, 9, 9, 9])

# {sources: {"ns/a": {read_through: 300, producers: [{id: P1, state: {last_ack: 0x0102,
# begin: -1}}]}}, ack_intents: {"ns/b": "ACK"}}, field by field. A tag byte is
# (field number << 3) | wire type, with wire types 0 varint, 1 fixed64, 2 length-delimited.
# A map field is a repeated entry message {1: key, 2: value}.
HAND_BUILT_WIRE = bytes.fromhex(
    # Checkpoint.sources (field 1, LEN) = 0x0a; entry of 0x2b = 43 bytes:
    "0a 2b"
    #   entry.key (1, LEN) = 0x0a, 4 bytes "ns/a"
    "   0a 04 6e732f61"
    #   entry.value (2, LEN) = 0x12, a Source of 0x23 = 35 bytes:
    "   12 23"
    #     Source.read_through (1, VARINT) = 0x08; 300 = 0b10_0101100 -> ac 02 (low 7 bits first)
    "     08 ac02"
    #     Source.producers (2, LEN) = 0x12, a ProducerEntry of 0x1e = 30 bytes:
    "     12 1e"
    #       ProducerEntry.id (1, LEN) = 0x0a, 6 bytes
    "       0a 06 010203040506"
    #       ProducerEntry.state (2, LEN) = 0x12, a ProducerState of 0x14 = 20 bytes:
    "       12 14"
    #         ProducerState.last_ack (1, I64) = 0x09, 8 bytes little-endian
    "         09 0201000000000000"
    #         ProducerState.begin (2, VARINT) = 0x10; -1 as int64 is 2^64-1: ten bytes
    "         10 ffffffffffffffffff01"
    # Checkpoint.ack_intents (field 2, LEN) = 0x12; entry of 0x0b = 11 bytes:
    "12 0b"
    #   entry.key = 0a 04 "ns/b"; entry.value (2, LEN) = 12 03 "ACK"
    "   0a 04 6e732f62 12 03 41434b"
)


def hand_built() -> Checkpoint:
    return build_checkpoint(
        read_through={"ns/a": 300},
        producers={JournalProducer("ns/a", P1): ProducerState(last_ack=0x0102, begin=-1)},
        ack_intents={"ns/b": b"ACK"},
    )


# --- Wire bytes ---------------------------------------------------------------------------------


def test_encoding_is_byte_exact_for_a_hand_built_checkpoint() -> None:
    assert encode_checkpoint(hand_built()) == HAND_BUILT_WIRE
    assert decode_checkpoint(HAND_BUILT_WIRE) == hand_built()


def test_zero_states_and_empty_sources_are_written_as_go_writes_them() -> None:
    # gogoproto's non-nullable ProducerEntry.state is always written, even empty (12 00); a
    # map value is always written too, so an empty Source is "12 00" within its entry.
    cp = build_checkpoint(
        read_through={"ns/a": 1, "ns/c": 0},
        producers={JournalProducer("ns/a", P1): ProducerState(last_ack=0, begin=0)},
        ack_intents={},
    )
    want = bytes.fromhex(
        # sources entry "ns/a": Source{read_through: 1, producers: [{id: P1, state: {}}]}
        "0a 16  0a 04 6e732f61  12 0e  08 01  12 0a  0a 06 010203040506  12 00"
        # sources entry "ns/c": empty Source, value still present
        "0a 08  0a 04 6e732f63  12 00"
    )
    assert encode_checkpoint(cp) == want


def test_go_ordering_decodes_and_re_encodes_canonically() -> None:
    # Go writes map entries in random order and producers in its own order. Here: the intent
    # before the source, producers P2 then P1.
    go_wire = bytes.fromhex(
        "12 0b  0a 04 6e732f62  12 03 41434b"
        "0a 24  0a 04 6e732f61  12 1c  08 64"
        "  12 0c  0a 06 090909090909  12 02 10 05"
        "  12 0a  0a 06 010203040506  12 00"
    )
    cp = decode_checkpoint(go_wire)
    assert [bytes(e.id) for e in cp.sources["ns/a"].producers] == [P1, P2]
    canonical = encode_checkpoint(cp)
    assert canonical != go_wire
    assert canonical.startswith(bytes.fromhex("0a 24"))  # Sources first, producers sorted.
    assert equivalent(decode_checkpoint(canonical), cp)


def test_empty_bytes_are_the_empty_checkpoint() -> None:
    assert decode_checkpoint(b"") == Checkpoint()
    assert encode_checkpoint(Checkpoint()) == b""


@pytest.mark.parametrize("garbage", [b"\xff", b"\x0a\x05ab", b"\x0b"])
def test_undecodable_bytes_are_a_typed_error(garbage: bytes) -> None:
    with pytest.raises(CheckpointDecodeError, match=r"^checkpoint: not a consumer\.Checkpoint"):
        decode_checkpoint(garbage)


def test_decoded_checkpoints_are_validated() -> None:
    # Well-formed protobuf, but a 2-byte producer ID.
    wire = bytes.fromhex("0a 12  0a 04 6e732f61  12 0a  08 01  12 06  0a 02 0102  12 00")
    with pytest.raises(
        InvalidCheckpointError,
        match=r"^checkpoint\.sources\[ns/a\]\.producers\[0\]\.id: must be 6 bytes \(got 2\)$",
    ):
        decode_checkpoint(wire)


def test_encode_does_not_modify_its_argument() -> None:
    cp = Checkpoint()
    source = cp.sources["ns/a"]
    source.read_through = 10
    source.producers.add(id=P2)
    source.producers.add(id=P1)
    before = cp.SerializeToString()
    encode_checkpoint(cp)
    assert cp.SerializeToString() == before


# --- Validation ---------------------------------------------------------------------------------


def _cp_with_entry(entry: Entry, read_through: int = 100) -> Checkpoint:
    return Checkpoint(
        sources={"ns/a": Checkpoint.Source(read_through=read_through, producers=[entry])}
    )


@pytest.mark.parametrize(
    ("cp", "error"),
    [
        (
            Checkpoint(sources={"": Checkpoint.Source()}),
            r"checkpoint\.sources\[\]: journal name must not be empty",
        ),
        (
            Checkpoint(sources={"ns/a": Checkpoint.Source(read_through=-1)}),
            r"checkpoint\.sources\[ns/a\]\.read_through: must be in \[0, 9223372036854775807\] "
            r"\(got -1\)",
        ),
        (
            _cp_with_entry(Entry(id=b"12345")),
            r"checkpoint\.sources\[ns/a\]\.producers\[0\]\.id: must be 6 bytes \(got 5\)",
        ),
        (
            Checkpoint(
                sources={
                    "ns/a": Checkpoint.Source(
                        read_through=5, producers=[Entry(id=P1), Entry(id=P1)]
                    )
                }
            ),
            r"checkpoint\.sources\[ns/a\]\.producers\[1\]\.id: duplicate producer 010203040506",
        ),
        (
            _cp_with_entry(Entry(id=P1, state=State(begin=-2))),
            r"checkpoint\.sources\[ns/a\]\.producers\[0\]\.state\.begin: must be in "
            r"\[-1, 9223372036854775807\] \(got -2\)",
        ),
        (
            Checkpoint(ack_intents={"": b"ACK"}),
            r"checkpoint\.ack_intents\[\]: journal name must not be empty",
        ),
    ],
    ids=[
        "journal",
        "read_through",
        "producer-id",
        "duplicate-producer",
        "begin-negative",
        "intent-journal",
    ],
)
def test_validation_names_the_field(cp: Checkpoint, error: str) -> None:
    with pytest.raises(InvalidCheckpointError, match=rf"^{error}"):
        validate_checkpoint(cp)
    with pytest.raises(InvalidCheckpointError, match=rf"^{error}"):
        encode_checkpoint(cp)


def test_valid_edge_values_pass() -> None:
    validate_checkpoint(
        _cp_with_entry(Entry(id=P1, state=State(last_ack=2**64 - 1, begin=99)), read_through=100)
    )
    # As Go accepts them (test_checkpoint_go_fixtures.py): a span beginning at or past the
    # read-through offset, an empty ACK intent, journal names shorter than a journal's may be.
    validate_checkpoint(_cp_with_entry(Entry(id=P1, state=State(begin=100))))
    validate_checkpoint(_cp_with_entry(Entry(id=P1, state=State(begin=2**63 - 1))))
    validate_checkpoint(Checkpoint(sources={"x": Checkpoint.Source()}, ack_intents={"y": b""}))
    validate_checkpoint(Checkpoint(sources={"ns/a": Checkpoint.Source(read_through=2**63 - 1)}))


def test_a_producer_needs_its_journals_offset() -> None:
    with pytest.raises(
        InvalidCheckpointError,
        match=r"^checkpoint\.sources\[ns/z\]: producer 010203040506 has no read-through offset",
    ):
        build_checkpoint(
            read_through={"ns/a": 1},
            producers={JournalProducer("ns/z", P1): ProducerState(last_ack=1)},
            ack_intents={},
        )


# --- Sequencer snapshots ------------------------------------------------------------------------


def test_sequencer_snapshot_round_trip() -> None:
    snapshot = SequencerCheckpoint(
        read_through={"ns/a": 300, "ns/b": 7},
        producers={
            JournalProducer("ns/a", P2): ProducerState(last_ack=5, begin=250),
            JournalProducer("ns/a", P1): ProducerState(last_ack=0x0102),
            JournalProducer("ns/b", P1): ProducerState(last_ack=9),
        },
    )
    cp = from_sequencer_checkpoint(snapshot, {"ns/out": b"ACK"})
    assert [bytes(e.id) for e in cp.sources["ns/a"].producers] == [P1, P2]
    assert dict(cp.ack_intents) == {"ns/out": b"ACK"}

    back = to_sequencer_checkpoint(decode_checkpoint(encode_checkpoint(cp)))
    assert back == snapshot
    assert flatten_read_through(cp) == {"ns/a": 300, "ns/b": 7}
    assert flatten_producer_states(cp) == dict(snapshot.producers)


def test_to_sequencer_checkpoint_validates() -> None:
    with pytest.raises(InvalidCheckpointError, match=r"producers\[0\]\.id: must be 6 bytes"):
        to_sequencer_checkpoint(_cp_with_entry(Entry(id=b"")))


# --- Comparing and merging ----------------------------------------------------------------------


def test_equivalent_ignores_producer_order_but_not_values() -> None:
    a = _cp_with_entry(Entry(id=P1, state=State(last_ack=1)))
    a.sources["ns/a"].producers.add(id=P2, state=State(last_ack=2))
    b = _cp_with_entry(Entry(id=P2, state=State(last_ack=2)))
    b.sources["ns/a"].producers.add(id=P1, state=State(last_ack=1))
    assert a != b  # Protobuf compares repeated fields in order...
    assert equivalent(a, b)  # ...but they hold the same checkpoint.

    b.sources["ns/a"].producers[0].state.last_ack = 3
    assert not equivalent(a, b)
    assert not equivalent(hand_built(), Checkpoint())
    c = hand_built()
    c.ack_intents["ns/b"] = b"ACK2"
    assert not equivalent(hand_built(), c)


def test_merge_layers_later_over_earlier() -> None:
    earlier = build_checkpoint(
        read_through={"ns/a": 100, "ns/b": 50},
        producers={
            JournalProducer("ns/a", P1): ProducerState(last_ack=1),
            JournalProducer("ns/b", P2): ProducerState(last_ack=2, begin=40),
        },
        ack_intents={"ns/out": b"ACK-1"},
    )
    later = build_checkpoint(
        read_through={"ns/a": 200, "ns/c": 5},
        producers={JournalProducer("ns/a", P2): ProducerState(last_ack=3)},
        ack_intents={"ns/out2": b"ACK-2"},
    )
    want = build_checkpoint(
        read_through={"ns/a": 200, "ns/b": 50, "ns/c": 5},
        producers={
            # ns/a is later's snapshot, whole: P1's older state does not carry over.
            JournalProducer("ns/a", P2): ProducerState(last_ack=3),
            JournalProducer("ns/b", P2): ProducerState(last_ack=2, begin=40),
        },
        ack_intents={"ns/out2": b"ACK-2"},
    )
    assert equivalent(merge(earlier, later), want)
    assert equivalent(merge(Checkpoint(), later), later)
    # merge does not modify its arguments.
    assert flatten_read_through(earlier) == {"ns/a": 100, "ns/b": 50}


def test_merge_refuses_a_regression() -> None:
    earlier = build_checkpoint({"ns/a": 100}, {}, {})
    later = build_checkpoint({"ns/a": 99}, {}, {})
    with pytest.raises(
        CheckpointRegressionError,
        match=r"^checkpoint\.sources\[ns/a\]\.read_through: must not move backwards "
        r"\(from 100 to 99\)$",
    ):
        merge(earlier, later)


# --- Properties ---------------------------------------------------------------------------------

journals = st.sampled_from(["ns/a", "ns/b", "ns/c/d", "ns/e;meta"])
producers = st.binary(min_size=6, max_size=6)


@st.composite
def checkpoints(draw: st.DrawFn) -> Checkpoint:
    read_through = draw(st.dictionaries(journals, st.integers(0, 2**63 - 1), max_size=4))
    states: dict[JournalProducer, ProducerState] = {}
    for journal, offset in read_through.items():
        for producer in draw(st.lists(producers, max_size=4, unique=True)):
            begin = draw(st.just(-1) | st.integers(0, offset - 1)) if offset else -1
            states[JournalProducer(journal, producer)] = ProducerState(
                last_ack=draw(st.integers(0, 2**64 - 1)), begin=begin
            )
    intents = draw(st.dictionaries(journals, st.binary(min_size=1, max_size=16), max_size=3))
    return build_checkpoint(read_through, states, intents)


@given(checkpoints(), st.randoms())
def test_encoding_round_trips_and_is_canonical(cp: Checkpoint, rng: random.Random) -> None:
    wire = encode_checkpoint(cp)
    decoded = decode_checkpoint(wire)
    assert equivalent(decoded, cp)
    assert encode_checkpoint(decoded) == wire

    # Shuffling producers (as a Go writer may order them) changes nothing once encoded.
    shuffled = Checkpoint()
    shuffled.CopyFrom(cp)
    for source in shuffled.sources.values():
        entries = [Entry(id=e.id, state=e.state) for e in source.producers]
        rng.shuffle(entries)
        del source.producers[:]
        source.producers.extend(entries)
    assert equivalent(shuffled, cp)
    assert encode_checkpoint(shuffled) == wire


@given(checkpoints(), checkpoints())
def test_merge_keeps_every_journal(earlier: Checkpoint, later: Checkpoint) -> None:
    offsets = flatten_read_through(earlier)
    if any(later.sources[j].read_through < offsets[j] for j in later.sources if j in offsets):
        with pytest.raises(CheckpointRegressionError):
            merge(earlier, later)
        return
    merged = merge(earlier, later)
    validate_checkpoint(merged)
    assert set(merged.sources) == set(earlier.sources) | set(later.sources)
    assert dict(merged.ack_intents) == dict(later.ack_intents)
    for journal, source in merged.sources.items():
        origin = later if journal in later.sources else earlier
        assert source == origin.sources[journal]
