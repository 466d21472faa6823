"""Entry ids, log entries and the log's base: the values every other quorum module speaks in.

An entry is one whole Gazette append: the byte range [begin, end) of the journal it occupies and
its content. Entries are numbered by `index` (1, 2, ...) in log order, like Raft's log index, and
carry the `term` of the leader that wrote them. The id (term, index) names an entry everywhere;
byte offsets are attributes of it. Indices are needed, not just offsets, because a leader opens
its term with an empty *barrier* entry (begin == end), which shares its end offset with the entry
before it: an acknowledgement of "offset 100" would not say whether the barrier is held.

Ids order by (term, index), which is Raft's "more up to date" order of log heads.

Registers. A journal's registers (Gazette's `check_registers` / `union_registers` /
`subtract_registers`) are part of the log: an entry that changed them carries the whole set
as it is *after* the entry (`registers`; None: unchanged), so that the registers as of any
index are those of the last entry at or before it that carries a set, or the base's. A
truncation drops an entry's register change with the entry, and every member's registers as of
an index agree because their logs do. The core treats a set as an opaque value: the shell
checks and computes it (label selectors are Gazette's, not the protocol's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

Registers = tuple[tuple[str, str], ...]
"""A journal's registers: (name, value) labels, sorted (a Gazette LabelSet's order)."""

NO_REGISTERS: Final[Registers] = ()


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
    [begin, end). A barrier (the first entry of every term) is empty. `registers`: the
    journal's registers after this entry, if it changed them (None: unchanged)."""

    term: int
    index: int
    begin: int
    end: int
    data: bytes
    registers: Registers | None = None

    @property
    def id(self) -> EntryId:
        return EntryId(self.term, self.index)

    def __repr__(self) -> str:
        registers = "" if self.registers is None else f" registers={list(self.registers)}"
        return f"Entry({self.term}.{self.index} [{self.begin},{self.end}){registers})"


@dataclass(frozen=True, slots=True)
class LogBase:
    """The last entry a log dropped after its content reached the snapshot store (or ORIGIN):
    everything at or before it is committed, and readable from that store. `registers`: the
    journal's registers as of it (the store holds content only)."""

    term: int
    index: int
    end: int
    registers: Registers = NO_REGISTERS

    @property
    def id(self) -> EntryId:
        return EntryId(self.term, self.index)


EMPTY_BASE: Final = LogBase(0, 0, 0)
