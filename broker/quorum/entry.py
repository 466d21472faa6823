"""Entry ids, log entries and the log's base: the values every other quorum module speaks in.

An entry is one whole Gazette append: the byte range [begin, end) of the journal it occupies and
its content. Entries are numbered by `index` (1, 2, ...) in log order, like Raft's log index, and
carry the `term` of the leader that wrote them. The id (term, index) names an entry everywhere;
byte offsets are attributes of it. Indices are needed, not just offsets, because a leader opens
its term with an empty *barrier* entry (begin == end), which shares its end offset with the entry
before it: an acknowledgement of "offset 100" would not say whether the barrier is held.

Ids order by (term, index), which is Raft's "more up to date" order of log heads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True, order=True)
class EntryId:
    """(term, index) of an entry; ORIGIN (0, 0) is the empty log's head."""

    term: int
    index: int

    def __str__(self) -> str:
        return f"{self.term}.{self.index}"


ORIGIN: Final = EntryId(0, 0)


@dataclass(frozen=True, slots=True)
class Entry:
    """One append of `term`'s leader, at log position `index`, holding journal bytes
    [begin, end). A barrier (the first entry of every term) is empty."""

    term: int
    index: int
    begin: int
    end: int
    data: bytes

    @property
    def id(self) -> EntryId:
        return EntryId(self.term, self.index)

    def __repr__(self) -> str:
        return f"Entry({self.term}.{self.index} [{self.begin},{self.end}))"


@dataclass(frozen=True, slots=True)
class LogBase:
    """The last entry a log dropped after its content reached the snapshot store (or ORIGIN):
    everything at or before it is committed, and readable from that store."""

    term: int
    index: int
    end: int

    @property
    def id(self) -> EntryId:
        return EntryId(self.term, self.index)


EMPTY_BASE: Final = LogBase(0, 0, 0)
