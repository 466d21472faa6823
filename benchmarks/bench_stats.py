"""Order statistics the benchmarks share: a distribution-free interval of a median."""

from __future__ import annotations

import math

CONFIDENCE = 0.9


def median_interval(
    values: list[float], confidence: float = CONFIDENCE
) -> tuple[float, float] | None:
    """A distribution-free confidence interval of the median of `values` (order statistics:
    the median lies between the j-th smallest and the j-th largest with probability >=
    `confidence`, for the largest such j, whatever the distribution). None if there are too
    few values for one (fewer than 5 at 90%)."""
    ordered, n = sorted(values), len(values)
    tail = (1 - confidence) / 2
    # P(fewer than j of n values fall below the median) = P(Binomial(n, 1/2) < j).
    below, j = 0.0, 0
    while j < n // 2 and below + math.comb(n, j) / 2**n <= tail:
        below += math.comb(n, j) / 2**n
        j += 1
    if j == 0:
        return None
    return ordered[j - 1], ordered[n - j]
