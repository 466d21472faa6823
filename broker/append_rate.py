"""A journal's maximum append rate (JournalSpec.max_append_rate): a token bucket over bytes.

The primary of a journal admits its appended content at no more than ``max_append_rate`` bytes
per second, averaged over time, with bursts of at most ``burst_bytes_max``. Content is never
refused for going too fast: the broker *delays* reading the client's stream, and gRPC flow
control slows the client down. One bucket exists per journal (the replica holds it), so that
the bound holds across appends, not only within one.

The bucket starts full. Reserving ``size`` bytes takes them from it, possibly into debt; the
answer is how long the caller must wait before passing them on, which is exactly how long the
bucket needs to refill to zero. Hence, for any run of reservations each honoured after its
delay, the bytes passed on by time ``t`` after the first are at most ``burst + rate * t``.

A rate of zero means unlimited: nothing is ever delayed. Sans-IO: the caller passes the time
(any monotonic clock, in seconds) and does the waiting.
"""

from __future__ import annotations

from typing import Final

# How many seconds' worth of the rate a journal may append at once, after it was idle.
append_burst_s_default: Final = 1.0


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
