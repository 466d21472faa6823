"""Lost content of a journal: fragments whose files are gone or empty (sans-IO).

The fragment index (index.py) learns of journal content from store listings. A gap in it is
normally content not listed *yet* (a previous primary still uploading), and reads wait for it
or, past an age, jump it. But some gaps are content that is gone, and a reader must be told
rather than made to wait or skip:

- a fragment that the index held (listed, or persisted by this broker) and a later listing no
  longer covers: its file was deleted or lost (MISSING);
- a fragment whose file is listed, but empty (EMPTY): a store reports it as damaged
  (stores/base.py `StoreListing.damaged`).

Two things are not loss: a fragment past the journal's retention (pruned, as `gazctl journals
prune` does; with `retention_clock_skew_s` of slack), and the fragments of a store that is no
longer among the journal's stores. A lost range is remembered until fragments cover it again
(the file was restored, or the content re-uploaded), or until it passes the retention; at most
`lost_fragments_max` of them, the lowest forgotten first.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from broker.fragment.cover_set import CoverSet
from broker.fragment.verify import FragmentIntegrityError, IntegrityFailure
from broker.logging import get_logger
from broker.protocol import protocol_pb2 as pb

log = get_logger(__name__)

# Ranges of lost content the index remembers (see the module docstring); beyond it, the lowest
# are forgotten (and logged): a journal with this many lost fragments needs an operator anyway.
lost_fragments_max: Final = 1024
# A fragment that vanishes within this much of its retention's end counts as pruned, not lost:
# the pruning tool's clock may run ahead of the broker's.
retention_clock_skew_s: Final = 3600.0


@dataclass(frozen=True, slots=True)
class LostFragment:
    """A fragment whose content is lost: its file vanished from its store (`MISSING`), or is
    empty (`EMPTY`). `fragment` is as last listed (backing_store and mod_time set)."""

    fragment: pb.Fragment
    failure: IntegrityFailure
    detail: str

    @property
    def begin(self) -> int:
        return self.fragment.begin

    @property
    def end(self) -> int:
        return self.fragment.end

    def error(self) -> FragmentIntegrityError:
        """The error a read of it fails with."""
        return FragmentIntegrityError(
            self.fragment, self.fragment.backing_store, self.failure, self.detail
        )


def past_retention(fragment: pb.Fragment, retention_s: float, now: float) -> bool:
    """Whether `fragment` is past the journal's retention (0: forever), with the pruning
    tool's clock skew allowed for: its file's absence is pruning, not loss."""
    return retention_s > 0 and fragment.mod_time + retention_s <= now + retention_clock_skew_s


def covered(runs: list[tuple[int, int]], begin: int, end: int) -> bool:
    """Whether [begin, end) lies within one of `runs` (CoverSet.contiguous_runs)."""
    i = bisect.bisect_right(runs, begin, key=lambda run: run[0]) - 1
    return i >= 0 and runs[i][1] >= end


def update_lost(
    lost: CoverSet[LostFragment],
    runs: list[tuple[int, int]],
    *,
    previous: Iterable[pb.Fragment],
    damaged: Iterable[pb.Fragment],
    stores: set[str],
    retention_s: float,
    now: float,
    journal: str,
) -> CoverSet[LostFragment]:
    """The lost ranges after a listing of `stores`: those of `lost` still uncovered by the
    index's `runs`, and the newly lost among `previous` (the remote fragments the index held
    before the listing) and `damaged`. `retention_s` is the journal's (0: forever)."""

    def pruned(fragment: pb.Fragment) -> bool:
        return past_retention(fragment, retention_s, now)

    out: CoverSet[LostFragment] = CoverSet()
    for old in lost:
        if not covered(runs, old.begin, old.end) and not pruned(old.fragment):
            out.add(old)
    for fragment in previous:
        if (
            fragment.backing_store in stores
            and fragment.end > fragment.begin
            and not covered(runs, fragment.begin, fragment.end)
            and not pruned(fragment)
        ):
            log.error(
                "fragment file vanished from its store: its content is lost",
                journal=journal,
                begin=fragment.begin,
                end=fragment.end,
                store=fragment.backing_store,
            )
            out.add(
                LostFragment(
                    _copy(fragment),
                    IntegrityFailure.MISSING,
                    "its file vanished from the store (the index held it, a later listing"
                    " does not, within the journal's retention)",
                )
            )
    for fragment in damaged:
        if not covered(runs, fragment.begin, fragment.end):
            out.add(
                LostFragment(
                    _copy(fragment), IntegrityFailure.EMPTY, "its file in the store is empty"
                )
            )
    if len(out) > lost_fragments_max:
        kept = list(out)
        for forgotten in kept[: len(kept) - lost_fragments_max]:
            log.warning(
                "too many lost fragments: forgetting the lowest",
                journal=journal,
                begin=forgotten.begin,
                end=forgotten.end,
                lost_fragments_max=lost_fragments_max,
            )
        out = CoverSet(kept[len(kept) - lost_fragments_max :])
    return out


def lost_in_gap(
    lost: CoverSet[LostFragment], offset: int, gap_end: int | None
) -> LostFragment | None:
    """The first lost range ending after `offset` and beginning before `gap_end` (None: the gap
    runs on past every fragment), if any."""
    ind, found = lost.longest_overlapping_index(offset)
    if not found and ind == len(lost):
        return None
    candidate = lost[ind]
    if gap_end is not None and candidate.begin >= gap_end:
        return None
    return candidate


def _copy(fragment: pb.Fragment) -> pb.Fragment:
    out = pb.Fragment()
    out.CopyFrom(fragment)
    return out
