"""The Publisher's sequencing, without I/O: its fast UUID construction matches `build_uuid`,
its clock is strictly monotonic and follows wall time forward only, and bad arguments are
refused."""

from __future__ import annotations

import pickle
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.client.append_service import AppendService
from broker.client.route_cache import JournalClient
from gazette_consumer.message.clock import (
    CLOCK_MAX,
    TICK,
    Clock,
    ClockError,
    clock_from_unix_nanos,
)
from gazette_consumer.message.framing import FramingConfigError
from gazette_consumer.message.publisher import Publisher, _make_uuid, _uuid_int
from gazette_consumer.message.uuid import (
    FLAGS_MAX,
    Flag,
    InvalidUUIDError,
    ProducerID,
    build_uuid,
    new_producer_id,
    parse_uuid,
)


def unused_appender() -> AppendService:
    # Sequencing never touches the appender; a service that is never entered does nothing.
    return AppendService(JournalClient("127.0.0.1:1"))


@given(
    producer=st.binary(min_size=6, max_size=6),
    clock=st.integers(0, CLOCK_MAX),
    flags=st.integers(0, FLAGS_MAX),
)
def test_fast_uuids_equal_build_uuid(producer: bytes, clock: int, flags: int) -> None:
    expected = build_uuid(ProducerID(producer), clock, flags)
    fast = _make_uuid(_uuid_int(int.from_bytes(producer, "big"), clock, flags))
    assert fast == expected and hash(fast) == hash(expected) and str(fast) == str(expected)
    assert fast.is_safe is expected.is_safe
    assert pickle.loads(pickle.dumps(fast)) == expected
    assert parse_uuid(fast) == (producer, clock, flags)


def test_fast_uuids_are_real_uuids() -> None:
    fast = _make_uuid(_uuid_int(0x0123456789AB, 12345, 2))
    assert type(fast) is uuid.UUID and fast.version == 1 and fast.variant == uuid.RFC_4122
    with pytest.raises(TypeError):
        fast.int = 5  # type: ignore[misc]  # Immutable, like any UUID.


def test_sequence_uuids_are_strictly_increasing_with_the_given_flags() -> None:
    producer = new_producer_id()
    publisher = Publisher(unused_appender(), Clock.from_unix(1_700_000_000), producer_id=producer)
    parts = [
        parse_uuid(publisher.sequence_uuid(flags))
        for flags in (Flag.OUTSIDE_TXN, Flag.CONTINUE_TXN, Flag.ACK_TXN, 0)
    ]
    assert [p.flags for p in parts] == [0, 1, 2, 0]
    assert all(p.producer == producer == publisher.producer_id for p in parts)
    # One microsecond apart (Gazette's Clock.Tick).
    assert [p.clock for p in parts] == [parts[0].clock + i * TICK for i in range(4)]
    for bad in (3, 0x400, -1):
        with pytest.raises(ValueError, match="flags"):
            publisher.sequence_uuid(bad)


def test_a_given_clock_moves_only_when_told_and_never_backward() -> None:
    clock = Clock.from_unix(1_700_000_000)
    publisher = Publisher(unused_appender(), clock)
    first = parse_uuid(publisher.sequence_uuid()).clock
    assert first == clock.value == Clock.from_unix(1_700_000_000).value + TICK
    publisher.update_clock(1_600_000_000 * 10**9)  # Behind: ignored.
    assert parse_uuid(publisher.sequence_uuid()).clock == first + TICK
    publisher.update_clock(1_800_000_000 * 10**9)  # Ahead: the clock jumps to it.
    assert (
        parse_uuid(publisher.sequence_uuid()).clock == clock_from_unix_nanos(1_800 * 10**15) + TICK
    )
    assert publisher.clock is clock


def test_an_own_clock_follows_wall_time_forward_only() -> None:
    now = [1_700_000_000 * 10**9]
    publisher = Publisher(unused_appender(), time_ns=lambda: now[0])
    a = parse_uuid(publisher.sequence_uuid()).clock
    assert a == clock_from_unix_nanos(now[0]) + TICK
    b = parse_uuid(publisher.sequence_uuid()).clock  # Same wall time: the sequence ticks.
    now[0] -= 10**9  # Wall time steps back: clocks still increase.
    c = parse_uuid(publisher.sequence_uuid()).clock
    now[0] += 5 * 10**9
    d = parse_uuid(publisher.sequence_uuid()).clock
    assert a < b < c < d and d == clock_from_unix_nanos(now[0]) + TICK


def test_bad_producers_and_clocks_are_refused() -> None:
    with pytest.raises(InvalidUUIDError, match="producer"):
        Publisher(unused_appender(), producer_id=ProducerID(b"short"))
    publisher = Publisher(unused_appender(), Clock(CLOCK_MAX))
    with pytest.raises(ClockError):
        publisher.sequence_uuid()
    assert Publisher(unused_appender()).producer_id != Publisher(unused_appender()).producer_id
    for bad in (0, 1 << 32):
        with pytest.raises(FramingConfigError, match="message_bytes_max"):
            Publisher(unused_appender(), message_bytes_max=bad)


class _Recorded:
    """A message that keeps every UUID set on it."""

    def __init__(self) -> None:
        self.uuids: list[uuid.UUID] = []

    def set_uuid(self, value: uuid.UUID) -> None:
        self.uuids.append(value)


class _NoFrame:
    def marshal(self, message: object) -> bytes:
        return b""


@given(
    producer=st.binary(min_size=6, max_size=6),
    steps=st.lists(
        st.tuples(
            # Clock jumps, from a tick to past the 2^36 epochs where the UUID's fixed part
            # changes, and sequence bits now and then.
            st.one_of(
                st.integers(0, 3 * TICK),
                st.integers(0, 1 << 40),
                st.integers(0, 0xF),
            ),
            st.sampled_from([int(Flag.OUTSIDE_TXN), int(Flag.CONTINUE_TXN), int(Flag.ACK_TXN)]),
        ),
        min_size=1,
        max_size=40,
    ),
    start=st.integers(0, CLOCK_MAX >> 1),
)
def test_sequenced_uuids_equal_build_uuid_across_epochs_and_flags(
    producer: bytes, steps: list[tuple[int, int]], start: int
) -> None:
    # The publisher builds each UUID from a constant cached per clock epoch and flags: every
    # one must still be exactly build_uuid of its clock.
    clock = Clock(start)
    publisher = Publisher(unused_appender(), clock, producer_id=ProducerID(producer))
    message = _Recorded()
    for jump, flags in steps:
        clock.value = min(clock.value + jump, CLOCK_MAX - TICK)
        publisher._sequence(message, _NoFrame(), flags)  # type: ignore[arg-type]
        assert message.uuids[-1] == build_uuid(ProducerID(producer), clock.value, flags)
