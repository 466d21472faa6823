"""Which members ever joined a quorum journal, and with which disk: the keyspace's memory of a
member that lost its disk.

`<root>/quorum-members/<journal>` holds a JSON record (members_record.py): the journal's
identity and, per member name, the incarnation of the broker disk it joined with. A member is recorded *before it takes part* (before it answers NewTerm or
acknowledges anything): so a member that could have acknowledged an append is always found
here, after its disk is gone too. Written by each member for itself, by compare-and-swap on the
key's mod revision (members of one journal may register at once; the loser re-reads).

`decide` is the rule (pure): a member whose log is new while the record shows it joined is
*lost* (`Member.begin_lost`: no vote until caught up). A member not recorded is joining a
journal for the first time (a fresh journal's late starter included: it never answered, so it
acknowledged nothing), and votes. `join` runs the rule against the keyspace.

A member whose log is in memory (its broker has no data directory: `Joiner.member_dir` None)
has a new log at every start of its node, so it is treated as a member that lost its disk at
every start: lost whenever the record shows it joined before, under the incarnation its broker
drew for this process (`memory_incarnation`), and with no marks (nothing survives a restart to
hold them). One exception, since no mark tells a member that recorded itself and stopped
before it took part: while the term register holds no term, no member ever answered NewTerm
or acknowledged anything, so an empty log is whole and the member votes (a brand-new journal
whose members all restarted before the first election still elects).
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from broker import metrics
from broker.keyspace.backend import (
    Backend,
    Compare,
    CompareResult,
    CompareTarget,
    KeySpaceError,
    OpGet,
    OpPut,
)
from broker.logging import get_logger
from broker.quorum_shell.member_dir import Mark, clear_mark, write_mark
from broker.quorum_shell.members_record import (
    MembersRecord,
    MembersRecordDecodeError,
    MembersRecordFullError,
    decode_members_record,
    encode_members_record,
    members_recorded_max,
    quorum_members_key,
    with_member,
)
from broker.quorum_shell.term_record import TermRecordDecodeError, versioned_of
from broker.topology import quorum_term_key

log = get_logger(__name__)

# Register attempts back off from join_backoff_initial_s, doubling to join_backoff_max_s; they
# never give up (the member cannot take part before it is recorded), and the last error is kept.
join_backoff_initial_s: Final = 0.05
join_backoff_max_s: Final = 2.0


@dataclass(frozen=True, slots=True)
class Decision:
    lost: bool
    reason: str


_PRUNED: Final = "not recorded, but the record pruned members: it may have joined before"
_IN_MEMORY: Final = (
    "its log was in memory (no data directory) and is empty at every start of its node"
)
# The prefix of an in-memory member's incarnation (a data directory's is 16 hex digits alone).
MEMORY_INCARNATION_PREFIX: Final = "memory-"


def memory_incarnation() -> str:
    """A broker without a data directory: the incarnation its members record (new for each
    process, as a lost disk's would be)."""
    return MEMORY_INCARNATION_PREFIX + secrets.token_hex(8)


def decide(
    *,
    log_new: bool,
    mark: Mark | None,
    recorded: str | None,
    incarnation: str,
    pruned: bool = False,
) -> Decision:
    """Whether a member starts lost. `log_new`: its log file was new at this start; `mark`: the
    mark found beside it; `recorded`: the incarnation the keyspace records it joined with (None:
    not recorded); `incarnation`: this broker's; `pruned`: the record pruned members
    (members_record.py), so that "not recorded" no longer means "never joined"."""
    if mark is Mark.LOST:
        return Decision(True, "lost its disk before and is not caught up yet (mark)")
    if mark is Mark.JOINING:
        # A start that wrote the mark, then stopped before it was cleared: the member answered
        # nothing since. Recorded with this very disk: it recorded itself, then stopped.
        if recorded == incarnation or (recorded is None and not pruned):
            return Decision(False, "joins (first time)")
        if recorded is None:
            return Decision(True, _PRUNED)
        return Decision(True, f"joined with disk {recorded}; this disk is {incarnation}")
    if not log_new:
        return Decision(False, "has its log")
    if recorded is None:
        if pruned:
            return Decision(True, _PRUNED)
        return Decision(False, "joins (first time)")
    if recorded == incarnation:
        return Decision(True, "joined with this disk, but its log file is gone")
    return Decision(True, f"joined with disk {recorded}; this disk is {incarnation}")


class MemberRegistry:
    """`<root>/quorum-members/<journal>` on `backend`, for journal identity `journal_revision`."""

    def __init__(self, backend: Backend, root: str, journal: str, journal_revision: int) -> None:
        self._backend = backend
        self.key = quorum_members_key(root, journal).encode()
        self._term_key = quorum_term_key(root, journal).encode()
        self.journal_revision = journal_revision

    async def read(self) -> tuple[MembersRecord, int]:
        """The record (empty if absent or of an earlier journal of this name) and the key's mod
        revision (0: absent)."""
        resp = await self._backend.range(self.key)
        if not resp.kvs:
            return MembersRecord(self.journal_revision), 0
        kv = resp.kvs[0]
        record = decode_members_record(kv.value)
        if record.journal_revision != self.journal_revision:
            return MembersRecord(self.journal_revision), kv.mod_revision
        return record, kv.mod_revision

    async def record(
        self, current: MembersRecord, expect_revision: int, member: str, incarnation: str
    ) -> bool:
        """Record `member` with `incarnation` in `current` (as read at `expect_revision`),
        pruning members the term register no longer names if the record is full
        (members_record.py); False if the key moved meanwhile."""
        keep: frozenset[str] = frozenset()
        if member not in current.members and len(current.members) >= members_recorded_max:
            keep = await self._register_members()
        updated = with_member(current, member, incarnation, keep)
        if updated.pruned != current.pruned:
            log.info(
                "quorum members record pruned",
                key=self.key.decode(),
                pruned=updated.pruned - current.pruned,
                kept=len(updated.members),
            )
        value = encode_members_record(updated)
        compare = Compare(self.key, CompareTarget.MOD, CompareResult.EQUAL, expect_revision)
        resp = await self._backend.txn([compare], [OpPut(self.key, value)], [OpGet(self.key)])
        return resp.succeeded

    async def register_term(self) -> int:
        """The term register's current term (0: the journal never had one)."""
        resp = await self._backend.range(self._term_key)
        return versioned_of(resp.kvs, (), self.journal_revision).record.term

    async def _register_members(self) -> frozenset[str]:
        """The members the journal's term register names: its ensemble and `previous` (none
        if it has no term yet)."""
        resp = await self._backend.range(self._term_key)
        record = versioned_of(resp.kvs, (), self.journal_revision).record
        return frozenset(record.ensemble) | frozenset(record.previous)


@dataclass
class Joiner:
    """One member's join of its journal at a node's start (see the module docstring): decide,
    persist the decision's mark, record the member, clear a `joining` mark. Crash-safe in every
    order: a `lost` mark is written before the keyspace records this disk, and a `joining`
    mark is cleared only after it does."""

    registry: MemberRegistry
    member: str
    incarnation: str
    member_dir: Path | None  # None: the log is in memory (see the module docstring)
    log_new: bool
    mark_found: Mark | None  # the mark as this start found it (decide's input)
    mark: Mark | None  # the mark on disk now (a new log's `joining` written since)
    last_error: Exception | None = None

    @classmethod
    def in_memory(cls, registry: MemberRegistry, member: str, incarnation: str) -> Joiner:
        """The joiner of a member whose log is in memory (see the module docstring): new at
        every start, no marks."""
        return cls(registry, member, incarnation, None, True, None, None)

    async def join(self) -> Decision:
        backoff = join_backoff_initial_s
        while True:
            try:
                decision = await self._attempt()
            except (
                KeySpaceError,
                MembersRecordDecodeError,
                MembersRecordFullError,
                TermRecordDecodeError,
            ) as err:
                self.last_error = err
                log.warning(
                    "quorum member registry", key=self.registry.key.decode(), error=str(err)
                )
                decision = None
            if decision is not None:
                return decision
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, join_backoff_max_s)

    async def _attempt(self) -> Decision | None:
        record, revision = await self.registry.read()
        recorded = record.members.get(self.member)
        decision = decide(
            log_new=self.log_new,
            mark=self.mark_found,
            recorded=recorded,
            incarnation=self.incarnation,
            pruned=record.pruned > 0,
        )
        if self.member_dir is None:
            decision = await self._in_memory(decision)
        elif decision.lost and self.mark is not Mark.LOST:
            write_mark(self.member_dir, Mark.LOST)  # before the keyspace forgets the old disk
            self.mark = Mark.LOST
        if recorded != self.incarnation:
            if not await self.registry.record(record, revision, self.member, self.incarnation):
                return None  # another member registered meanwhile: read again
        if not decision.lost and self.mark is Mark.JOINING and self.member_dir is not None:
            clear_mark(self.member_dir)
            self.mark = None
        if decision.lost:
            metrics.QUORUM_LOST_DISKS.inc()
            log.warning(
                "quorum member lost its disk: it does not vote until a leader caught it up",
                key=self.registry.key.decode(),
                member=self.member,
                reason=decision.reason,
            )
        return decision

    async def _in_memory(self, decision: Decision) -> Decision:
        """`decide`'s answer for a member whose log is in memory (see the module docstring)."""
        if not decision.lost:
            return decision  # never joined (its log is new at every start)
        if await self.registry.register_term() == 0:
            return Decision(
                False, "joins: the journal never had a term, so nothing was acknowledged"
            )
        return Decision(True, f"{decision.reason}; {_IN_MEMORY}")
