"""Gazette message UUIDs: RFC 4122 version-1 UUIDs with repurposed clock-sequence bits.

Layout, by byte of the big-endian 16-byte UUID::

    0..4    low 32 bits of the 60-bit timestamp     (clock >> 4)
    4..6    middle 16 bits of the timestamp         (clock >> 36)
    6..8    version 1 in the high nibble, then the top 12 bits of the timestamp (clock >> 52)
    8..10   variant 0b10, then the 4-bit sequence counter (clock & 0xF), then 10 bits of flags
    10..16  ProducerID (the RFC 4122 "node")

Every publisher draws a random ProducerID, so the RFC's use of the clock sequence (telling apart
nodes that share a MAC address) is not needed; Gazette spends those bits on a finer clock and on
transaction flags instead. A reader de-duplicates by keeping the largest clock seen per producer.

Note that ``uuid.UUID`` ordering (by integer value) is *not* clock order: the low timestamp bits
come first. Compare ``get_clock`` values, never UUIDs.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable
from typing import NamedTuple, NewType
from uuid import UUID

from gazette_consumer.message.clock import CLOCK_MAX

ProducerID = NewType("ProducerID", bytes)
"""The 6-byte node field of a UUID, identifying one publisher."""

PRODUCER_ID_BYTES = 6

# RFC 4122 reserves the least-significant bit of the first node octet as the multicast bit. It is
# set on every ProducerID so that it can never collide with a real IEEE 802 MAC address.
_MULTICAST_BIT = 0x01

FLAGS_MAX = 0x3FF
"""Flags occupy the 10 least-significant bits of the clock sequence."""

NIL_UUID = UUID(int=0)
"""The all-zero UUID. A message carrying it (or no UUID at all) opted out of exactly-once."""

ZERO_PRODUCER_ID = ProducerID(bytes(PRODUCER_ID_BYTES))


class Flag(enum.IntEnum):
    """Transaction semantics of a message, carried in its UUID flags."""

    OUTSIDE_TXN = 0x0
    """Not part of a transaction: the message commits itself as soon as it is read."""
    CONTINUE_TXN = 0x1
    """Begins or continues a transaction; held until an ACK_TXN with a larger clock commits it."""
    ACK_TXN = 0x2
    """Commits the producer's CONTINUE_TXN messages with smaller clocks, and rolls back larger."""


class InvalidUUIDError(ValueError):
    """A UUID (or a part given to build one) does not follow Gazette's layout."""


class UUIDParts(NamedTuple):
    producer: ProducerID
    clock: int
    flags: int


def producer_id(raw: bytes) -> ProducerID:
    """Validate and return ``raw`` as a ProducerID."""
    if len(raw) != PRODUCER_ID_BYTES:
        raise InvalidUUIDError(
            f"producer: must be {PRODUCER_ID_BYTES} bytes, got {len(raw)} ({raw.hex()})"
        )
    return ProducerID(bytes(raw))


def new_producer_id(randbytes: Callable[[int], bytes] = os.urandom) -> ProducerID:
    """Return a random ProducerID with the multicast bit set.

    47 bits of entropy make a collision very unlikely provided each ProducerID lives long (a
    process or a shard assignment, not a request). ``randbytes`` is injectable so that tests and
    the simulation are deterministic (e.g. ``random.Random(seed).randbytes``).
    """
    raw = bytearray(randbytes(PRODUCER_ID_BYTES))
    if len(raw) != PRODUCER_ID_BYTES:
        raise InvalidUUIDError(
            f"randbytes: returned {len(raw)} bytes, expected {PRODUCER_ID_BYTES}"
        )
    raw[0] |= _MULTICAST_BIT
    return ProducerID(bytes(raw))


def build_uuid(producer: ProducerID, clock: int, flags: int) -> UUID:
    """Build the version-1 UUID of a message."""
    if len(producer) != PRODUCER_ID_BYTES:
        raise InvalidUUIDError(f"producer: must be {PRODUCER_ID_BYTES} bytes, got {len(producer)}")
    if not 0 <= clock <= CLOCK_MAX:
        raise InvalidUUIDError(f"clock: {clock} is not a uint64")
    if not 0 <= flags <= FLAGS_MAX:
        raise InvalidUUIDError(f"flags: {flags:#x} does not fit in 10 bits")

    time_low = (clock >> 4) & 0xFFFF_FFFF
    time_mid = (clock >> 36) & 0xFFFF
    time_hi_and_version = ((clock >> 52) & 0x0FFF) | 0x1000
    clock_seq = ((clock & 0xF) << 10) | flags | 0x8000
    value = (
        (time_low << 96)
        | (time_mid << 80)
        | (time_hi_and_version << 64)
        | (clock_seq << 48)
        | int.from_bytes(producer, "big")
    )
    return UUID(int=value)


def validate_uuid(u: UUID) -> None:
    """Raise InvalidUUIDError unless ``u`` is an RFC 4122 variant, version 1 UUID."""
    value = u.int
    version = (value >> 76) & 0xF
    variant = (value >> 62) & 0x3
    if variant != 0b10:
        raise InvalidUUIDError(f"uuid: {u} is not of the RFC 4122 variant")
    if version != 1:
        raise InvalidUUIDError(f"uuid: {u} has version {version}, expected 1")


def get_producer_id(u: UUID) -> ProducerID:
    """The ProducerID (node) of a Gazette UUID."""
    validate_uuid(u)
    return ProducerID(u.bytes[10:16])


def get_clock(u: UUID) -> int:
    """The clock (timestamp and sequence counter) of a Gazette UUID."""
    validate_uuid(u)
    return _clock_of(u.int)


def get_flags(u: UUID) -> int:
    """The 10 flag bits of a Gazette UUID. Values beyond Flag are possible and kept as-is."""
    validate_uuid(u)
    return (u.int >> 48) & FLAGS_MAX


def parse_uuid(u: UUID) -> UUIDParts:
    """Validate ``u`` once and return all of its parts."""
    validate_uuid(u)
    value = u.int
    return UUIDParts(
        producer=ProducerID((value & 0xFFFF_FFFF_FFFF).to_bytes(PRODUCER_ID_BYTES, "big")),
        clock=_clock_of(value),
        flags=(value >> 48) & FLAGS_MAX,
    )


def _clock_of(value: int) -> int:
    time_low = (value >> 96) & 0xFFFF_FFFF
    time_mid = (value >> 80) & 0xFFFF
    time_hi = (value >> 64) & 0x0FFF
    sequence = (value >> 58) & 0xF
    return (time_hi << 52) | (time_mid << 36) | (time_low << 4) | sequence


def uuid_low_parts(low: int) -> tuple[ProducerID, int, int] | None:
    """(ProducerID, sequence counter, flags) of a UUID's low 64 bits (``u.int & (2**64 - 1)``),
    or None if they are not of the RFC 4122 variant.

    With `uuid_high_clock`, parses a UUID in halves that repeat across messages, so that a
    reader can cache them (see `message.EnvelopeBuilder`).
    """
    if low >> 62 != 0b10:
        return None
    producer = ProducerID((low & 0xFFFF_FFFF_FFFF).to_bytes(PRODUCER_ID_BYTES, "big"))
    return producer, (low >> 58) & 0xF, (low >> 48) & FLAGS_MAX


def uuid_high_clock(mid: int) -> int | None:
    """The clock bits held by bits 64-95 of a UUID (``(u.int >> 64) & (2**32 - 1)``: time_mid,
    version, time_hi), or None if the version is not 1. The clock is this, OR the 32 bits of
    time_low (``u.int >> 96``) shifted left by 4, OR the sequence counter."""
    if (mid >> 12) & 0xF != 1:
        return None
    return (mid & 0x0FFF) << 52 | (mid >> 16) << 36
