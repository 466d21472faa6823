"""Journal suspension, as Gazette's append machine does it.

An idle journal may be *suspended* to use fewer brokers: PARTIAL keeps one replica (its
desired replication is 1), FULL keeps none (0). The level and the journal's write offset at
suspension live in the JournalSpec (``suspend {level, offset}``); the allocator sizes routes by
the level (allocator.journal_replication) and the resolver answers SUSPENDED for a FULL one.

Appends drive it, each with a ``suspend`` control (AppendRequest.Suspend):

- SUSPEND_RESUME (the default: every plain append): a suspended journal is resumed, level NONE
  at the current offset. A FULL one has no broker to append through: it is resumed at once, at
  the offset it was suspended at, and the append fails NO_JOURNAL_PRIMARY_BROKER (or
  INSUFFICIENT_JOURNAL_BROKERS while the allocator adds replicas back) until the route is
  rebuilt; clients retry those.
- SUSPEND_NO_RESUME: fail with SUSPENDED rather than resume (brokers' own pulses use it).
- SUSPEND_IF_FLUSHED: a journal that has never held content (its fragment index is empty) is
  suspended FULL; one whose every fragment is persisted and older than its flush interval
  (default 24 h: an "in use" journal is not suspended between appends) PARTIAL; one with
  content not yet persisted is left as it is. The answer is SUSPENDED once it is suspended.
- SUSPEND_NOW: as SUSPEND_IF_FLUSHED, but suspends PARTIAL even with unpersisted content: the
  spool is rolled so that its fragment is persisted promptly (harmless: every former replica
  persists its content as usual).
- SUSPEND_KEEP: leave the level as it is: an empty append (``gazctl journals reset-head``)
  goes through the single replica of a PARTIAL journal without resuming it.

Requests other than SUSPEND_RESUME and SUSPEND_NO_RESUME may not carry content (NOT_ALLOWED).

The suspension offset also lets a resumed journal roll forward: a broker that takes the journal
afresh (its spool at 0, the replicas that held it gone) synchronises every spool to the offset
the journal was suspended at, instead of refusing appends with INDEX_HAS_GREATER_OFFSET
(brokers that were suspended away persisted everything up to it).

This module holds the decisions (pure) and the etcd update; the append machine (append_fsm.py)
calls them from VALIDATE_PRECONDITIONS and UPDATE_SUSPEND.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from broker.fragment.index import FragmentIndex
from broker.keyspace.backend import Backend, Compare, CompareResult, CompareTarget, OpPut
from broker.protocol import protocol_pb2 as pb
from broker.resolver import Resolution

NONE = pb.JournalSpec.Suspend.NONE
PARTIAL = pb.JournalSpec.Suspend.PARTIAL
FULL = pb.JournalSpec.Suspend.FULL

RESUME = pb.AppendRequest.SUSPEND_RESUME
NO_RESUME = pb.AppendRequest.SUSPEND_NO_RESUME
IF_FLUSHED = pb.AppendRequest.SUSPEND_IF_FLUSHED
NOW = pb.AppendRequest.SUSPEND_NOW
KEEP = pb.AppendRequest.SUSPEND_KEEP

# Controls whose appends may not carry content.
CONTENT_FORBIDDEN = frozenset({IF_FLUSHED, NOW, KEEP})

# A journal whose spec sets no flush interval is "in use" if it was written in the last day.
idle_interval_s_default = 24 * 3600


class SuspendStep(enum.Enum):
    PROCEED = "proceed"  # Append as usual.
    UPDATE = "update"  # Write `suspend` into the JournalSpec, then resolve again.
    SUSPENDED = "suspended"  # Answer SUSPENDED (an empty append still runs to its end).
    REFUSE = "refuse"  # Fail with SUSPENDED at once.


@dataclass(frozen=True)
class SuspendDecision:
    step: SuspendStep
    # The spec's new suspension (UPDATE only).
    suspend: pb.JournalSpec.Suspend | None = None
    # Roll the spool before suspending (SUSPEND_NOW's PARTIAL suspension).
    roll: bool = False


def index_is_dirty(index: FragmentIndex, spec: pb.JournalSpec, now: float) -> bool:
    """Gazette's "dirty" index: its last fragment is local (not persisted: no mod time) or was
    persisted within the journal's flush interval (an upper bound of the time between appends
    of a journal in use; a day if the spec sets none)."""
    fragments = index.snapshot()
    if not fragments:
        return True
    mod_time = fragments[-1].mod_time
    interval_s = spec.fragment.flush_interval.seconds or idle_interval_s_default
    return mod_time == 0 or mod_time > int(now) - interval_s


def decide(
    control: int,
    level: int,
    *,
    index_empty: bool,
    index_dirty: bool,
    spool_end: int,
) -> SuspendDecision:
    """What the append's ``control`` does to a journal suspended at ``level`` (NONE or
    PARTIAL: a FULL one is handled at resolution), its spool synchronised at ``spool_end``.
    ``index_dirty`` is only read for IF_FLUSHED and NOW."""
    if control == RESUME:
        if level != NONE:
            return SuspendDecision(
                SuspendStep.UPDATE, pb.JournalSpec.Suspend(level=NONE, offset=spool_end)
            )
        return SuspendDecision(SuspendStep.PROCEED)
    if control == NO_RESUME:
        return SuspendDecision(SuspendStep.REFUSE if level != NONE else SuspendStep.PROCEED)
    if control in (IF_FLUSHED, NOW):
        if level != FULL and index_empty:
            # Nothing was ever written (or all of it is gone from the store): no replica needed.
            return SuspendDecision(
                SuspendStep.UPDATE, pb.JournalSpec.Suspend(level=FULL, offset=spool_end)
            )
        if level == NONE and (not index_dirty or control == NOW):
            return SuspendDecision(
                SuspendStep.UPDATE,
                pb.JournalSpec.Suspend(level=PARTIAL, offset=spool_end),
                # One replica stays, likely this primary: roll its spool so that unpersisted
                # content is persisted now (SUSPEND_IF_FLUSHED's index had none).
                roll=True,
            )
        if level == PARTIAL:
            return SuspendDecision(SuspendStep.SUSPENDED)
        return SuspendDecision(SuspendStep.PROCEED)
    return SuspendDecision(SuspendStep.PROCEED)  # KEEP: the level stays.


async def update_journal_spec(
    backend: Backend, resolved: Resolution, suspend: pb.JournalSpec.Suspend
) -> int:
    """Write ``suspend`` into the journal's spec, in one transaction that holds only if neither
    the spec nor any assignment changed since the resolution. Returns the revision to read
    through: the update's, or (having lost a race) the one that beat it."""
    item, spec = resolved.item, resolved.spec
    if item is None or spec is None:
        raise ValueError(f"{resolved.journal}: resolved without a spec")
    update = pb.JournalSpec()
    update.CopyFrom(spec)
    update.suspend.CopyFrom(suspend)
    compares = [Compare(item.kv.key, CompareTarget.MOD, CompareResult.EQUAL, item.kv.mod_revision)]
    for entry in resolved.assignments:
        compares.append(
            Compare(entry.kv.key, CompareTarget.MOD, CompareResult.EQUAL, entry.kv.mod_revision)
        )
    resp = await backend.txn(compares, [OpPut(item.kv.key, update.SerializeToString())])
    return resp.header.revision
