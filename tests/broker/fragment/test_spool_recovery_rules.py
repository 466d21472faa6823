"""The rules of spool recovery (spool_recovery.py), sans I/O: what each file of a journal's
directory is, and when recovered content may be used."""

from __future__ import annotations

from broker.fragment.naming import content_sum
from broker.fragment.spool_record import CommitRecord, SlotRecord
from broker.fragment.spool_recovery import (
    Disposition,
    ScannedFragment,
    StoreVerdict,
    Verdict,
    keeps_completed,
    plan_journal,
    prefix_to_verify,
    settle_verdict,
    store_verdict,
)
from broker.protocol import protocol_pb2 as pb

JOURNAL = "a/journal"
CONTENT = bytes(range(256)) * 4


def frag(begin: int, end: int, journal: str = JOURNAL) -> pb.Fragment:
    return pb.Fragment(journal=journal, begin=begin, end=end, sum=content_sum(CONTENT[begin:end]))


def rec(begin: int, end: int, journal: str = JOURNAL) -> CommitRecord:
    return CommitRecord(frag(begin, end, journal), pb.LabelSet(), 1.0 if end > begin else None)


def slots(*records: CommitRecord) -> list[SlotRecord]:
    """Valid slots, newest first (as decode_file returns them)."""
    return [SlotRecord(len(records) - i, r) for i, r in enumerate(records)]


def dispositions(plans: list) -> dict[int, Disposition]:  # type: ignore[type-arg]
    return {p.begin: p.disposition for p in plans}


def test_the_greatest_begin_is_open_and_earlier_content_completed() -> None:
    plans = plan_journal(
        JOURNAL,
        [
            ScannedFragment(0, slots(rec(0, 100), rec(0, 50)), 100),
            ScannedFragment(100, slots(rec(100, 100)), None),  # Rolled, empty: superseded.
            ScannedFragment(150, slots(rec(150, 200)), 230),  # Pending bytes past the commit.
            ScannedFragment(200, slots(rec(200, 260)), 260),
        ],
    )
    assert dispositions(plans) == {
        0: Disposition.COMPLETED,
        100: Disposition.SUPERSEDED,
        150: Disposition.COMPLETED,
        200: Disposition.OPEN,
    }
    by_begin = {p.begin: p for p in plans}
    # Commits to try, newest first, among those the content file is long enough for.
    assert [c.end for c in by_begin[0].candidates] == [100, 50]
    assert [c.end for c in by_begin[150].candidates] == [200]


def test_content_shorter_than_the_newest_commit_falls_back_to_the_previous() -> None:
    [plan] = plan_journal(JOURNAL, [ScannedFragment(0, slots(rec(0, 100), rec(0, 50)), 70)])
    assert plan.disposition is Disposition.OPEN
    assert [c.end for c in plan.candidates] == [50]
    [plan] = plan_journal(JOURNAL, [ScannedFragment(0, slots(rec(0, 100), rec(0, 50)), 10)])
    assert plan.disposition is Disposition.CORRUPT and "fewer" in plan.reason


def test_an_empty_open_fragment_needs_no_content() -> None:
    [plan] = plan_journal(JOURNAL, [ScannedFragment(500, slots(rec(500, 500)), None)])
    assert plan.disposition is Disposition.OPEN
    assert [c.end for c in plan.candidates] == [500]


def test_unreadable_foreign_or_misplaced_records_are_set_aside_and_content_alone_dropped() -> None:
    plans = plan_journal(
        JOURNAL,
        [
            ScannedFragment(0, [], 10),  # No valid slot.
            ScannedFragment(10, slots(rec(10, 20, "other/journal")), 10),
            ScannedFragment(20, slots(rec(30, 40)), 10),  # Its record names another begin.
            ScannedFragment(40, None, 99),  # Content nobody committed.
            ScannedFragment(50, slots(rec(50, 70)), 20),
            ScannedFragment(60, slots(rec(60, 60)), None),
        ],
    )
    assert dispositions(plans) == {
        0: Disposition.CORRUPT,
        10: Disposition.CORRUPT,
        20: Disposition.CORRUPT,
        40: Disposition.SUPERSEDED,
        50: Disposition.CORRUPT,  # Ends past the next fragment's begin.
        60: Disposition.OPEN,
    }


def test_store_check_drops_identical_fragments_and_sees_the_journal_going_on() -> None:
    recovered = [frag(0, 100), frag(100, 150)]
    # Nothing persisted past the recovered begin (only before it): nothing to say.
    verdict = store_verdict(recovered, [frag(0, 0), pb.Fragment(journal=JOURNAL, begin=0, end=0)])
    assert verdict == StoreVerdict(frozenset(), None, None)
    # The first is in the store under its own name: redundant, and not a conflict.
    verdict = store_verdict(recovered, [frag(0, 100)])
    assert verdict.redundant == {0} and verdict.conflict is None
    # Other bytes at the remaining content's offsets: a conflict.
    other = pb.Fragment(journal=JOURNAL, begin=100, end=120, sum=content_sum(b"x" * 20))
    verdict = store_verdict(recovered, [frag(0, 100), other])
    assert verdict.redundant == {0} and verdict.conflict == other
    # Overlapping a recovered fragment without being it is a conflict too.
    verdict = store_verdict(recovered, [frag(50, 120)])
    assert verdict.conflict == frag(50, 120)
    # All recovered content already persisted: nothing left to conflict.
    verdict = store_verdict(recovered, [frag(0, 100), frag(100, 150), frag(150, 900)])
    assert verdict.redundant == {0, 1} and verdict.conflict is None
    # With the (empty) open fragment after them: persisted up to it is normal, past it not:
    # the journal went on without this broker, and its offset and registers are stale.
    verdict = store_verdict(recovered, [frag(0, 100), frag(100, 150)], frag(150, 150))
    assert verdict == StoreVerdict(frozenset({0, 1}), None, None)
    verdict = store_verdict(
        recovered, [frag(0, 100), frag(100, 150), frag(150, 900)], frag(150, 150)
    )
    assert verdict == StoreVerdict(frozenset({0, 1}), None, frag(150, 900))
    assert store_verdict([], [frag(0, 150)], frag(150, 150)).stale_open is None


def test_completed_fragments_the_journal_went_on_after_are_not_a_conflict() -> None:
    # Found by the 30-minute soak: completed fragments not yet persisted (a store outage),
    # and the journal persisted on from their end by other brokers: the completed ones are
    # the journal's acknowledged content; only the open fragment is stale.
    completed = [frag(100, 150), frag(150, 200)]
    verdict = store_verdict(completed, [frag(0, 100), frag(200, 260)], frag(200, 200))
    assert verdict == StoreVerdict(frozenset(), None, frag(200, 260))
    # A persisted fragment over them is still a conflict, whatever follows.
    verdict = store_verdict(completed, [frag(180, 260)], frag(200, 200))
    assert verdict.conflict == frag(180, 260)
    # At synchronisation: kept when the primary's proposal begins at or after their end.
    assert keeps_completed(completed, frag(200, 200))
    assert keeps_completed(completed, frag(230, 260))
    assert not keeps_completed(completed, frag(190, 190))
    assert keeps_completed([], frag(0, 0)) and keeps_completed(completed, None)


def test_a_primary_adopts_and_a_replica_only_what_its_primary_holds() -> None:
    recovered = frag(100, 200)
    assert settle_verdict(recovered, None) is Verdict.ADOPT
    assert settle_verdict(recovered, frag(100, 200)) is Verdict.ADOPT
    # The primary holds a prefix: adopted once its SHA1 is verified over our own content.
    prefix = frag(100, 150)
    assert prefix_to_verify(recovered, prefix) == (0, 50)
    assert settle_verdict(recovered, prefix, content_sum(CONTENT[100:150])) is Verdict.ADOPT
    assert settle_verdict(recovered, prefix, content_sum(b"other")) is Verdict.DISOWN
    assert settle_verdict(recovered, prefix, None) is Verdict.DISOWN
    # Beyond our end, an empty roll within or past it, or elsewhere: the journal went on.
    for proposal in (frag(100, 250), frag(300, 300), frag(150, 200), frag(200, 200)):
        assert settle_verdict(recovered, proposal, content_sum(b"")) is Verdict.DISOWN
    assert settle_verdict(recovered, frag(150, 150)) is Verdict.DISOWN
    assert prefix_to_verify(recovered, frag(200, 200)) is None
    assert prefix_to_verify(recovered, frag(100, 250)) is None
    # A primary holding nothing at or past our content (it started afresh): kept, and our
    # greater offset then wins, as a live replica's does.
    assert settle_verdict(recovered, frag(100, 100)) is Verdict.ADOPT
    assert settle_verdict(recovered, frag(0, 0)) is Verdict.ADOPT
    # With completed recovered fragments before it: kept if it holds nothing past their end
    # and our open fragment's begin (found by audit: the primary's own open fragment was
    # damaged and set aside; disowning set the healthy replicas' acknowledged copies aside
    # too, and the journal was written again from there)...
    assert settle_verdict(recovered, frag(100, 100), completed=(50, 100)) is Verdict.ADOPT
    assert settle_verdict(recovered, frag(40, 40), completed=(50, 100)) is Verdict.ADOPT
    assert settle_verdict(recovered, frag(70, 70), completed=(50, 70)) is Verdict.ADOPT
    # ... not if our completed ones go past its offset, nor if it is past our open begin.
    assert settle_verdict(recovered, frag(70, 70), completed=(50, 100)) is Verdict.DISOWN
    assert settle_verdict(recovered, frag(150, 150), completed=(50, 100)) is Verdict.DISOWN
    assert settle_verdict(recovered, frag(40, 50)) is Verdict.DISOWN  # It holds content.
    # An empty recovered spool is kept if the primary proposes it, or holds less.
    empty = frag(200, 200)
    assert settle_verdict(empty, frag(200, 200)) is Verdict.ADOPT
    assert settle_verdict(empty, frag(150, 150)) is Verdict.ADOPT
    assert settle_verdict(empty, frag(300, 300)) is Verdict.DISOWN
