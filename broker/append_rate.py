"""Append flow control: a journal's maximum rate, and each client's minimum rate.

Both are token buckets over bytes, sans-IO: the caller passes the time (any monotonic clock, in
seconds) and does the waiting.

Maximum rate (`TokenBucket`, JournalSpec.max_append_rate): a token bucket over bytes.

The primary of a journal admits its appended content at no more than ``max_append_rate`` bytes
per second, averaged over time, with bursts of at most ``burst_bytes_max``. Content is never
refused for going too fast: the broker *delays* reading the client's stream, and gRPC flow
control slows the client down. One bucket exists per journal (the replica holds it), so that
the bound holds across appends, not only within one.

The bucket starts full. Reserving ``size`` bytes takes them from it, possibly into debt; the
answer is how long the caller must wait before passing them on, which is exactly how long the
bucket needs to refill to zero. Hence, for any run of reservations each honoured after its
delay, the bytes passed on by time ``t`` after the first are at most ``burst + rate * t``.

A rate of zero means unlimited: nothing is ever delayed.

Minimum rate (`MinRateCredit`, the broker's --min-append-rate): while an append holds its
journal's pipeline, every other append of the journal waits, so a client that stalls must be
cut. The client's *credit* is a bucket of capacity ``min_rate * burst_s`` bytes, full when
the stream starts: it drains at the minimum rate while the broker waits for the client, each
chunk received refills it by its size (up to the capacity), and the append is aborted when it
runs dry. So:

- a client that sends at least ``min_rate * burst_s`` bytes in every window of ``burst_s``
  seconds is never cut, whether it streams steadily or in bursts up to ``burst_s`` apart (the
  default window is several seconds: a client sending 1 MiB every 1.5 s, ten times the default
  minimum rate, is admitted);
- a stalled client is cut at most ``burst_s`` after its last chunk, however much it sent before:
  the credit is capped, so a large burst cannot buy an unbounded stall of the journal.
"""

from __future__ import annotations

from typing import Final

# How many seconds' worth of the rate a journal may append at once, after it was idle.
append_burst_s_default: Final = 1.0
# The minimum rate's window: a client may go this long without sending, if it keeps up with the
# minimum rate over the window. It bounds how long a stalled client holds its journal.
min_rate_burst_s_default: Final = 5.0


class TokenBucket:
    """See the module docstring. ``rate_bytes_per_s`` 0 means unlimited."""

    __slots__ = ("_burst_bytes_max", "_rate", "_tokens", "_updated_at")

    def __init__(self, rate_bytes_per_s: int = 0, *, burst_bytes_max: int = 0) -> None:
        self._rate = 0
        self._burst_bytes_max = 0
        self._tokens = 0.0
        self._updated_at: float | None = None
        self.configure(rate_bytes_per_s, burst_bytes_max=burst_bytes_max)

    @property
    def rate_bytes_per_s(self) -> int:
        return self._rate

    @property
    def burst_bytes_max(self) -> int:
        return self._burst_bytes_max

    def configure(self, rate_bytes_per_s: int, *, burst_bytes_max: int) -> None:
        """Change the rate and burst (the journal's spec changed). A new limit starts with a
        full bucket; an unchanged one keeps its state."""
        if rate_bytes_per_s < 0:
            raise ValueError(f"rate_bytes_per_s: must be >= 0 (got {rate_bytes_per_s})")
        if burst_bytes_max < 0:
            raise ValueError(f"burst_bytes_max: must be >= 0 (got {burst_bytes_max})")
        if (rate_bytes_per_s, burst_bytes_max) == (self._rate, self._burst_bytes_max):
            return
        self._rate = rate_bytes_per_s
        self._burst_bytes_max = burst_bytes_max
        self._tokens = float(burst_bytes_max)
        self._updated_at = None

    def reserve(self, size: int, now: float) -> float:
        """Take ``size`` bytes at time ``now``; return the seconds to wait before passing them
        on (0.0 if none, and always 0.0 when unlimited)."""
        if size < 0:
            raise ValueError(f"size: must be >= 0 (got {size})")
        if self._rate == 0:
            return 0.0
        if self._updated_at is not None and now > self._updated_at:
            refill = (now - self._updated_at) * self._rate
            self._tokens = min(float(self._burst_bytes_max), self._tokens + refill)
        if self._updated_at is None or now > self._updated_at:
            # A clock that went backwards refills nothing, and is not taken as the new time.
            self._updated_at = now
        self._tokens -= size
        if self._tokens >= 0:
            return 0.0
        return -self._tokens / self._rate


def burst_bytes_for(rate_bytes_per_s: int, burst_s: float = append_burst_s_default) -> int:
    """The burst bound of a rate: ``burst_s`` seconds of it (at least one byte if limited)."""
    if rate_bytes_per_s <= 0:
        return 0
    return max(1, int(rate_bytes_per_s * burst_s))


class MinRateCredit:
    """A client's credit under the minimum rate (see the module docstring). Times are seconds
    of a monotonic clock; the first call starts the clock."""

    # The credit is kept in seconds of the minimum rate, not bytes: a full credit is then
    # exactly `burst_s`, and a chunk arriving exactly one window after the credit was full is
    # admitted (bytes * rate / rate loses the last bit of the window to rounding).
    __slots__ = ("_at", "_burst_s", "_credit_s", "_rate")

    def __init__(self, min_rate_bytes_per_s: int, *, burst_s: float) -> None:
        if min_rate_bytes_per_s <= 0 or burst_s <= 0:
            raise ValueError(
                "min_rate_bytes_per_s and burst_s: must be > 0"
                f" (got {min_rate_bytes_per_s}, {burst_s})"
            )
        self._rate = float(min_rate_bytes_per_s)
        self._burst_s = float(burst_s)
        self._credit_s = self._burst_s
        self._at: float | None = None

    @property
    def credit_bytes(self) -> float:
        return self._credit_s * self._rate

    def _drain_to(self, now: float) -> None:
        if self._at is not None and now > self._at:
            self._credit_s = max(0.0, self._credit_s - (now - self._at))
        if self._at is None or now > self._at:
            # A clock that went backwards drains nothing, and is not taken as the new time.
            self._at = now

    def wait_s(self, now: float) -> float:
        """Seconds from ``now`` the client has to deliver its next chunk; 0.0 means its credit
        is gone, and the append must be cut."""
        self._drain_to(now)
        return self._credit_s

    def on_chunk(self, size: int, now: float) -> None:
        """A chunk of ``size`` bytes arrived at ``now``."""
        if size < 0:
            raise ValueError(f"size: must be >= 0 (got {size})")
        self._drain_to(now)
        self._credit_s = min(self._burst_s, self._credit_s + size / self._rate)

    def resume(self, now: float) -> None:
        """The broker held the stream until ``now`` (to honour a maximum rate): that time was
        the broker's, not the client's, and drains nothing."""
        if self._at is None or now > self._at:
            self._at = now
