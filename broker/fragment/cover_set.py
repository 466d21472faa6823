"""CoverSet: the ordered set of fragments a journal's index serves reads from.

A journal's content is known through fragments from several places at once: the spool being
built locally, fragments of the local spool already closed, and every fragment listed from each
of the journal's BLOB stores. These overlap freely (two brokers may persist different
fragmentations of the same offsets; a remote listing repeats local fragments). A CoverSet keeps
only the fragments that matter for reads: those not fully covered by another.

That rule makes the set simple to reason about. If no fragment covers another, then ordering
by begin offset also orders by end offset, strictly: two fragments with equal begins, or with
one's end not after the other's, would have one covering the other. Lookups are therefore
binary searches, and "the fragment covering an offset with the largest end" (the one that lets
a reader go furthest before it needs another lookup) is simply the last one beginning at or
before the offset.

Equal ranges are the one case where a newcomer that adds no coverage is still taken: it
*replaces* the kept fragment. Fragments of equal range hold the same content, but the newer
value may carry newer facts about it: a spool fragment re-added as the spool commits, or a
fragment that has since been persisted (backing store and modification time now set). The index
decides which value to add last; the set keeps the latest, as Gazette's does.

This module is sans-IO: it needs only values with `begin` and `end` offsets, so it indexes
protocol Fragments and local (file-backed) fragments alike.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from typing import Generic, Protocol, TypeVar


class Span(Protocol):
    """Anything with a [begin, end) journal offset range, e.g. a protocol.Fragment."""

    @property
    def begin(self) -> int: ...

    @property
    def end(self) -> int: ...


F = TypeVar("F", bound=Span)


class FragmentRangeError(ValueError):
    """A fragment's offsets are not a valid range."""


def _begin(f: Span) -> int:
    return f.begin


def _end(f: Span) -> int:
    return f.end


def covers(outer: Span, inner: Span) -> bool:
    """Whether `outer` covers every offset of `inner` (and, for an empty `inner`, its point)."""
    return outer.begin <= inner.begin and inner.end <= outer.end


class CoverSet(Generic[F]):
    """Fragments ordered by begin offset, none covered by another (see the module docstring)."""

    __slots__ = ("_items",)

    def __init__(self, fragments: Iterable[F] = ()) -> None:
        self._items: list[F] = []
        for f in fragments:
            self.add(f)

    def add(self, fragment: F) -> bool:
        """Add `fragment` unless another one already covers it.

        Returns True if the set changed: the fragment was inserted (dropping every fragment it
        covers), or it replaced a fragment of exactly equal range. Returns False, changing
        nothing, if a kept fragment covers it and differs in range.
        """
        if not 0 <= fragment.begin <= fragment.end:
            raise FragmentRangeError(
                f"fragment: expected 0 <= begin <= end (have {fragment.begin}, {fragment.end})"
            )
        items = self._items
        # Ends increase with begins, so the only fragment that can cover this one is the first
        # ending at or after it: any before end too soon, any after begin later still.
        ind = bisect.bisect_left(items, fragment.end, key=_end)
        if ind != len(items):
            kept = items[ind]
            if kept.begin == fragment.begin and kept.end == fragment.end:
                items[ind] = fragment
                return True
            if kept.begin <= fragment.begin:
                return False
        # Not covered. The fragments it covers are a contiguous run: those beginning at or
        # after it, up to the last that ends at or before it.
        first = bisect.bisect_left(items, fragment.begin, key=_begin)
        last = bisect.bisect_right(items, fragment.end, key=_end)
        items[first:last] = [fragment]
        self._check_order(first)
        return True

    def _check_order(self, at: int) -> None:
        # The ordering invariant is what every lookup relies on; verify it where it is written,
        # around the one position a splice can disturb. Not an `assert`: -O must not strip it.
        items = self._items
        lo, hi = max(at - 1, 0), min(at + 2, len(items))
        for a, b in zip(items[lo:hi], items[lo + 1 : hi], strict=False):
            if not (a.begin < b.begin and a.end < b.end):
                raise RuntimeError(
                    f"CoverSet invariant broken: [{a.begin}, {a.end}) then [{b.begin}, {b.end})"
                )

    def longest_overlapping_index(self, offset: int) -> tuple[int, bool]:
        """(index, True) of the fragment covering `offset` with the largest end; else
        (index of the first fragment beginning after `offset` (may be len(self)), False), so
        that a reader facing a gap can decide whether to jump ahead to it."""
        ind = bisect.bisect_right(self._items, offset, key=_begin)
        if ind != 0 and self._items[ind - 1].end > offset:
            return ind - 1, True
        return ind, False

    def longest_overlapping(self, offset: int) -> tuple[F | None, bool]:
        """(fragment, True) covering `offset` with the largest end, or (the next fragment after
        `offset`, False), or (None, False) if there is none after it either."""
        ind, found = self.longest_overlapping_index(offset)
        if ind == len(self._items):
            return None, False
        return self._items[ind], found

    @property
    def begin_offset(self) -> int:
        """Begin of the first fragment, or 0 if empty."""
        return self._items[0].begin if self._items else 0

    @property
    def end_offset(self) -> int:
        """End of the last fragment, or 0 if empty."""
        return self._items[-1].end if self._items else 0

    def difference(self, other: CoverSet[F]) -> CoverSet[F]:
        """Fragments of this set not covered by the union of `other`'s fragments.

        Coverage may be spread over several of `other`'s fragments, provided they leave no gap
        (adjacent or overlapping): the index uses this to drop local fragments once a store
        listing holds their content, however the store's fragments are cut.
        """
        out: CoverSet[F] = CoverSet()
        runs = other.contiguous_runs()
        run_begins = [b for b, _ in runs]
        for f in self._items:
            i = bisect.bisect_right(run_begins, f.begin) - 1
            if i < 0 or runs[i][1] < f.end:
                out._items.append(f)  # Already ordered and non-covering, as a subset of self.
        return out

    def contiguous_runs(self) -> list[tuple[int, int]]:
        """The union of the fragments' ranges, as ordered, disjoint, non-adjacent [begin, end)
        runs. Empty fragments contribute their point, as a zero-length run."""
        runs: list[tuple[int, int]] = []
        for f in self._items:
            if runs and f.begin <= runs[-1][1]:
                runs[-1] = (runs[-1][0], max(runs[-1][1], f.end))
            else:
                runs.append((f.begin, f.end))
        return runs

    def copy(self) -> CoverSet[F]:
        out: CoverSet[F] = CoverSet()
        out._items = list(self._items)
        return out

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[F]:
        return iter(self._items)

    def __getitem__(self, index: int) -> F:
        return self._items[index]

    def __bool__(self) -> bool:
        return bool(self._items)

    def __repr__(self) -> str:
        ranges = ", ".join(f"[{f.begin}, {f.end})" for f in self._items)
        return f"CoverSet({ranges})"
