"""The commit record of a durable spool fragment: its encoding, sans I/O.

A durable spool (spool_dir.py) keeps, next to each fragment's content file, a small *record file*
saying what of that content is committed: the fragment ([begin, end), SHA1 sum, codec), the
journal's registers as of that commit, and the fragment's first append time. It is rewritten at
every commit and roll, before the commit is acknowledged, so that a broker killed at any moment
recovers exactly its last acknowledged state (spool_recovery.py).

Torn writes. A record is written in place, so a write cut short (power loss) must never destroy
the previous record. The file therefore holds two *slots* and each record goes to the slot its
sequence number selects (seq % 2), alternating: the record being written never overwrites the
last good one. Each slot carries its sequence number, its payload length and a CRC32 over both
and the payload; recovery takes the valid slot with the greatest sequence number, and may fall
back to the other one (the previous commit) if the content does not hold what the newer one
claims.

Layout (integers little-endian)::

    header  (16 bytes)   magic "GZSR" | version u8 | 3 bytes zero | slot_bytes u32 | crc32 u32
    slot 0  (slot_bytes) seq u64 | payload_len u32 | crc32 u32 | payload | zero padding
    slot 1  (slot_bytes) likewise

    payload: first_append_time f64 (NaN: none) | fragment_len u32 | protocol.Fragment |
             registers_len u32 | protocol.LabelSet

`slot_bytes` is fixed when the file is made (the smallest power of two, at least
`slot_bytes_min`, holding the record); a later record that outgrows it is written to a new file
with larger slots, which replaces the old one by rename (spool_dir.py). Registers are normally a
few labels, so that is rare.
"""

from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass
from typing import Final

from google.protobuf.message import DecodeError

from broker.protocol import protocol_pb2 as pb

MAGIC: Final = b"GZSR"
VERSION: Final = 1
HEADER_BYTES: Final = 16
# A slot is at least one page: one pwrite of it never spans more pages than needed.
slot_bytes_min: Final = 4096
# The largest slot a record file may have: a record beyond it (registers of megabytes) is refused
# rather than grown without bound.
slot_bytes_max: Final = 1 << 24

_HEADER: Final = struct.Struct("<4sB3xII")  # magic, version, slot_bytes, crc32
_SLOT_HEAD: Final = struct.Struct("<QII")  # seq, payload_len, crc32
_F64: Final = struct.Struct("<d")
_U32: Final = struct.Struct("<I")


class RecordTooLargeError(ValueError):
    """A commit record would not fit the largest slot (`slot_bytes_max`)."""


@dataclass(frozen=True, slots=True)
class CommitRecord:
    """What a spool had committed: the fragment, the registers, the first append time."""

    fragment: pb.Fragment
    registers: pb.LabelSet
    first_append_time: float | None

    @property
    def begin(self) -> int:
        return self.fragment.begin

    @property
    def end(self) -> int:
        return self.fragment.end

    @property
    def length(self) -> int:
        return self.fragment.end - self.fragment.begin


@dataclass(frozen=True, slots=True)
class SlotRecord:
    """A valid slot: its sequence number and record."""

    seq: int
    record: CommitRecord


def encode_payload(record: CommitRecord) -> bytes:
    fat = math.nan if record.first_append_time is None else record.first_append_time
    fragment = record.fragment.SerializeToString()
    registers = record.registers.SerializeToString()
    return b"".join(
        (_F64.pack(fat), _U32.pack(len(fragment)), fragment, _U32.pack(len(registers)), registers)
    )


def decode_payload(payload: bytes) -> CommitRecord | None:
    """The record of a payload, or None if it is malformed."""
    try:
        (fat,) = _F64.unpack_from(payload, 0)
        at = _F64.size
        (fragment_len,) = _U32.unpack_from(payload, at)
        at += _U32.size
        fragment = pb.Fragment.FromString(payload[at : at + fragment_len])
        at += fragment_len
        (registers_len,) = _U32.unpack_from(payload, at)
        at += _U32.size
        if at + registers_len != len(payload):
            return None
        registers = pb.LabelSet.FromString(payload[at:])
    except (struct.error, DecodeError):
        return None
    if not fragment.begin <= fragment.end:
        return None
    return CommitRecord(fragment, registers, None if math.isnan(fat) else fat)


def slot_bytes_for(payload_len: int) -> int:
    """The slot size for a record of `payload_len` bytes; raises RecordTooLargeError."""
    need = _SLOT_HEAD.size + payload_len
    size = slot_bytes_min
    while size < need:
        size *= 2
    if size > slot_bytes_max:
        raise RecordTooLargeError(
            f"commit record of {payload_len} bytes exceeds the {slot_bytes_max}-byte slot limit"
        )
    return size


def encode_header(slot_bytes: int) -> bytes:
    head = _HEADER.pack(MAGIC, VERSION, slot_bytes, 0)[:12]
    return head + _U32.pack(zlib.crc32(head))


def decode_header(data: bytes) -> int | None:
    """The slot size a record file's header declares, or None if it is not a valid header."""
    if len(data) < HEADER_BYTES:
        return None
    magic, version, slot_bytes, crc = _HEADER.unpack_from(data, 0)
    if magic != MAGIC or version != VERSION or crc != zlib.crc32(data[:12]):
        return None
    if not slot_bytes_min <= slot_bytes <= slot_bytes_max or slot_bytes & (slot_bytes - 1):
        return None
    return int(slot_bytes)


def slot_offset(seq: int, slot_bytes: int) -> int:
    """Where the record of sequence number `seq` goes: slots alternate."""
    return HEADER_BYTES + (seq % 2) * slot_bytes


def encode_slot(payload: bytes, seq: int) -> bytes:
    """One slot's bytes (without padding) for `payload` at sequence number `seq` (>= 1)."""
    if seq < 1:
        raise ValueError(f"seq: must be >= 1 (got {seq})")
    head = struct.pack("<QI", seq, len(payload))
    return head + _U32.pack(zlib.crc32(payload, zlib.crc32(head))) + payload


def decode_slot(data: bytes) -> SlotRecord | None:
    """The record a slot holds, or None if it is empty, torn or malformed."""
    if len(data) < _SLOT_HEAD.size:
        return None
    seq, payload_len, crc = _SLOT_HEAD.unpack_from(data, 0)
    end = _SLOT_HEAD.size + payload_len
    if seq < 1 or end > len(data):
        return None
    payload = data[_SLOT_HEAD.size : end]
    if crc != zlib.crc32(payload, zlib.crc32(data[:12])):
        return None
    record = decode_payload(payload)
    return None if record is None else SlotRecord(seq, record)


def decode_file(data: bytes) -> list[SlotRecord]:
    """The valid slots of a record file's bytes, newest (greatest seq) first."""
    slot_bytes = decode_header(data)
    if slot_bytes is None:
        return []
    found: list[SlotRecord] = []
    for index in (0, 1):
        at = HEADER_BYTES + index * slot_bytes
        slot = decode_slot(data[at : at + slot_bytes])
        # A slot must sit where its seq says, or it was copied by something other than us.
        if slot is not None and slot.seq % 2 == index:
            found.append(slot)
    return sorted(found, key=lambda s: s.seq, reverse=True)
