"""The durable changes of a ReplicaLog, as values: what a member's log file records.

A `ReplicaLog` whose `changes` list is set records every change to its durable state, in the
order made: a term entered, aligned or led; an entry appended; the commit index raised; a
truncation, a compaction, a reset to a snapshot's base. Replaying them in order on an empty log
(`replay`) rebuilds the same log: same terms, base, entries and commit index, every entry
synced (a change is recorded once written to the file; the shell syncs the file before the
member acts on it). `snapshot` is the shortest list rebuilding a given log: what a compacted
(rewritten) file starts with.

Syncing itself is not a change: what reached the file is what a restart finds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker.quorum.entry import Entry, LogBase

if TYPE_CHECKING:
    from broker.quorum.log import ReplicaLog


@dataclass(frozen=True, slots=True)
class TermSet:
    term: int


@dataclass(frozen=True, slots=True)
class AlignedTermSet:
    term: int


@dataclass(frozen=True, slots=True)
class LedTermSet:
    term: int


@dataclass(frozen=True, slots=True)
class CommitSet:
    index: int


@dataclass(frozen=True, slots=True)
class EntryAppended:
    entry: Entry


@dataclass(frozen=True, slots=True)
class TruncatedAfter:
    index: int


@dataclass(frozen=True, slots=True)
class CompactedThrough:
    index: int


@dataclass(frozen=True, slots=True)
class ResetTo:
    base: LogBase


LogChange = (
    TermSet
    | AlignedTermSet
    | LedTermSet
    | CommitSet
    | EntryAppended
    | TruncatedAfter
    | CompactedThrough
    | ResetTo
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
    from broker.quorum.log import ReplicaLog  # The log records changes: imported late.

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
        log.led_term,
        log.commit_index,
        log.base,
        log.entries,
    )
