"""The durable changes of a ReplicaLog, as values: what a member's log file records.

A `ReplicaLog` whose `changes` list is set records every change to its durable state, in the
order made: a term entered, aligned or led; an entry appended; the commit index raised; a
truncation, a compaction, a reset to a snapshot's base. Replaying them in order on an empty log
(`log_replay.replay`) rebuilds the same log: same terms, base, entries and commit index, every
entry synced (a change is recorded once written to the file; the shell syncs the file before
the member acts on it). `log_replay.snapshot` is the shortest list rebuilding a given log: what
a compacted (rewritten) file starts with.

Syncing itself is not a change: what reached the file is what a restart finds.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.quorum.entry import Entry, EntryId, LogBase


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
class AlignedHeadSet:
    """The head of the leader that aligned this log, when it did (ReplicaLog.aligned_head)."""

    head: EntryId


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
    | AlignedHeadSet
    | CommitSet
    | EntryAppended
    | TruncatedAfter
    | CompactedThrough
    | ResetTo
)
