"""Clock: the sequence of facts from Gazette's TestUUIDClock, plus monotonicity properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gazette_consumer.message.clock import (
    CLOCK_MAX,
    G1582_NS100,
    TICK,
    Clock,
    ClockError,
    clock_from_unix_nanos,
    clock_to_unix_nanos,
)


def unix(seconds: int, nanos: int) -> int:
    return seconds * 1_000_000_000 + nanos


def test_gazette_clock_sequence() -> None:
    # Gazette's TestUUIDClock as of its "Clock.Tick() increments by 1 microsecond" (2025).
    clock = Clock()

    # Each tick produces a new value, one microsecond (160 units) on.
    assert clock.tick() == 160
    assert clock.tick() == 320
    assert TICK == 160

    clock.update(unix(12, 300))

    # The representation is precise to 100 ns.
    assert clock == Clock.from_unix(12, 399)
    assert clock.as_unix_nanos() == unix(12, 300)
    assert clock < Clock.from_unix(12, 400)
    assert clock > Clock.from_unix(12, 299)

    # A tick moves the clock one microsecond on.
    assert clock == Clock.from_unix(12, 300)
    clock.tick()
    assert clock.as_unix_nanos() == unix(12, 1300)
    assert clock > Clock.from_unix(12, 1299)
    assert clock < Clock.from_unix(12, 1400)

    # Update never moves the clock backward.
    clock.update(unix(11, 100))
    assert clock.as_unix_nanos() == unix(12, 1300)

    # Moving to a later timestamp resets the sequence bits.
    clock.update(unix(12, 5000))
    assert clock == Clock.from_unix(12, 5000)
    assert clock.as_unix_nanos() == unix(12, 5000)


def test_update_never_decreases_sequence_bits() -> None:
    # Clocks of messages from producers that ticked by one carry sequence bits: a clock holding
    # them is never moved back to the same timestamp with a zero counter.
    clock = Clock(Clock.from_unix(12, 400).value | 0x3)
    clock.update(unix(12, 400))
    assert clock.value == Clock.from_unix(12, 400).value | 0x3
    assert clock.tick() == (Clock.from_unix(12, 400).value | 0x3) + TICK


def test_clock_value_encoding() -> None:
    assert clock_from_unix_nanos(0) == G1582_NS100 << 4
    assert clock_from_unix_nanos(unix(12, 399)) == (120_000_003 + G1582_NS100) << 4
    assert clock_to_unix_nanos(((120_000_003 + G1582_NS100) << 4) | 0xF) == unix(12, 300)
    # The RFC 4122 epoch itself is clock 0.
    assert clock_from_unix_nanos(-G1582_NS100 * 100) == 0
    # Sub-100 ns precision truncates toward zero, as Go's integer division does.
    assert clock_from_unix_nanos(-150) == (G1582_NS100 - 1) << 4


def test_clock_rejects_out_of_range_times_and_values() -> None:
    with pytest.raises(ClockError, match="outside the range"):
        clock_from_unix_nanos(-G1582_NS100 * 100 - 100)
    with pytest.raises(ClockError, match="outside the range"):
        Clock.from_unix_nanos(((CLOCK_MAX >> 4) + 1 - G1582_NS100) * 100)
    with pytest.raises(ClockError, match="is not a uint64"):
        Clock(-1)
    with pytest.raises(ClockError, match="is not a uint64"):
        clock_to_unix_nanos(CLOCK_MAX + 1)


def test_clock_refuses_to_tick_past_uint64() -> None:
    clock = Clock(CLOCK_MAX - TICK)
    assert clock.tick() == CLOCK_MAX
    with pytest.raises(ClockError, match="cannot tick"):
        clock.tick()
    assert clock.value == CLOCK_MAX
    clock = Clock(CLOCK_MAX - TICK + 1)
    with pytest.raises(ClockError, match="cannot tick"):
        clock.tick()
    assert clock.value == CLOCK_MAX - TICK + 1


@given(
    start=st.integers(min_value=0, max_value=4_000_000_000_000_000_000),
    ops=st.lists(
        st.one_of(
            st.none(),  # A tick.
            st.integers(min_value=0, max_value=4_000_000_000_000_000_000),  # An update.
        ),
        max_size=50,
    ),
)
def test_ticks_strictly_increase_and_updates_never_decrease(
    start: int, ops: list[int | None]
) -> None:
    clock = Clock.from_unix_nanos(start)
    last_tick = -1
    for op in ops:
        before = clock.value
        if op is None:
            value = clock.tick()
            assert value == before + TICK
            assert value > last_tick
            last_tick = value
        else:
            clock.update(op)
            assert clock.value == max(before, clock_from_unix_nanos(op))
