"""Recovering durable spools after a restart: the rules, sans I/O.

A broker with a data directory keeps each journal's spool as named files (spool_dir.py): per
fragment, a content file and a commit record (spool_record.py). After a restart (kill -9, power
loss, or a graceful stop) this module decides what those files mean and what may be done with
them; spool_dir.py does the reading, hashing, truncating and moving, and spool_settle.py applies
the decisions once the journal is assigned to this broker again.

1. Planning a journal's directory (`plan_journal`). Each fragment is a begin offset with a
   record file and maybe a content file. The record with the greatest begin is the *open*
   fragment (the spool's current one); every other non-empty one is a *completed* fragment
   that was rolled and handed to the persister, but whose files were not yet removed (so maybe
   not persisted). Empty superseded records and content files without a record (created, never
   committed; or persisted and half cleaned up) are deleted. A record file with no valid slot,
   or of another journal, is set aside. Each kept fragment lists the commits to try, newest
   first: the content file must hold at least the commit's length, and its first `length` bytes
   must hash to the commit's SHA1; bytes beyond it (pending content of an append that never
   committed) are cut. The first commit that verifies wins, so a torn newest record, or content
   the OS lost in a power failure without `--fsync`, falls back to the previous commit. A
   fragment with no verifying commit is set aside (logged, counted), never persisted.

2. Who may use the recovered content. A broker that was away may find that the journal went on
   without it: it was assigned to other brokers, which wrote offsets past the recovered
   fragments' begins (after an operator's reset-head, or from an offset this broker had
   committed but whose append was never acknowledged, because another replica never got it).
   Recovered content for those offsets is then stale, and persisting it, or letting its offset
   win a synchronisation, would write offsets twice. Nothing is done with recovered content
   before the journal is assigned to this broker again, and then:

   a. *The store check* (`store_verdict`), against the replica's first fresh store listing: a
      persisted fragment identical to a recovered one (same offsets and SHA1: same name) makes
      that one redundant, and it is dropped. Any other persisted fragment overlapping the
      remaining completed fragments means the journal holds other bytes at their offsets: all
      of it is set aside, and the replica starts with a fresh spool (offset zero, no
      registers), as a broker without a data directory does. A persisted fragment ending past
      the open fragment's begin (even empty), and overlapping no completed one, means the
      journal was written on without this broker from there: the open fragment is set aside,
      but the completed fragments are kept, indexed and persisted. A completed fragment holds
      only content that every replica of its pipeline acknowledged (a primary proposes the
      roll that completes a fragment only after every replica acknowledged the commits before
      it), so it is the journal's content; setting it aside would lose it when no other broker
      persisted it (seen in the soak: a store outage, then every replica restarted before the
      upload, and the journal kept a hole where the content had been acknowledged).
   b. *The synchronisation check* (`settle_verdict`), at the first synchronisation of a
      pipeline that includes this broker. As the primary, it proposes its recovered fragment
      and the pipeline's own rules apply (the greatest offset among the replicas wins; spools
      below it roll forward): no live broker held the journal ahead of it, or it would be the
      primary. As a replica, the recovered spool is kept only if the primary's proposal is its
      recovered fragment itself (the primary holds the same content), or a part of it whose
      SHA1 this broker verifies over its own content (the primary holds a prefix of it), or an
      empty fragment at or before the begin of all recovered content (the primary holds
      nothing there: a broker that started afresh after every replica of the journal was
      lost), or an empty fragment at or before the open fragment's begin and at or after the
      end of the completed ones (the primary holds nothing past them: its own open fragment
      was damaged and set aside). In the last three cases this broker's greater offset then wins, as a live
      replica's would. Anything else, a proposal beyond its end or within it that it cannot
      verify (the journal went on), and it *disowns* the recovered spool: its content is set
      aside, its offset and registers forgotten, and the proposal is applied to a fresh
      spool. Completed fragments ending at or before the proposal's begin are kept even then
      (`keeps_completed`): the primary went on after them, as in the store check.
   Only content kept by both checks is adopted: indexed for reads, and completed fragments
   handed to the persister.

Residual risk, documented in docs/design/broker-core.md: the checks cannot see content another
broker wrote at those offsets that is neither persisted nor held by the primary of the first
synchronisation (e.g. the whole route that went on without this broker failed in turn before
persisting anything). That takes more failures than a journal's replication tolerates.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from broker.fragment.spool_record import CommitRecord, SlotRecord
from broker.fragment.spool_types import same_fragment
from broker.protocol import protocol_pb2 as pb

# --- 1. Planning a journal's directory ------------------------------------------------------


class Disposition(enum.Enum):
    OPEN = "open"  # The spool's current fragment: re-opened at its last verified commit.
    COMPLETED = "completed"  # Rolled, maybe not persisted: kept for the persister.
    SUPERSEDED = "superseded"  # An empty fragment's record, or content nobody committed.
    CORRUPT = "corrupt"  # Unreadable or inconsistent: set aside, never persisted.


@dataclass(frozen=True, slots=True)
class ScannedFragment:
    """What a journal directory holds for one begin offset."""

    begin: int
    # The record file's valid slots, newest first; None if there is no record file.
    slots: list[SlotRecord] | None
    # The content file's size; None if there is no content file.
    content_size: int | None


@dataclass(frozen=True, slots=True)
class FragmentPlan:
    begin: int
    disposition: Disposition
    # For OPEN and COMPLETED: the commits to verify against the content, newest first.
    candidates: list[CommitRecord] = field(default_factory=list)
    reason: str = ""


def plan_journal(journal: str, scanned: Sequence[ScannedFragment]) -> list[FragmentPlan]:
    """What to do with each fragment of `journal`'s directory (see the module docstring)."""
    plans: list[FragmentPlan] = []
    valid: list[tuple[ScannedFragment, list[SlotRecord]]] = []
    for item in sorted(scanned, key=lambda s: s.begin):
        reason = _invalid_reason(journal, item)
        if item.slots is None:
            plans.append(FragmentPlan(item.begin, Disposition.SUPERSEDED, reason="no record"))
        elif reason:
            plans.append(FragmentPlan(item.begin, Disposition.CORRUPT, reason=reason))
        else:
            valid.append((item, item.slots))
    for index, (item, slots) in enumerate(valid):
        is_open = index == len(valid) - 1
        newest = slots[0].record
        if not is_open and newest.length == 0:
            plans.append(FragmentPlan(item.begin, Disposition.SUPERSEDED, reason="empty"))
            continue
        next_begin = None if is_open else valid[index + 1][0].begin
        if next_begin is not None and newest.end > next_begin:
            reason = f"ends at {newest.end}, past the next fragment's begin {next_begin}"
            plans.append(FragmentPlan(item.begin, Disposition.CORRUPT, reason=reason))
            continue
        size = item.content_size or 0
        candidates = [s.record for s in slots if s.record.length <= size]
        if not candidates:
            reason = f"content file holds {size} bytes, fewer than any commit ({newest.length})"
            plans.append(FragmentPlan(item.begin, Disposition.CORRUPT, reason=reason))
            continue
        disposition = Disposition.OPEN if is_open else Disposition.COMPLETED
        plans.append(FragmentPlan(item.begin, disposition, candidates))
    return plans


def _invalid_reason(journal: str, item: ScannedFragment) -> str:
    if item.slots is None:
        return ""
    if not item.slots:
        return "no valid commit record slot (torn or corrupt)"
    for slot in item.slots:
        fragment = slot.record.fragment
        if fragment.journal != journal:
            return f"record of another journal {fragment.journal!r}"
        if fragment.begin != item.begin:
            return f"record begins at {fragment.begin}, not at its file's {item.begin}"
    return ""


def verified(record: CommitRecord, digest_sum: pb.SHA1Sum) -> bool:
    """Whether content hashing to `digest_sum` is what `record` committed."""
    if record.length == 0:
        return True
    return record.fragment.sum == digest_sum


# --- 2a. The store check -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoreVerdict:
    # Indexes (into the completed fragments) of those the store already holds identically.
    redundant: frozenset[int]
    # A persisted fragment overlapping the remaining completed content without being it: the
    # journal holds other bytes at those offsets. Set everything aside.
    conflict: pb.Fragment | None
    # A persisted fragment ending past the open fragment's begin (none of the completed
    # content): the journal went on without this broker from there. The open fragment's
    # offset, registers and content are stale; the completed fragments are still the journal's.
    stale_open: pb.Fragment | None = None


def store_verdict(
    completed: Sequence[pb.Fragment],
    persisted: Sequence[pb.Fragment],
    open_fragment: pb.Fragment | None = None,
) -> StoreVerdict:
    """The store check (module docstring, 2a) of the `completed` recovered fragments and the
    open one (even if empty: its offset must not be behind the store either) against the
    `persisted` fragments of a fresh listing."""
    recovered = [*completed, *([open_fragment] if open_fragment is not None else [])]
    redundant = frozenset(
        index
        for index, fragment in enumerate(completed)
        if any(_same_content(fragment, p) for p in persisted)
    )
    remaining = [f for index, f in enumerate(completed) if index not in redundant]
    for p in persisted:
        if any(_same_content(f, p) for f in recovered):
            continue
        if any(p.begin < f.end and p.end > f.begin for f in remaining):
            return StoreVerdict(redundant, p)
    if open_fragment is not None:
        for p in persisted:
            if p.end > open_fragment.begin and not any(_same_content(f, p) for f in recovered):
                return StoreVerdict(redundant, None, p)
    return StoreVerdict(redundant, None)


def _same_content(a: pb.Fragment, b: pb.Fragment) -> bool:
    """Same offsets and SHA1: the same fragment file name, whatever the codec or store."""
    return a.begin == b.begin and a.end == b.end and a.sum == b.sum


# --- 2b. The synchronisation check ---------------------------------------------------------


class Verdict(enum.Enum):
    ADOPT = "adopt"  # Keep the recovered spool; its content is the journal's.
    DISOWN = "disown"  # Set its content aside, forget its offset and registers.


def prefix_to_verify(recovered: pb.Fragment, proposal: pb.Fragment) -> tuple[int, int] | None:
    """The range of the recovered content (relative to its begin) whose SHA1 must equal the
    proposal's for a replica to keep it, or None if no such check can succeed."""
    if proposal.begin == proposal.end:
        return None
    if recovered.begin <= proposal.begin and proposal.end <= recovered.end:
        return proposal.begin - recovered.begin, proposal.end - recovered.begin
    return None


def settle_verdict(
    recovered: pb.Fragment,
    proposal: pb.Fragment | None,
    prefix_sum: pb.SHA1Sum | None = None,
    completed: tuple[int, int] | None = None,
) -> Verdict:
    """The synchronisation check (module docstring, 2b). `proposal` is the primary's first
    proposal to this broker as a replica (None: this broker is the primary); `prefix_sum` is
    the SHA1 of the recovered content over `prefix_to_verify`'s range, if there is one;
    `completed` is where the recovered completed fragments begin and end (None: there are
    none)."""
    if proposal is None or same_fragment(proposal, recovered):
        return Verdict.ADOPT
    if prefix_to_verify(recovered, proposal) is not None and prefix_sum == proposal.sum:
        return Verdict.ADOPT
    if proposal.begin != proposal.end:
        return Verdict.DISOWN
    begin = recovered.begin if completed is None else min(completed[0], recovered.begin)
    if proposal.end <= begin:
        return Verdict.ADOPT  # It holds nothing at or past any of our content.
    completed_end = 0 if completed is None else completed[1]
    if completed_end <= proposal.end <= recovered.begin:
        # It holds nothing past where our open fragment begins, and our completed fragments
        # end at or before its offset (kept either way: `keeps_completed`). Found by audit:
        # every replica restarted over its data directory, the one that became primary with
        # its open fragment damaged (set aside); disowning here set aside the healthy
        # replicas' acknowledged copies too, and the journal went on from the lower offset,
        # writing those offsets again. Our greater offset wins instead, as a live replica's.
        return Verdict.ADOPT
    return Verdict.DISOWN


def keeps_completed(completed: Sequence[pb.Fragment], proposal: pb.Fragment | None) -> bool:
    """Whether recovered `completed` fragments stay the journal's when the open fragment is
    disowned at synchronisation: the primary's proposal begins at or after all of them (it
    holds nothing else at their offsets)."""
    if proposal is None:
        return True
    return all(f.end <= proposal.begin for f in completed)
