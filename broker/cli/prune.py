"""``gazctl journals prune``: delete persisted fragments older than their journal's retention.

For each journal the selector matches, the fragments its brokers index (ListFragments: every
store's listing joined with what brokers still hold locally) are planned one by one
(`plan_prune`, pure): a fragment is deleted from its backing store when

- the journal has a retention (`fragment.retention` > 0; zero or less keeps fragments forever),
- the fragment is persisted (it has a backing store: local content is no file to delete),
- its modification time is at least the retention ago, and
- it is not the persisted fragment holding the journal's head (the largest end offset of any
  persisted fragment). That one is kept whatever its age: the store is where recovering brokers
  learn how far the journal was written, and a store emptied of its last fragment would let a
  journal whose brokers all restarted begin again at a smaller offset, writing offsets twice.
  (Gazette's gazctl deletes it too; this is a deliberate difference.)

As Gazette's: brokers index only the largest of fragments covering the same offsets, so a
smaller duplicate is not listed and not deleted; it is listed once the larger one is gone, and
a later prune deletes it. Deleting a file that is already gone is not an error.

Progress goes to stderr, one line per journal; the result is a table (or YAML / JSON) of each
fragment deleted, or that would be with ``--dry-run``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from broker import client
from broker.fragment.naming import content_path
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import JournalNotFoundError

if TYPE_CHECKING:
    from broker.fragment.stores.registry import StoreRegistry

# Columns of the table output.
COLUMNS = ("journal", "begin", "end", "bytes", "age", "store", "path", "action")


@dataclass
class PrunePlan:
    """What to do with one journal's fragments."""

    journal: str
    retention_s: float
    aged: list[pb.Fragment] = field(default_factory=list)
    kept: list[pb.Fragment] = field(default_factory=list)

    @property
    def bytes_aged(self) -> int:
        return sum(f.end - f.begin for f in self.aged)

    @property
    def bytes_total(self) -> int:
        return self.bytes_aged + sum(f.end - f.begin for f in self.kept)


def retention_s(spec: pb.JournalSpec) -> float:
    """The spec's retention in seconds (<= 0: fragments are kept forever)."""
    return float(spec.fragment.retention.ToNanoseconds()) / 1e9


def plan_prune(spec: pb.JournalSpec, fragments: Sequence[pb.Fragment], now_s: float) -> PrunePlan:
    """Which of `fragments` (the journal's listing) are deleted at wall time `now_s` (see the
    module docstring for the rules)."""
    plan = PrunePlan(spec.name, retention_s(spec))
    head_end = max((f.end for f in fragments if f.backing_store), default=-1)
    for fragment in fragments:
        aged = (
            plan.retention_s > 0
            and bool(fragment.backing_store)
            and fragment.end != head_end
            and now_s - fragment.mod_time >= plan.retention_s
        )
        (plan.aged if aged else plan.kept).append(fragment)
    return plan


def _record(fragment: pb.Fragment, now_s: float, action: str) -> dict[str, Any]:
    return {
        "journal": fragment.journal,
        "begin": fragment.begin,
        "end": fragment.end,
        "bytes": fragment.end - fragment.begin,
        "mod_time": fragment.mod_time,
        "age": _age_text(now_s - fragment.mod_time),
        "store": fragment.backing_store,
        "path": content_path(fragment),
        "action": action,
    }


def _age_text(age_s: float) -> str:
    """A short human age: 3d4h, 5h12m, 40s."""
    seconds = max(0, int(age_s))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes}m"
    return f"{minutes}m{seconds}s" if minutes else f"{seconds}s"


async def prune_journals(
    c: client.JournalClient,
    registry: StoreRegistry,
    selector: str,
    *,
    dry_run: bool,
    progress: TextIO,
    clock: Callable[[], float] = time.time,
) -> list[dict[str, Any]]:
    """Prune every journal matching `selector`; return a record per fragment deleted (or, with
    `dry_run`, that would be). Journals are done one after the other, fragments in offset
    order; a store failure stops the command (what was deleted until then stays deleted, and
    the progress lines say what that was)."""
    listing = await client.list_journals(c, selector)
    if not listing.journals:
        raise JournalNotFoundError(f"no journals match selector {selector!r}")
    action = "would delete" if dry_run else "deleted"
    records: list[dict[str, Any]] = []
    fragments_total = bytes_total = 0
    for journal in listing.journals:
        spec = journal.spec
        response = await client.list_all_fragments(c, pb.FragmentsRequest(journal=spec.name))
        now_s = clock()
        plan = plan_prune(spec, [f.spec for f in response.fragments], now_s)
        for fragment in plan.aged:
            if not dry_run:
                await registry.get(fragment.backing_store).delete(fragment)
            records.append(_record(fragment, now_s, action))
        fragments_total += len(plan.aged)
        bytes_total += plan.bytes_aged
        retention = _age_text(plan.retention_s) if plan.retention_s > 0 else "none"
        print(
            f"{spec.name}: {action} {len(plan.aged)} of {len(plan.aged) + len(plan.kept)}"
            f" fragments ({plan.bytes_aged} of {plan.bytes_total} bytes; retention {retention})",
            file=progress,
            flush=True,
        )
    print(
        f"{action} {fragments_total} fragments ({bytes_total} bytes)"
        f" of {len(listing.journals)} journals",
        file=progress,
        flush=True,
    )
    return records
