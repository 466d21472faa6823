"""``gazctl shards prune``: delete recovery-log fragments that no shard's hints still need.

    gazctl shards prune -l SELECTOR [--dry-run] [--file-root DIR] [--format ...]

A recovery log holds every write a shard's store ever made, so without pruning it grows
without bound. Hints (FSMHints) name the segments of the log that hold the live files; a player
reads only those, and everything from the last one on. A fragment that intersects no hinted
segment of any shard using the log (a live file's segments of one author taken as one, from the
first's start to the last's end: see `live_segments`) is never read again, neither by a player
of these hints nor of hints made from them, and is deleted from its store.

As Gazette's: every hint of every selected shard is consulted, the primary hints and each
backup (a shard may be recovered from any of them); a log is pruned only if every one of them
is present with live files (else a shard could yet need what would be deleted: the log is
skipped, with a warning). The last hinted segment of each hints set is open-ended: playback
continues through the log's end. All shards that share a log (forks of it) must be selected.

Unlike Gazette's, a fragment not yet persisted (no backing store, so no file) is kept with a
warning rather than failing the whole run, and the plan of every log is made before anything
is deleted. Store health is not probed first (Gazette's does; a failing store fails the
deletions, each named).

The result is a table (or YAML / JSON) of the fragments deleted (or that would be, with
--dry-run); progress goes to stderr. Deletions run at most `deletes_concurrent_max` at a time;
if any fails, the others still run and the command then fails (exit 1) naming how many.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TextIO

from broker.cli.errors import CommandError
from broker.fragment.naming import content_path
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import protocol_pb2 as pb
from broker.protocol.recorded_op_pb2 import FSMHints
from gazette_consumer.recoverylog.segments import InvalidHintsError, Segment, merge_segments
from gazette_consumer.shard_spec import recovery_log

if TYPE_CHECKING:
    from broker.client.route_cache import JournalClient
    from broker.fragment.stores.registry import StoreRegistry
    from gazette_consumer.shard_client import ShardClient

COLUMNS = ("log", "begin", "end", "bytes", "store", "path", "action")
# Deletions in flight at once (object stores take many small requests well).
deletes_concurrent_max = 32


@dataclass
class LogPlan:
    """What to do with one recovery log's fragments."""

    log: str
    segments: list[Segment]
    prune: list[pb.Fragment] = field(default_factory=list)
    kept: list[pb.Fragment] = field(default_factory=list)
    unpersisted: list[pb.Fragment] = field(default_factory=list)


# --- Planning (pure) --------------------------------------------------------------------------


def live_segments(hints: FSMHints) -> list[Segment]:
    """The segments of `hints`' live files, merged, the last made open-ended (0 last offset):
    playback reads on past the last hinted segment through the log's end.

    A live file's consecutive segments of one author are taken as one, from the first's start
    to the last's end: what lies between them stays. Our FSM splits a long-lived file's
    segments at gaps (recoverylog/fsm.py) so that a player skips them, but an FSM that plays
    those hints may join them again: ours when it bounds a file's segments (merging the
    closest pair of an author), Gazette's always (it extends a file's last segment over every
    later op of its author). Hints made then would need the ops between, so they are kept."""
    segments: list[Segment] = []
    for node in hints.live_nodes:
        runs: list[Segment] = []
        for proto in node.segments:
            segment = Segment.from_proto(proto, hints.log)
            last = runs[-1] if runs else None
            if last is not None and (last.author, last.log) == (segment.author, segment.log):
                runs[-1] = replace(
                    last, last_seq_no=segment.last_seq_no, last_offset=segment.last_offset
                )
            else:
                runs.append(segment)
        segments.extend(runs)
    merged = merge_segments(segments)
    if merged:
        merged[-1] = replace(merged[-1], last_offset=0)
    return merged


def overlaps(segments: Iterable[Segment], fragment: pb.Fragment) -> bool:
    """Whether `fragment` intersects any segment (an open end, 0, intersects everything
    after its start)."""
    for s in segments:
        if (s.first_offset < fragment.end or fragment.end == 0) and (
            s.last_offset > fragment.begin or s.last_offset == 0
        ):
            return True
    return False


def plan_log(log: str, segments: Sequence[Segment], fragments: Iterable[pb.Fragment]) -> LogPlan:
    """Which of `log`'s fragments to delete, given the hinted segments of every shard."""
    plan = LogPlan(log, list(segments))
    for fragment in fragments:
        if not segments or overlaps(segments, fragment):
            plan.kept.append(fragment)
        elif not fragment.backing_store or fragment.mod_time == 0:
            plan.unpersisted.append(fragment)
        else:
            plan.prune.append(fragment)
    return plan


# --- Running ----------------------------------------------------------------------------------


async def collect_segments(
    shards: ShardClient, listing: cpb.ListResponse, progress: TextIO
) -> tuple[dict[str, list[Segment]], set[str]]:
    """The hinted segments of every log (by log), and the logs to skip: those of a shard
    lacking a complete set of hints."""
    segments: dict[str, list[Segment]] = {}
    skipped: set[str] = set()
    for shard in listing.shards:
        log = recovery_log(shard.spec)
        if not log:
            continue  # No recovery log: nothing of its to prune.
        response = await shards.get_hints(shard.spec.id)
        for held in [*response.backup_hints, response.primary_hints]:
            hints = held.hints if held.HasField("hints") else None
            if hints is None or not hints.live_nodes:
                reason = "has no live files in its hints" if hints else "lacks some hints"
                print(
                    f"gazctl: skipping recovery log {log}: shard {shard.spec.id} {reason}",
                    file=progress,
                )
                skipped.add(log)
                break
            try:
                for segment in live_segments(hints):
                    segments.setdefault(segment.log, []).append(segment)
            except InvalidHintsError as err:
                raise CommandError(f"hints of shard {shard.spec.id} are invalid: {err}") from None
    return segments, skipped


async def prune_shards(
    shards: ShardClient,
    journals: JournalClient,
    registry: StoreRegistry,
    selector: str,
    *,
    dry_run: bool,
    progress: TextIO,
) -> list[dict[str, Any]]:
    """Prune the recovery logs of the shards `selector` matches; one record per fragment
    pruned (or that would be)."""
    from broker import client
    from broker.protocol.status import SuspendedError

    listing = await shards.list_shards(selector)
    segments, skipped = await collect_segments(shards, listing, progress)
    plans: list[LogPlan] = []
    for log in sorted(segments):
        if log in skipped:
            continue
        try:
            response = await client.list_all_fragments(journals, pb.FragmentsRequest(journal=log))
        except SuspendedError:
            print(f"gazctl: skipping suspended recovery log {log}", file=progress)
            continue
        plans.append(plan_log(log, segments[log], (f.spec for f in response.fragments)))
    records: list[dict[str, Any]] = []
    failures = 0
    for plan in plans:
        for fragment in plan.unpersisted:
            print(
                f"gazctl: {plan.log}: keeping [{fragment.begin}, {fragment.end}): not persisted"
                " yet (no file to delete; is every shard using this log selected?)",
                file=progress,
            )
        failed = await delete_fragments(registry, plan.prune, dry_run)
        failures += len(failed)
        for fragment in plan.prune:
            error = failed.get(id(fragment))
            action = "would prune" if dry_run else "pruned"
            records.append(
                {
                    "log": plan.log,
                    "begin": fragment.begin,
                    "end": fragment.end,
                    "bytes": fragment.end - fragment.begin,
                    "store": fragment.backing_store,
                    "path": content_path(fragment),
                    "action": f"failed: {error}" if error else action,
                }
            )
        pruned_bytes = sum(f.end - f.begin for f in plan.prune)
        print(
            f"gazctl: {plan.log}: {len(plan.prune)} of"
            f" {len(plan.prune) + len(plan.kept) + len(plan.unpersisted)} fragments"
            f" ({pruned_bytes} bytes) {'to prune' if dry_run else 'pruned'}",
            file=progress,
        )
    if failures:
        raise PruneFailedError(records, failures)
    return records


class PruneFailedError(CommandError):
    """Some deletions failed (the others were done); `records` tell which."""

    def __init__(self, records: list[dict[str, Any]], failures: int) -> None:
        super().__init__(f"{failures} fragment deletions failed (see the 'failed:' rows)")
        self.records = records


async def delete_fragments(
    registry: StoreRegistry, fragments: Sequence[pb.Fragment], dry_run: bool
) -> dict[int, str]:
    """Delete `fragments` from their stores, boundedly concurrently; the failures, by id()."""
    from broker.fragment.stores.base import StoreError
    from broker.protocol.validate import ValidationError

    failed: dict[int, str] = {}
    if dry_run:
        return failed
    slots = asyncio.Semaphore(deletes_concurrent_max)

    async def delete(fragment: pb.Fragment) -> None:
        async with slots:
            try:
                await registry.get(fragment.backing_store).delete(fragment)
            except (StoreError, ValidationError) as err:
                failed[id(fragment)] = " ".join(str(err).split())

    await asyncio.gather(*(delete(f) for f in fragments))
    return failed
