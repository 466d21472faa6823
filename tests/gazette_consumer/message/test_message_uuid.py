"""Gazette message UUIDs: layout facts from Gazette's uuid_test.go, plus round-trip properties."""

from __future__ import annotations

import random
import uuid as stdlib_uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gazette_consumer.message.clock import CLOCK_MAX, G1582_NS100, Clock
from gazette_consumer.message.uuid import (
    FLAGS_MAX,
    NIL_UUID,
    Flag,
    InvalidUUIDError,
    ProducerID,
    build_uuid,
    get_clock,
    get_flags,
    get_producer_id,
    new_producer_id,
    parse_uuid,
    producer_id,
)

PRODUCER = ProducerID(bytes([0x01, 0x02, 0x03, 0x04, 0x05, 0x06]))

# Gazette's TestUUIDBuilding fixture: a clock at Unix (1567304621, 981273734), ticked twice (one
# microsecond each, as Gazette's Clock.Tick since 2025), so that it uses the timestamp's full bit
# range; flags 0b1010101010.
EXPECT_SECS, EXPECT_NANOS = 1567304621, 981273734
EXPECT_FLAGS = 682


def fixture_clock() -> int:
    clock = Clock.from_unix(EXPECT_SECS, EXPECT_NANOS)
    clock.tick()
    clock.tick()
    return clock.value


def test_flag_values_are_gazettes() -> None:
    assert (Flag.OUTSIDE_TXN, Flag.CONTINUE_TXN, Flag.ACK_TXN) == (0, 1, 2)
    assert FLAGS_MAX == 0x3FF


def test_build_uuid_byte_exact_vector() -> None:
    clock = fixture_clock()
    # 100 ns units since 1582-10-15 (two ticks: 20 of them), the sequence counter left at 0.
    assert clock == (EXPECT_SECS * 10_000_000 + EXPECT_NANOS // 100 + 20 + G1582_NS100) << 4

    u = build_uuid(PRODUCER, clock, EXPECT_FLAGS)

    assert str(u) == "83fc2f95-cc5f-11e9-82aa-010203040506"
    assert u.bytes == bytes.fromhex("83fc2f95cc5f11e982aa010203040506")
    # Cross-check the layout with the stdlib's independent RFC 4122 field accessors.
    assert u.version == 1
    assert u.variant == stdlib_uuid.RFC_4122
    assert u.node == int.from_bytes(PRODUCER, "big")
    assert u.time == clock >> 4
    assert u.clock_seq == EXPECT_FLAGS
    # The stdlib extracts our time point: Go's test expects 981275700 ns (981273734 rounded to
    # 100 ns, plus the two microseconds of the ticks).
    unix_nanos = (u.time - G1582_NS100) * 100
    assert divmod(unix_nanos, 1_000_000_000) == (EXPECT_SECS, 981275700)


def test_build_uuid_places_the_sequence_counter() -> None:
    # A clock with sequence bits (a producer of before 2025 ticked by one): they go to the
    # clock sequence, above the flags.
    clock = fixture_clock() | 2
    u = build_uuid(PRODUCER, clock, EXPECT_FLAGS)
    assert str(u) == "83fc2f95-cc5f-11e9-8aaa-010203040506"
    assert u.time == clock >> 4
    assert u.clock_seq == (2 << 10) | EXPECT_FLAGS
    assert get_clock(u) == clock


def test_build_uuid_parses_back() -> None:
    clock = fixture_clock()
    u = build_uuid(PRODUCER, clock, EXPECT_FLAGS)
    assert get_clock(u) == clock
    assert get_producer_id(u) == PRODUCER
    assert get_flags(u) == EXPECT_FLAGS
    assert parse_uuid(u) == (PRODUCER, clock, EXPECT_FLAGS)


def test_build_uuid_of_zero_clock_and_max_clock() -> None:
    assert str(build_uuid(PRODUCER, 0, Flag.ACK_TXN)) == "00000000-0000-1000-8002-010203040506"
    top = build_uuid(PRODUCER, CLOCK_MAX, FLAGS_MAX)
    assert str(top) == "ffffffff-ffff-1fff-bfff-010203040506"
    assert get_clock(top) == CLOCK_MAX


@pytest.mark.parametrize(
    ("producer", "clock", "flags", "message"),
    [
        (ProducerID(b"\x01\x02\x03"), 1, 0, "producer: must be 6 bytes"),
        (PRODUCER, -1, 0, "clock: -1 is not a uint64"),
        (PRODUCER, CLOCK_MAX + 1, 0, "is not a uint64"),
        (PRODUCER, 1, 0x400, "flags: 0x400 does not fit in 10 bits"),
        (PRODUCER, 1, -1, "does not fit in 10 bits"),
    ],
)
def test_build_uuid_rejects_bad_parts(
    producer: ProducerID, clock: int, flags: int, message: str
) -> None:
    with pytest.raises(InvalidUUIDError, match=message):
        build_uuid(producer, clock, flags)


@pytest.mark.parametrize(
    ("u", "message"),
    [
        (stdlib_uuid.UUID("9f1e0a52-36c2-4e4f-8d4c-6fd26b1c1a1e"), "has version 4, expected 1"),
        (NIL_UUID, "is not of the RFC 4122 variant"),
        # Version 1, but the Microsoft variant (0b110) in the clock sequence's top bits.
        (stdlib_uuid.UUID("83fc2f81-cc5f-11e9-caaa-010203040506"), "RFC 4122 variant"),
    ],
)
def test_parsing_rejects_non_gazette_uuids(u: stdlib_uuid.UUID, message: str) -> None:
    for parse in (get_clock, get_flags, get_producer_id, parse_uuid):
        with pytest.raises(InvalidUUIDError, match=message):
            parse(u)


def test_producer_id_validates_length() -> None:
    assert producer_id(b"abcdef") == b"abcdef"
    with pytest.raises(InvalidUUIDError, match="must be 6 bytes, got 7"):
        producer_id(b"abcdefg")


def test_new_producer_id_sets_multicast_bit_and_uses_injected_randomness() -> None:
    a = new_producer_id(random.Random(42).randbytes)
    b = new_producer_id(random.Random(42).randbytes)
    assert a == b
    assert len(a) == 6
    assert a[0] & 0x01
    assert new_producer_id(lambda n: bytes(n)) == b"\x01\x00\x00\x00\x00\x00"
    with pytest.raises(InvalidUUIDError, match="randbytes: returned 5 bytes"):
        new_producer_id(lambda n: bytes(n - 1))


def test_new_producer_ids_are_unique() -> None:
    # Gazette's sanity check that the default randomness is strong.
    assert len({new_producer_id() for _ in range(1000)}) == 1000


def test_uuid_ordering_is_not_clock_ordering() -> None:
    # Why callers must compare get_clock(), never UUIDs: the low timestamp bits come first.
    earlier = build_uuid(PRODUCER, 0xF_FFFF_FFF0, 0)
    later = build_uuid(PRODUCER, 0x10_0000_0000, 0)
    assert get_clock(earlier) < get_clock(later)
    assert earlier > later


@given(
    producer=st.binary(min_size=6, max_size=6),
    clock=st.integers(min_value=0, max_value=CLOCK_MAX),
    flags=st.integers(min_value=0, max_value=FLAGS_MAX),
)
def test_build_then_parse_round_trips(producer: bytes, clock: int, flags: int) -> None:
    u = build_uuid(ProducerID(producer), clock, flags)
    assert (u.version, u.variant) == (1, stdlib_uuid.RFC_4122)
    assert parse_uuid(u) == (producer, clock, flags)
    assert (get_producer_id(u), get_clock(u), get_flags(u)) == (producer, clock, flags)
    # Round-trips through the canonical string form too (that is what JSON and CSV carry).
    assert parse_uuid(stdlib_uuid.UUID(str(u))) == (producer, clock, flags)
