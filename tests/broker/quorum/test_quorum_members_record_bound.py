"""The members record (`<root>/quorum-members/<journal>`) stays within `members_recorded_max`
however many times the journal's replicas move: past the bound, members the term register no
longer names are pruned, and the record remembers that it pruned, so that a member it no longer
names starts lost when its log is new (members_record.py, docs/design/quorum.md).

Before, each move added a name for good: the 65th made a record that every later read refused
(MembersRecordDecodeError), and every member's join retried forever: no node of the journal
could start again."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker.keyspace.embedded import EmbeddedStore
from broker.quorum.register import TermRecord
from broker.quorum_shell.journals import open_member_log
from broker.quorum_shell.member_dir import load_incarnation
from broker.quorum_shell.member_registry import MemberRegistry, decide
from broker.quorum_shell.members_record import (
    MembersRecord,
    MembersRecordFullError,
    decode_members_record,
    encode_members_record,
    members_recorded_max,
    with_member,
)
from broker.quorum_shell.term_record import encode_term_record
from broker.topology import quorum_term_key
from tests.broker.quorum.quorum_nodes_testkit import JOURNAL_REVISION, ROOT, J

MOVES = 100  # replica moves, each an add then a remove (f16-ensemble's single steps)
join_timeout_s = 5.0


def _incarnation(name: str) -> str:
    return f"{abs(hash(name)) % (1 << 64):016x}"


def test_more_moves_than_the_bound_keep_the_record_bounded_and_exact_for_the_ensemble() -> None:
    ensemble = ("m0", "m1", "m2")
    record = MembersRecord(JOURNAL_REVISION, {m: _incarnation(m) for m in ensemble})
    gone: list[str] = []  # members moved away, oldest first
    for move in range(MOVES):
        new = f"n{move}"
        # Add first: the register names {E + new}, previous E, while `new` joins (its node
        # starts once the allocator assigned it, before the change settles).
        added = (*ensemble, new)
        keep = set(added) | set(ensemble)
        decision = decide(
            log_new=True,
            mark=None,
            recorded=record.members.get(new),
            incarnation=_incarnation(new),
            pruned=record.pruned > 0,
        )
        # A new member votes while the record never pruned; once it did, it may not vote
        # until a leader caught it up (it could be a pruned member back on a new disk).
        assert decision.lost is (record.pruned > 0), (move, decision)
        record = with_member(record, new, _incarnation(new), keep)
        assert len(record.members) <= members_recorded_max
        assert keep <= set(record.members), move  # the register's members stay recorded
        # Then remove the oldest (settled in between: previous names the four).
        gone.append(ensemble[0])
        ensemble = added[1:]
        assert decode_members_record(encode_members_record(record)) == record

    assert record.pruned == MOVES + 3 - len(record.members) > 0
    assert set(ensemble) <= set(record.members)
    pruned = next(m for m in gone if m not in record.members)
    # A pruned member back on a new disk is lost (it may have acknowledged appends); back
    # with its log it is not (its log is its own).
    for log_new, lost in ((True, True), (False, False)):
        got = decide(
            log_new=log_new,
            mark=None,
            recorded=None,
            incarnation=_incarnation(pruned),
            pruned=True,
        )
        assert got.lost is lost, (log_new, got)


def test_a_record_that_cannot_keep_its_members_refuses_to_grow() -> None:
    full = MembersRecord(JOURNAL_REVISION, {f"m{i}": "a" * 16 for i in range(members_recorded_max)})
    with pytest.raises(MembersRecordFullError):
        with_member(full, "x", "b" * 16, keep=set(full.members))
    assert len(full.members) == members_recorded_max and full.pruned == 0


def test_a_record_never_pruned_is_encoded_as_before() -> None:
    record = MembersRecord(JOURNAL_REVISION, {"m0": "a" * 16})
    assert b"pruned" not in encode_members_record(record)
    assert decode_members_record(encode_members_record(record)) == record


async def test_members_join_a_journal_after_more_moves_than_the_bound(tmp_path: Path) -> None:
    """Through the registry on a keyspace: the record holds `members_recorded_max` names (61
    moved away, and the ensemble's {a, b, c}); the register moves {a, b, c} towards a new member
    d. d joins, pruning the names the register does not hold; then a restarted member, and a
    member back on a new disk, join too (before: the second join never returned)."""
    store = EmbeddedStore()
    backend = store.connect()
    registry = MemberRegistry(backend, ROOT, J, JOURNAL_REVISION)
    members = {f"old{i}": "c" * 16 for i in range(members_recorded_max - 3)}
    for name in ("a", "b", "c"):
        members[name] = _incarnation(name)
    full = encode_members_record(MembersRecord(JOURNAL_REVISION, members))
    await backend.put(registry.key, full)
    register = TermRecord(5, "a#c", ("a", "b", "c", "d"), "a", previous=("a", "b", "c"))
    await backend.put(
        quorum_term_key(ROOT, J).encode(), encode_term_record(register, JOURNAL_REVISION)
    )

    async def join(name: str, data_dir: Path) -> bool:
        log_file, joiner = open_member_log(
            str(data_dir), J, name, load_incarnation(data_dir), registry
        )
        try:
            async with asyncio.timeout(join_timeout_s):
                decision = await joiner.join()
        finally:
            log_file.close()
        assert joiner.last_error is None, joiner.last_error
        return decision.lost

    assert not await join("d", tmp_path / "d")  # never pruned before: d votes at once
    record, _ = await registry.read()
    assert set(record.members) == {"a", "b", "c", "d"}
    assert record.pruned == members_recorded_max - 3
    assert await join("a", tmp_path / "a")  # recorded with another disk: lost, as before
    assert await join("old0", tmp_path / "old0")  # pruned, back on a new disk: lost
    record, _ = await registry.read()
    assert set(record.members) == {"a", "b", "c", "d", "old0"}
    await backend.close()
