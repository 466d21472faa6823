"""How reads are cut into partitions at fragment boundaries (sans-IO): by default one per core,
none smaller than the default's floor, none larger than maxPartitionBytes."""

from __future__ import annotations

from itertools import pairwise

import pytest

from spark_integration.fragment_plan import (
    auto_partition_bytes_min,
    auto_partitions,
    split_ranges,
    target_bytes,
)
from spark_integration.read_options import max_partition_bytes_default, parse_read_options
from spark_integration.sources import FragmentRef

MIB = 1 << 20


def fragments(total: int, size: int) -> list[FragmentRef]:
    return [FragmentRef(b, min(total, b + size), b"") for b in range(0, total, size)]


def cut(total: int, fragment_bytes: int, options: dict[str, str]) -> list[tuple[int, int]]:
    opts = parse_read_options({"broker": "localhost:8080", "journals": "plan/journal", **options})
    target = target_bytes(total, opts.max_partition_bytes, opts.min_partitions)
    return split_ranges(fragments(total, fragment_bytes), 0, total, target)


def check_cover(ranges: list[tuple[int, int]], total: int, fragment_bytes: int) -> None:
    assert ranges[0][0] == 0 and ranges[-1][1] == total
    for (_, hi), (lo, _) in pairwise(ranges):
        assert hi == lo and lo % fragment_bytes == 0  # Contiguous, cut at fragment boundaries.


def test_a_large_journal_is_read_by_one_partition_per_core_by_default() -> None:
    total = 100 * MIB  # Below maxPartitionBytes: that bound alone would make one partition.
    ranges = cut(total, MIB, {})
    check_cover(ranges, total, MIB)
    cores = auto_partitions()
    target = max(auto_partition_bytes_min, -(-total // cores))
    assert len(ranges) >= min(2, cores)
    assert abs(len(ranges) - -(-total // target)) <= 1
    assert max(hi - lo for lo, hi in ranges) <= max_partition_bytes_default


def test_small_journals_are_not_cut_finer_than_the_default_floor() -> None:
    total = auto_partition_bytes_min + MIB
    ranges = cut(total, MIB, {})
    check_cover(ranges, total, MIB)
    assert all(hi - lo >= auto_partition_bytes_min for lo, hi in ranges[:-1])
    assert len(ranges) <= 2


@pytest.mark.parametrize("wanted", [1, 3, 8])
def test_min_partitions_is_honoured(wanted: int) -> None:
    total = 64 * MIB
    ranges = cut(total, MIB, {"minPartitions": str(wanted)})
    check_cover(ranges, total, MIB)
    assert len(ranges) == wanted


def test_max_partition_bytes_bounds_every_partition() -> None:
    total = 64 * MIB
    ranges = cut(total, MIB, {"maxPartitionBytes": str(4 * MIB), "minPartitions": "1"})
    check_cover(ranges, total, MIB)
    assert len(ranges) == 16
