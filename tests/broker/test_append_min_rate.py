"""MinRateCredit (append_rate.py): the minimum-rate policy of an Append stream, sans-IO on
explicit times. Bursty and steady clients that sustain the minimum rate over the window are
admitted; stalled ones are cut within the window, however much they sent before."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.append_rate import MinRateCredit, min_rate_burst_s_default
from broker.append_receive import flow_control_burst_s_default, min_append_rate_bytes_per_s_default

RATE = min_append_rate_bytes_per_s_default  # 64 KiB/s.
MiB = 1 << 20


def cut_at(
    credit: MinRateCredit, chunks: Sequence[tuple[float, int]], start: float = 0.0
) -> float | None:
    """Play ``chunks`` ((arrival time, size), in time order) against ``credit`` as the broker's
    reader does: before each wait, the credit says how long the client has; a chunk arriving
    later than that is never read. Returns when the client was cut, or None if admitted."""
    now = start
    for arrival, size in chunks:
        deadline = now + credit.wait_s(now)
        if credit.wait_s(now) <= 0 or arrival > deadline:
            return deadline
        credit.on_chunk(size, arrival)
        now = arrival
    return None


def every(gap_s: float, size: int, count: int, first_at: float = 0.0) -> list[tuple[float, int]]:
    return [(first_at + index * gap_s, size) for index in range(count)]


def test_the_default_window_is_several_seconds() -> None:
    assert flow_control_burst_s_default == min_rate_burst_s_default >= 3.0


def test_a_bursty_client_of_1_mib_every_1_5_s_is_admitted() -> None:
    credit = MinRateCredit(RATE, burst_s=min_rate_burst_s_default)
    assert cut_at(credit, every(1.5, MiB, 200)) is None


def test_a_one_second_window_cut_the_same_client() -> None:
    """The old policy: a credit of one second of the minimum rate, however far ahead the client
    is. The same client is cut one second after its first burst."""
    credit = MinRateCredit(RATE, burst_s=1.0)
    assert cut_at(credit, every(1.5, MiB, 200)) == pytest.approx(1.0)


def test_a_steady_client_at_the_minimum_rate_is_admitted() -> None:
    credit = MinRateCredit(RATE, burst_s=min_rate_burst_s_default)
    # 64 KiB each second, and 1 KiB every 1/64 s: exactly the minimum rate, for ten minutes.
    assert cut_at(credit, every(1.0, RATE, 600)) is None
    credit = MinRateCredit(RATE, burst_s=min_rate_burst_s_default)
    assert cut_at(credit, every(1 / 64, 1024, 64 * 60)) is None


def test_bursts_as_far_apart_as_the_window_are_admitted() -> None:
    window = min_rate_burst_s_default
    credit = MinRateCredit(RATE, burst_s=window)
    # Exactly the window's worth of the minimum rate, once per (almost) window.
    assert cut_at(credit, every(window * 0.99, int(RATE * window), 1000)) is None


def test_a_client_below_the_minimum_rate_is_cut() -> None:
    credit = MinRateCredit(RATE, burst_s=min_rate_burst_s_default)
    # 90% of the minimum rate: the credit runs down by 10% of a second's worth each second.
    cut = cut_at(credit, every(1.0, int(RATE * 0.9), 1000))
    assert cut is not None and cut < 60


def test_a_stall_is_cut_within_the_window_however_much_was_sent() -> None:
    window = 2.0
    credit = MinRateCredit(RATE, burst_s=window)
    credit.on_chunk(100 * MiB, 0.0)  # 1600 s of the minimum rate, in one burst.
    assert credit.wait_s(0.0) == pytest.approx(window)
    assert credit.wait_s(1.5) == pytest.approx(0.5)
    assert credit.wait_s(2.0) == 0.0
    assert credit.wait_s(100.0) == 0.0


def test_a_client_that_never_sends_is_cut_after_the_window() -> None:
    credit = MinRateCredit(RATE, burst_s=3.0)
    assert credit.wait_s(10.0) == pytest.approx(3.0)  # The clock starts at the first wait.
    assert cut_at(credit, [(13.5, 1)], start=10.0) == pytest.approx(13.0)


def test_time_the_broker_held_the_stream_is_not_charged() -> None:
    credit = MinRateCredit(RATE, burst_s=1.0)
    credit.on_chunk(RATE, 0.0)
    credit.resume(30.0)  # Throttled for 30 s by the journal's maximum rate.
    assert credit.wait_s(30.0) == pytest.approx(1.0)
    assert credit.wait_s(30.25) == pytest.approx(0.75)


def test_a_clock_that_goes_backwards_drains_nothing() -> None:
    credit = MinRateCredit(RATE, burst_s=1.0)
    assert credit.wait_s(5.0) == pytest.approx(1.0)
    assert credit.wait_s(4.0) == pytest.approx(1.0)
    assert credit.wait_s(5.5) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("rate", "burst_s", "size"),
    [(0, 1.0, 0), (-1, 1.0, 0), (1, 0.0, 0), (1, -1.0, 0), (1, 1.0, -1)],
)
def test_bad_arguments_are_refused(rate: int, burst_s: float, size: int) -> None:
    with pytest.raises(ValueError, match="must be"):
        MinRateCredit(rate, burst_s=burst_s).on_chunk(size, 0.0)


@settings(max_examples=300)
@given(
    window=st.floats(0.1, 10.0),
    gaps=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=60),
    slack=st.integers(1, 1 << 16),
)
def test_any_client_keeping_up_over_the_window_is_admitted(
    window: float, gaps: list[float], slack: int
) -> None:
    """Chunks at most a window apart, each carrying at least the minimum rate's worth of the
    gap after it (plus some slack): never cut, whatever the pattern."""
    rate = 1000
    times = [0.0]
    for gap in gaps:
        times.append(times[-1] + gap * window)
    chunks = [
        (at, int(rate * (following - at)) + slack)
        for at, following in zip(times, [*times[1:], times[-1] + window * 0.5], strict=True)
    ]
    credit = MinRateCredit(rate, burst_s=window)
    assert cut_at(credit, chunks) is None
    # And the credit never covers more than one window of stall.
    assert credit.wait_s(times[-1]) <= window + 1e-9


def test_a_chunk_exactly_one_window_after_a_full_credit_is_admitted() -> None:
    """Hypothesis found it: with the credit kept in bytes, rate * window / rate rounded below
    the window, and a client on the boundary was cut."""
    window = 2.2920130744700393
    credit = MinRateCredit(1000, burst_s=window)
    assert cut_at(credit, [(0.0, 2293), (window, 1147)]) is None
