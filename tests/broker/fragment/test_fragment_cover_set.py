"""CoverSet: Gazette's add / lookup / difference cases, and properties against a brute-force model."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.fragment.cover_set import CoverSet, FragmentRangeError, covers


@dataclass(frozen=True)
class Frag:
    begin: int
    end: int
    tag: str = ""


def ranges(s: CoverSet[Frag]) -> list[tuple[int, int]]:
    return [(f.begin, f.end) for f in s]


def build(*spans: tuple[int, int]) -> CoverSet[Frag]:
    s: CoverSet[Frag] = CoverSet()
    for b, e in spans:
        assert s.add(Frag(b, e))
    return s


@pytest.mark.parametrize(
    ("adds", "expect"),
    [
        # Appends at the end, including overlapping and adjacent ones.
        ([(100, 200), (200, 300), (201, 301)], [(100, 200), (200, 300), (201, 301)]),
        # A newcomer covering a run at the end replaces the run.
        ([(100, 200), (200, 300), (300, 400), (400, 500), (150, 500)], [(100, 200), (150, 500)]),
        ([(100, 200), (200, 300), (199, 300)], [(100, 200), (199, 300)]),
        ([(100, 200), (200, 300), (200, 301)], [(100, 200), (200, 301)]),
        # ... in the middle.
        (
            [(100, 200), (200, 300), (300, 400), (400, 500), (150, 450)],
            [(100, 200), (150, 450), (400, 500)],
        ),
        ([(100, 200), (200, 300), (300, 400), (150, 350)], [(100, 200), (150, 350), (300, 400)]),
        # Inserted into a gap, exactly filling it or not.
        ([(100, 200), (300, 400), (200, 300)], [(100, 200), (200, 300), (300, 400)]),
        ([(100, 200), (300, 400), (201, 299)], [(100, 200), (201, 299), (300, 400)]),
        # ... at the beginning.
        ([(100, 200), (200, 300), (300, 400), (100, 300)], [(100, 300), (300, 400)]),
        ([(100, 200), (200, 300), (300, 400), (99, 200)], [(99, 200), (200, 300), (300, 400)]),
        ([(200, 300), (300, 400), (199, 200)], [(199, 200), (200, 300), (300, 400)]),
        # Overlapping fragmentations of the same offsets.
        (
            [
                (100, 150), (149, 201), (200, 250), (250, 300), (299, 351), (350, 400),
                (200, 300), (300, 400), (100, 200),
            ],
            [(100, 200), (149, 201), (200, 300), (299, 351), (300, 400)],
        ),
    ],
)  # fmt: skip
def test_add(adds: list[tuple[int, int]], expect: list[tuple[int, int]]) -> None:
    assert ranges(build(*adds)) == expect


def test_add_of_a_covered_fragment_changes_nothing_but_equal_ranges_replace() -> None:
    s = build((100, 200), (200, 300), (300, 400))
    for b, e in [(101, 200), (100, 199), (201, 300), (200, 299), (301, 400), (150, 150)]:
        assert not s.add(Frag(b, e, "covered"))
    assert all(f.tag == "" for f in s)

    # An equal range is taken: it carries the newer value (e.g. now persisted).
    assert s.add(Frag(200, 300, "persisted"))
    assert ranges(s) == [(100, 200), (200, 300), (300, 400)]
    assert s[1].tag == "persisted"


def test_empty_fragments() -> None:
    s = build((100, 100))
    assert ranges(s) == [(100, 100)]
    assert s.add(Frag(100, 100, "again"))  # Equal range: replaced.
    assert s[0].tag == "again"
    assert s.add(Frag(100, 200))
    assert ranges(s) == [(100, 200)]
    assert not s.add(Frag(200, 200))  # The point at its end is covered.
    assert not s.add(Frag(150, 150))


def test_parsed_names_with_multiple_overlaps() -> None:
    # Ranges of real fragment names of one journal, as listed from a store, in listing order.
    s: CoverSet[Frag] = CoverSet()
    adds = [
        (0, 0x400A8D41, True),
        (0x400A8D41, 0x595722D7, True),
        (0x400A8D41, 0x7A3FB5EE, True),  # Replaces the previous one.
        (0x400A8D41, 0x7AF92E59, True),  # And again.
        (0x595722D7, 0x7AF92FB4, True),
        (0x7A3FB5EE, 0x7AF92FB4, False),  # Covered by the previous one.
        (0x7AF92E59, 0x7AF92E59, False),  # An empty fragment at a covered point.
    ]
    for b, e, added in adds:
        assert s.add(Frag(b, e)) == added
    assert ranges(s) == [(0, 0x400A8D41), (0x400A8D41, 0x7AF92E59), (0x595722D7, 0x7AF92FB4)]


def test_offsets() -> None:
    s: CoverSet[Frag] = CoverSet()
    assert (s.begin_offset, s.end_offset) == (0, 0)
    s.add(Frag(100, 150))
    assert (s.begin_offset, s.end_offset) == (100, 150)
    s.add(Frag(140, 250))
    assert (s.begin_offset, s.end_offset) == (100, 250)
    s.add(Frag(50, 100))
    assert (s.begin_offset, s.end_offset) == (50, 250)


def test_longest_overlapping() -> None:
    s = build((100, 200), (149, 201), (200, 300), (299, 351), (300, 400), (500, 600))
    cases = [
        (0, 0, False), (100, 0, True), (148, 0, True), (149, 1, True), (199, 1, True),
        (200, 2, True), (298, 2, True), (299, 3, True), (300, 4, True), (350, 4, True),
        (399, 4, True), (400, 5, False), (401, 5, False), (499, 5, False), (500, 5, True),
        (599, 5, True), (600, 6, False),
    ]  # fmt: skip
    for offset, ind, found in cases:
        assert s.longest_overlapping_index(offset) == (ind, found), offset
        frag, found2 = s.longest_overlapping(offset)
        assert found2 == found
        assert frag == (s[ind] if ind < len(s) else None)


def test_difference() -> None:
    b = build((100, 200), (150, 225), (225, 250), (250, 300), (301, 400))
    a = build(
        (99, 105),  # Begins before b.
        (100, 110),  # Covered by one fragment of b.
        (110, 120),
        (130, 210),  # Covered by two.
        (150, 225),  # Exactly matched.
        (151, 300),  # Covered by three.
        (152, 301),  # Not covered: b has a one-byte gap at 300.
        (300, 350),  # Not covered, same gap.
        (301, 360),  # Covered.
        (360, 401),  # Runs past b.
        (400, 450),  # Wholly outside b.
    )
    assert ranges(a.difference(b)) == [(99, 105), (152, 301), (300, 350), (360, 401), (400, 450)]
    assert ranges(a) == ranges(build(*ranges(a)))  # Unchanged.


@pytest.mark.parametrize(("b", "e"), [(10, 9), (-1, 5)])
def test_invalid_ranges_are_rejected_and_change_nothing(b: int, e: int) -> None:
    s = build((0, 5))
    with pytest.raises(FragmentRangeError, match="begin <= end"):
        s.add(Frag(b, e))
    assert ranges(s) == [(0, 5)]


# --- Properties -------------------------------------------------------------------------------

OFFSET_MAX = 60
spans = st.tuples(st.integers(0, OFFSET_MAX), st.integers(0, 12)).map(
    lambda t: Frag(t[0], t[0] + t[1])
)


def offsets_of(frags: list[Frag]) -> set[int]:
    return {o for f in frags for o in range(f.begin, f.end)}


@given(adds=st.lists(spans, max_size=30))
def test_properties_after_any_sequence_of_adds(adds: list[Frag]) -> None:
    s: CoverSet[Frag] = CoverSet()
    for f in adds:
        kept_before = list(s)
        covered = any(covers(k, f) and (k.begin, k.end) != (f.begin, f.end) for k in kept_before)
        assert s.add(f) == (not covered)
    kept = list(s)

    # No kept fragment is covered by another, and order is strict in begin and end.
    for i, x in enumerate(kept):
        for j, y in enumerate(kept):
            assert i == j or not covers(x, y)
    assert all(x.begin < y.begin and x.end < y.end for x, y in itertools.pairwise(kept))

    # Coverage is exactly the union of everything added.
    assert offsets_of(kept) == offsets_of(adds)
    assert s.contiguous_runs() == CoverSet(kept).contiguous_runs()

    # Every kept fragment was added.
    assert all(k in adds for k in kept)

    # Lookups agree with a brute-force model over everything added.
    for offset in range(OFFSET_MAX + 14):
        frag, found = s.longest_overlapping(offset)
        covering = [f for f in adds if f.begin <= offset < f.end]
        assert found == bool(covering)
        if covering:
            assert frag is not None and frag.begin <= offset < frag.end
            assert frag.end == max(f.end for f in covering)
        else:
            after = [k for k in kept if k.begin > offset]
            assert frag == (after[0] if after else None)


@given(a=st.lists(spans, max_size=15), b=st.lists(spans, max_size=15))
def test_difference_matches_brute_force(a: list[Frag], b: list[Frag]) -> None:
    sa, sb = CoverSet(a), CoverSet(b)
    b_offsets = offsets_of(b)

    def covered_by_b(f: Frag) -> bool:
        if f.begin == f.end:  # A point: covered if within or at an edge of b's coverage.
            return any(g.begin <= f.begin <= g.end for g in b)
        return all(o in b_offsets for o in range(f.begin, f.end))

    assert list(sa.difference(sb)) == [f for f in sa if not covered_by_b(f)]
