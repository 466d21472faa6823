"""TokenBucket (append_rate.py): the bound on bytes passed on over time, bursts, unlimited rate,
reconfiguration and bad arguments, all on explicit (injected) times."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.append_rate import TokenBucket, append_burst_s_default, burst_bytes_for


def test_zero_rate_is_unlimited() -> None:
    bucket = TokenBucket(0, burst_bytes_max=0)
    assert all(bucket.reserve(1 << 30, now=0.0) == 0.0 for _ in range(10))


def test_a_full_bucket_passes_its_burst_at_once_then_delays_the_rest() -> None:
    bucket = TokenBucket(1000, burst_bytes_max=500)
    assert bucket.reserve(500, now=10.0) == 0.0
    assert bucket.reserve(250, now=10.0) == pytest.approx(0.25)
    # Honouring that delay, the next 1000 bytes wait one more second on top of it.
    assert bucket.reserve(1000, now=10.25) == pytest.approx(1.0)


def test_idle_time_refills_up_to_the_burst_only() -> None:
    bucket = TokenBucket(1000, burst_bytes_max=500)
    assert bucket.reserve(500, now=0.0) == 0.0
    # An hour idle refills 500 bytes, not 3.6 MB.
    assert bucket.reserve(500, now=3600.0) == 0.0
    assert bucket.reserve(100, now=3600.0) == pytest.approx(0.1)


def test_a_chunk_larger_than_the_burst_is_delayed_not_refused() -> None:
    bucket = TokenBucket(1000, burst_bytes_max=100)
    assert bucket.reserve(5100, now=0.0) == pytest.approx(5.0)


def test_a_clock_going_backwards_refills_nothing() -> None:
    bucket = TokenBucket(1000, burst_bytes_max=1000)
    assert bucket.reserve(1000, now=5.0) == 0.0
    assert bucket.reserve(500, now=4.0) == pytest.approx(0.5)
    # Time is still measured from 5.0: at 5.5 the debt is paid, nothing more.
    assert bucket.reserve(1, now=5.5) == pytest.approx(0.001)


def test_reconfiguring_starts_a_full_bucket_and_same_config_keeps_state() -> None:
    bucket = TokenBucket(1000, burst_bytes_max=1000)
    assert bucket.reserve(1000, now=0.0) == 0.0
    bucket.configure(1000, burst_bytes_max=1000)  # Unchanged: still empty.
    assert bucket.reserve(100, now=0.0) == pytest.approx(0.1)
    bucket.configure(2000, burst_bytes_max=2000)
    assert (bucket.rate_bytes_per_s, bucket.burst_bytes_max) == (2000, 2000)
    assert bucket.reserve(2000, now=0.0) == 0.0
    bucket.configure(0, burst_bytes_max=0)
    assert bucket.reserve(1 << 20, now=0.0) == 0.0


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: TokenBucket(-1, burst_bytes_max=0), "rate_bytes_per_s: must be >= 0 (got -1)"),
        (lambda: TokenBucket(1, burst_bytes_max=-2), "burst_bytes_max: must be >= 0 (got -2)"),
        (lambda: TokenBucket(1, burst_bytes_max=1).reserve(-3, 0.0), "size: must be >= 0"),
    ],
)
def test_bad_arguments_are_refused(make: object, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        make()  # type: ignore[operator]


def test_bad_reconfiguration_changes_nothing() -> None:
    bucket = TokenBucket(1000, burst_bytes_max=1000)
    assert bucket.reserve(1000, now=0.0) == 0.0
    with pytest.raises(ValueError):
        bucket.configure(-5, burst_bytes_max=10)
    assert (bucket.rate_bytes_per_s, bucket.burst_bytes_max) == (1000, 1000)
    assert bucket.reserve(100, now=0.0) == pytest.approx(0.1)  # Still empty.


def test_burst_bytes_for() -> None:
    assert burst_bytes_for(0) == 0
    assert burst_bytes_for(1 << 20) == int((1 << 20) * append_burst_s_default)
    assert burst_bytes_for(1, burst_s=0.001) == 1  # A limited rate always passes a byte.


@given(
    rate=st.integers(1, 1 << 20),
    burst=st.integers(1, 1 << 20),
    steps=st.lists(
        st.tuples(st.integers(0, 1 << 20), st.floats(0.0, 2.0, allow_nan=False)), max_size=40
    ),
)
def test_bytes_passed_on_never_exceed_burst_plus_rate_times_elapsed(
    rate: int, burst: int, steps: list[tuple[int, float]]
) -> None:
    """A sender that honours every delay (and may idle between chunks) passes on at most
    burst + rate * t bytes by time t after its first reservation."""
    bucket = TokenBucket(rate, burst_bytes_max=burst)
    now = start = 100.0
    passed = 0
    for size, idle_s in steps:
        now += idle_s
        now += bucket.reserve(size, now)  # Wait as told, then pass the bytes on.
        passed += size
        assert passed <= burst + rate * (now - start) + 1e-6 * (passed + 1)


@given(sizes=st.lists(st.integers(0, 1 << 16), max_size=40))
def test_an_unlimited_bucket_never_delays(sizes: list[int]) -> None:
    bucket = TokenBucket(0, burst_bytes_max=0)
    assert [bucket.reserve(size, now=0.0) for size in sizes] == [0.0] * len(sizes)
