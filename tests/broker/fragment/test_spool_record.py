"""Commit records of durable spools (spool_record.py), sans I/O: encoding, the two alternating
slots, and what survives a torn or corrupt slot or header."""

from __future__ import annotations

import pytest

from broker.fragment.naming import content_sum
from broker.fragment.spool_record import (
    HEADER_BYTES,
    CommitRecord,
    RecordTooLargeError,
    decode_file,
    decode_header,
    decode_payload,
    decode_slot,
    encode_header,
    encode_payload,
    encode_slot,
    slot_bytes_for,
    slot_bytes_max,
    slot_bytes_min,
    slot_offset,
)
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set

JOURNAL = "a/journal"


def record(
    end: int, *, registers: pb.LabelSet | None = None, fat: float | None = 1.5
) -> CommitRecord:
    content = bytes(range(end % 256)) * (end // 256 + 1)
    fragment = pb.Fragment(
        journal=JOURNAL, begin=0, end=end, sum=content_sum(content[:end]), compression_codec=pb.GZIP
    )
    return CommitRecord(fragment, registers or label_set([("owner", "a")]), fat)


def file_bytes(*records: tuple[int, CommitRecord], slot_bytes: int = slot_bytes_min) -> bytearray:
    """A record file holding `records` (seq, record), each written where its seq says."""
    data = bytearray(encode_header(slot_bytes)) + bytearray(2 * slot_bytes)
    for seq, rec in records:
        slot = encode_slot(encode_payload(rec), seq)
        at = slot_offset(seq, slot_bytes)
        data[at : at + len(slot)] = slot
    return data


def test_payload_round_trips_every_field() -> None:
    rec = record(100, fat=1_700_000_000.25)
    assert decode_payload(encode_payload(rec)) == rec
    none = record(0, registers=pb.LabelSet(), fat=None)
    assert decode_payload(encode_payload(none)) == none


def test_slots_alternate_and_the_newest_comes_first() -> None:
    first, second, third = record(10), record(20), record(30)
    data = file_bytes((1, first), (2, second))
    assert [(s.seq, s.record.end) for s in decode_file(bytes(data))] == [(2, 20), (1, 10)]
    # The third write lands on the first's slot, never on the last good one.
    assert slot_offset(3, slot_bytes_min) == slot_offset(1, slot_bytes_min)
    data = file_bytes((1, first), (2, second), (3, third))
    assert [(s.seq, s.record.end) for s in decode_file(bytes(data))] == [(3, 30), (2, 20)]


@pytest.mark.parametrize("cut", [1, 12, 20, 60])
def test_a_torn_newest_slot_leaves_the_previous_record(cut: int) -> None:
    data = file_bytes((1, record(10)), (2, record(20)))
    torn = slot_offset(2, slot_bytes_min)
    slot = encode_slot(encode_payload(record(30)), 3)
    # Seq 3 half written over seq 1's slot: its CRC fails, seq 2 stands.
    at = slot_offset(3, slot_bytes_min)
    data[at : at + cut] = slot[:cut]
    assert [s.seq for s in decode_file(bytes(data))] == [2]
    # Flipping one payload bit of the newest makes the older one the only valid slot.
    data = file_bytes((1, record(10)), (2, record(20)))
    data[torn + 30] ^= 0x01
    assert [(s.seq, s.record.end) for s in decode_file(bytes(data))] == [(1, 10)]


def test_a_corrupt_header_or_empty_file_has_no_record() -> None:
    data = file_bytes((1, record(10)))
    assert decode_header(bytes(data)) == slot_bytes_min
    data[0] ^= 0xFF
    assert decode_header(bytes(data)) is None and decode_file(bytes(data)) == []
    assert decode_file(b"") == [] and decode_file(bytes(HEADER_BYTES)) == []


def test_a_slot_found_in_the_wrong_place_is_refused() -> None:
    data = file_bytes()
    slot = encode_slot(encode_payload(record(10)), 2)  # Seq 2 belongs in slot 0.
    at = slot_offset(1, slot_bytes_min)
    data[at : at + len(slot)] = slot
    assert decode_file(bytes(data)) == []


def test_malformed_slots_and_payloads_decode_to_nothing() -> None:
    assert decode_slot(b"") is None
    assert decode_slot(bytes(64)) is None  # Seq 0: never written.
    assert decode_payload(b"\x00" * 3) is None
    good = encode_payload(record(10))
    assert decode_payload(good + b"x") is None  # Trailing garbage.
    with pytest.raises(ValueError, match="seq"):
        encode_slot(good, 0)


def test_slot_size_grows_in_powers_of_two_and_is_bounded() -> None:
    assert slot_bytes_for(10) == slot_bytes_min
    assert slot_bytes_for(slot_bytes_min) == 2 * slot_bytes_min
    big = label_set([(f"label-{i:05d}", "v" * 200) for i in range(100)])
    payload = encode_payload(record(10, registers=big))
    assert slot_bytes_for(len(payload)) >= len(payload)
    with pytest.raises(RecordTooLargeError):
        slot_bytes_for(slot_bytes_max)
