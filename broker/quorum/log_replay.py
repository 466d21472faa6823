"""Replaying a ReplicaLog's recorded changes (log_change.py): what a restarted member's log
file rebuilds, and the shortest list of changes that rebuilds a given log (a rewrite)."""

from __future__ import annotations

from collections.abc import Iterable

from broker.quorum.entry import ORIGIN
from broker.quorum.log import ReplicaLog
from broker.quorum.log_change import (
    AlignedHeadSet,
    AlignedTermSet,
    CommitSet,
    CompactedThrough,
    EntryAppended,
    LedTermSet,
    LogChange,
    ResetTo,
    TermSet,
    TruncatedAfter,
)


def apply_change(log: ReplicaLog, change: LogChange) -> None:
    """Make `change` on `log` (a replay: the log must not record). Raises the log's own typed
    errors (ProtocolError, IndexError) on a change that does not fit the log."""
    match change:
        case TermSet():
            log.term = change.term
        case AlignedTermSet():
            log.aligned_term = change.term
        case LedTermSet():
            log.led_term = change.term
        case AlignedHeadSet():
            log.aligned_head = change.head
        case CommitSet():
            log.set_commit(change.index)
        case EntryAppended():
            log.append(change.entry)
            log.sync()  # In the file: durable.
        case TruncatedAfter():
            log.truncate_after(change.index)
        case CompactedThrough():
            log.compact_through(change.index)
        case ResetTo():
            log.reset_to(change.base)


def replay(changes: Iterable[LogChange]) -> ReplicaLog:
    """The log the changes rebuild, from an empty one."""
    log = ReplicaLog()
    for change in changes:
        apply_change(log, change)
    return log


def snapshot(log: ReplicaLog) -> list[LogChange]:
    """The changes rebuilding `log` from an empty one: terms, base, entries, commit."""
    out: list[LogChange] = [
        TermSet(log.term),
        AlignedTermSet(log.aligned_term),
        LedTermSet(log.led_term),
    ]
    if log.aligned_head != ORIGIN:
        out.append(AlignedHeadSet(log.aligned_head))
    if log.base.index > 0:
        out.append(ResetTo(log.base))
    out.extend(EntryAppended(e) for e in log.entries)
    out.append(CommitSet(log.commit_index))
    return out


def durable_state(log: ReplicaLog) -> tuple[object, ...]:
    """What a replay must reproduce of `log` (its durable state; synced_index aside)."""
    return (
        log.term,
        log.aligned_term,
        log.aligned_head,
        log.led_term,
        log.commit_index,
        log.base,
        log.entries,
    )
