"""The Clock of Gazette message UUIDs.

A clock value is a uint64: its 60 most-significant bits are an RFC 4122 timestamp (100 ns units
since 1582-10-15), and its 4 least-significant bits are a sequence counter. Together, timestamp
and counter totally order the UUIDs of one producer, which is what read-committed readers use to
spot duplicates and roll-backs.

Each tick advances the clock by one microsecond (``TICK``: 10 units of 100 ns, shifted past the
4 counter bits), as Gazette's Clock.Tick has done since 2025, so that a publisher given the same
start and the same sequence mints the same UUIDs as Go's, and UUID times stay meaningful to
systems with microsecond precision. A producer is thereby bounded to a million messages per
second before its clock runs ahead of wall time (harmless: only monotonicity matters). Clocks of
older messages, whose producers ticked by one, need nothing special: every comparison is of
whole clock values, and a tick of either size moves a producer's clock strictly forward.

Clock values are plain ``int`` everywhere (UUID parsing, the sequencer, checkpoints) because they
are compared constantly; ``Clock`` is the mutable generator a publisher owns. Wall time is passed
in by the caller rather than read here, so tests and the simulation control it.
"""

from __future__ import annotations

from dataclasses import dataclass

# Interval between 1582-10-15 (the RFC 4122 epoch) and 1970-01-01 (the Unix epoch), in units of
# 100 ns. Part of the wire format: every Gazette implementation must agree on it.
G1582_NS100 = 122_192_928_000_000_000

# A clock is an unsigned 64-bit integer on the wire (checkpoints carry it as a fixed64).
CLOCK_MAX = (1 << 64) - 1

# Number of low bits of a clock that hold the sequence counter rather than the timestamp.
CLOCK_SEQUENCE_BITS = 4

# What one tick adds: one microsecond, i.e. 10 units of 100 ns above the sequence counter bits.
TICK = 10 << CLOCK_SEQUENCE_BITS

_NS_PER_UNIT = 100


class ClockError(ValueError):
    """A clock value, or a time to derive one from, is out of the representable range."""


def clock_from_unix_nanos(unix_nanos: int) -> int:
    """Return the clock value of a wall time, with a zero sequence counter.

    Sub-100 ns precision is truncated toward zero (as Go's integer division does), so that two
    implementations given the same time always derive the same clock.
    """
    units = abs(unix_nanos) // _NS_PER_UNIT
    if unix_nanos < 0:
        units = -units
    value = (units + G1582_NS100) << CLOCK_SEQUENCE_BITS
    if value < 0 or value > CLOCK_MAX:
        raise ClockError(
            f"unix_nanos: {unix_nanos} is outside the range a UUID clock can represent"
        )
    return value


def clock_span(seconds: float) -> int:
    """A duration in clock units (Gazette's `Clock((d / 100) << 4)` for a duration d in ns):
    what a producer horizon is measured in."""
    if seconds < 0:
        raise ClockError(f"seconds: {seconds} is negative")
    return (int(seconds * 1e9) // _NS_PER_UNIT) << CLOCK_SEQUENCE_BITS


def clock_to_unix_nanos(clock: int) -> int:
    """Return the wall time of a clock value in Unix nanoseconds, dropping the sequence counter."""
    check_clock(clock)
    return ((clock >> CLOCK_SEQUENCE_BITS) - G1582_NS100) * _NS_PER_UNIT


def check_clock(clock: int) -> None:
    """Raise ClockError unless ``clock`` is a uint64."""
    if not 0 <= clock <= CLOCK_MAX:
        raise ClockError(f"clock: {clock} is not a uint64")


@dataclass(order=True, slots=True)
class Clock:
    """A strictly monotonic source of clock values, owned by one publisher.

    Comparisons order Clocks by value, so ``Clock.from_unix(12, 300) < Clock.from_unix(12, 400)``.
    """

    value: int = 0

    def __post_init__(self) -> None:
        check_clock(self.value)

    @classmethod
    def from_unix(cls, seconds: int, nanos: int = 0) -> Clock:
        """Return a Clock set to the given Unix time (seconds plus nanoseconds)."""
        return cls(clock_from_unix_nanos(seconds * 1_000_000_000 + nanos))

    @classmethod
    def from_unix_nanos(cls, unix_nanos: int) -> Clock:
        return cls(clock_from_unix_nanos(unix_nanos))

    def tick(self) -> int:
        """Advance by one microsecond (``TICK``) and return the new value.

        Under bursts of more than one message per microsecond the clock runs ahead of wall time;
        ``update`` then leaves it alone until wall time catches up. That is harmless: only
        monotonicity matters to readers.
        """
        if self.value > CLOCK_MAX - TICK:
            raise ClockError(f"clock: {self.value} cannot tick past the uint64 range")
        self.value += TICK
        return self.value

    def update(self, unix_nanos: int) -> None:
        """Move the clock forward to a wall-time observation, never backward.

        An observation behind the current value (a wall clock stepped back, or a clock that ran
        ahead through ticks) changes nothing, because a smaller clock would make this producer's
        next messages look like duplicates to every reader. An observation ahead resets the
        sequence counter to zero.
        """
        observed = clock_from_unix_nanos(unix_nanos)
        if observed > self.value:
            self.value = observed

    def as_unix_nanos(self) -> int:
        """The wall time of the current value, in Unix nanoseconds (100 ns precision)."""
        return clock_to_unix_nanos(self.value)
