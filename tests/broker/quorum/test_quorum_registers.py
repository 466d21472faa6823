"""Registers in quorum entries (sans-IO core): a leader checks an append against the registers
as of its head; an entry carries the registers it set, so that truncation, compaction, a
Snapshot, a new leader and a log file replay all agree on them; a mismatch is answered only
against committed registers."""

from __future__ import annotations

import struct
from collections.abc import Callable

import google_crc32c
import pytest

from broker.quorum.entry import ORIGIN, Entry, LogBase, Registers
from broker.quorum.errors import EmptyRegisterUpdateError
from broker.quorum.leader import AppendFailed, Committed, RegistersMismatched
from broker.quorum.log import ReplicaLog
from broker.quorum.log_change import EntryAppended, ResetTo
from broker.quorum.log_codec import HEADER, _decode_body, decode_log, encode_change, encode_log
from broker.quorum.log_replay import durable_state, replay, snapshot
from broker.quorum.member import Member
from broker.quorum.messages import (
    AddFollower,
    BecomeLeader,
    NewTermResponse,
    Replicate,
    Snapshot,
    Truncate,
)
from tests.broker.quorum.quorum_testkit import (
    CONFIG,
    ENSEMBLE,
    Router,
    cluster,
    elect,
    new_term,
    response_of,
)

A: Registers = (("owner", "a"),)
B: Registers = (("owner", "b"),)


def is_(expected: Registers) -> Callable[[Registers], bool]:
    return lambda current: current == expected


def set_(after: Registers) -> Callable[[Registers], Registers]:
    return lambda _: after


def notices(member: Member) -> list[object]:
    out = list(member.notices)
    member.notices.clear()
    return out


def test_a_check_sees_uncommitted_entries_and_a_mismatch_waits_for_their_commit() -> None:
    members = cluster()
    router = elect(members, "m0", 1)
    m0 = members["m0"]
    m0.sync(router.now)
    router.run()
    router.cut = lambda src, dst, msg: True  # followers unreachable: nothing commits
    m0.append(b"first", "t1", router.now, is_(()), set_(A))
    m0.sync(router.now)
    # The second checks against the first's registers, not yet committed: it passes.
    m0.append(b"second", "t2", router.now, is_(A), set_(B))
    # The third expects A too, but the head now holds B: a mismatch, not answered yet.
    m0.append(b"", "t3", router.now, is_(A))
    m0.sync(router.now)
    router.run()
    assert notices(m0) == []
    assert m0.log.head_registers == B and m0.log.registers_at(m0.log.commit_index) == ()

    router.cut = lambda src, dst, msg: False
    router.tick(CONFIG.ack_timeout_ticks + 1)
    answers = {n.token: n for n in notices(m0)}
    assert isinstance(answers["t1"], Committed) and answers["t1"].registers == A
    assert isinstance(answers["t2"], Committed) and answers["t2"].registers == B
    mismatch = answers["t3"]
    assert isinstance(mismatch, RegistersMismatched) and mismatch.registers == B
    # Answered at an empty entry after the head it checked (the leader's proof it still led).
    assert mismatch.entry.index == answers["t2"].entry.index + 1
    assert mismatch.end == answers["t2"].end
    for name in ("m1", "m2"):  # every member's registers agree
        assert members[name].log.registers_at(members[name].log.commit_index) == B


def test_a_mismatch_against_registers_a_new_leader_truncates_is_never_answered() -> None:
    members = cluster()
    router = elect(members, "m0", 1)
    m0, m1 = members["m0"], members["m1"]
    m0.sync(router.now)
    router.run()
    router.cut = lambda src, dst, msg: src == "m0" or dst == "m0"  # m0 partitioned
    m0.append(b"lost", "t1", router.now, is_(()), set_(A))  # never committed
    m0.append(b"", "t2", router.now, is_(()))  # fails against A, uncommitted
    m0.sync(router.now)
    assert notices(m0) == []
    # m1 and m2 elect m1 in term 2; m0 comes back and is truncated.
    elect_without(members, "m1", 2, router)
    router.cut = lambda src, dst, msg: False
    response = response_of(m0, 2)
    assert [type(n) for n in notices(m0)] == [AppendFailed, AppendFailed]  # outcome unknown
    m1.handle(_add(response), router.now)
    router.run()
    assert m0.log.head_registers == () and m1.log.head_registers == ()
    # The truncated entry's registers are gone: a check of the committed registers passes.
    m1.append(b"kept", "t3", router.now, is_(()), set_(B))
    m1.sync(router.now)
    router.run()
    router.tick(1)
    (done,) = notices(m1)
    assert isinstance(done, Committed) and done.registers == B
    assert m0.log.registers_at(m0.log.commit_index) == B


def elect_without(members: dict[str, Member], leader: str, term: int, router: Router) -> None:
    """`leader` leads `term`, elected (by hand) by the members other than m0."""
    others = [response_of(m, term) for n, m in members.items() if n not in (leader, "m0")]
    response_of(members[leader], term)
    members[leader].handle(BecomeLeader(term, "c0", ENSEMBLE, tuple(others)), 0)
    members[leader].sync(0)
    router.run()


def _add(response: NewTermResponse) -> AddFollower:
    return AddFollower(response.term, "c0", response)


def test_a_new_leader_holds_the_committed_registers() -> None:
    members = cluster()
    router = elect(members, "m0", 1)
    m0 = members["m0"]
    m0.append(b"x", "t1", router.now, None, set_(A))
    m0.sync(router.now)
    router.run()
    assert isinstance(notices(m0)[0], Committed)
    # m0 dies; m1 leads term 2 and checks against the committed registers.
    elect_without(members, "m1", 2, router)
    m1 = members["m1"]
    assert m1.log.head_registers == A
    m1.append(b"", "t2", router.now, is_(()))
    m1.sync(router.now)
    router.run()
    (mismatch,) = notices(m1)
    assert isinstance(mismatch, RegistersMismatched) and mismatch.registers == A


def test_a_deposed_leader_never_answers_a_mismatch_from_stale_registers() -> None:
    members = cluster()
    router = elect(members, "m0", 1)
    m0, m1 = members["m0"], members["m1"]
    m0.append(b"a", "t1", router.now, None, set_(A))
    m0.sync(router.now)
    router.run()
    assert isinstance(notices(m0)[0], Committed)
    # m0 is partitioned; m1 leads term 2 and commits owner=b with m2.
    router.cut = lambda src, dst, msg: src == "m0" or dst == "m0"
    elect_without(members, "m1", 2, router)
    m1.append(b"b", "t2", router.now, is_(A), set_(B))
    m1.sync(router.now)
    router.run()
    assert [type(n) for n in notices(m1)] == [Committed]
    # m0 still believes it leads term 1, where owner=a is committed: its check for owner=b
    # fails there, but it is never answered from those stale registers.
    m0.append(b"", "stale", router.now, is_(B))
    m0.sync(router.now)
    router.tick(CONFIG.ack_timeout_ticks)
    assert notices(m0) == []
    router.cut = lambda src, dst, msg: False
    router.tick(CONFIG.retry_backoff_max_ticks + 1)  # its followers answer STALE
    assert [type(n) for n in notices(m0)] == [AppendFailed]
    assert m0.leader is None


def test_an_update_that_refuses_or_an_empty_update_changes_nothing() -> None:
    members = cluster()
    router = elect(members, "m0", 1)
    m0 = members["m0"]
    head = m0.log.head

    def refuse(_: Registers) -> Registers:
        raise ValueError("too many labels")

    with pytest.raises(ValueError, match="too many"):
        m0.append(b"x", "t1", router.now, None, refuse)
    with pytest.raises(EmptyRegisterUpdateError):
        m0.append(b"", "t2", router.now, None, set_(A))
    assert m0.log.head == head and notices(m0) == []
    # An update to the same registers writes none (the entry carries no set).
    m0.append(b"y", "t3", router.now, None, set_(()))
    last = m0.log.entry(m0.log.head_index)
    assert last is not None and last.registers is None


def test_compaction_keeps_registers_in_the_base_and_a_snapshot_carries_them() -> None:
    log = ReplicaLog()
    log.append(Entry(1, 1, 0, 0, b""))
    log.append(Entry(1, 2, 0, 3, b"abc", A))
    log.append(Entry(1, 3, 3, 5, b"de"))
    log.sync()
    log.set_commit(3)
    log.compact_through(3)
    assert log.base == LogBase(1, 3, 5, A) and log.head_registers == A
    follower = Member("m1", ReplicaLog(), CONFIG)
    follower.handle(new_term(1), 0)
    follower.handle(Snapshot(1, "m0", log.base, 3), 0)
    assert follower.log.head_registers == A
    # A truncation drops the registers of the entries it drops.
    follower.log.append(Entry(1, 4, 5, 6, b"f", B))
    assert follower.log.head_registers == B
    follower.log.truncate_after(3)
    assert follower.log.head_registers == A


def test_followers_replicate_the_registers_entries_carry() -> None:
    follower = Member("m1", ReplicaLog(), CONFIG)
    follower.handle(new_term(1), 0)
    follower.handle(Truncate(1, "m0", ORIGIN), 0)
    entries = (Entry(1, 1, 0, 0, b""), Entry(1, 2, 0, 1, b"a", A), Entry(1, 3, 1, 2, b"b"))
    follower.handle(Replicate(1, "m0", ORIGIN, entries, 3, 0), 0)
    assert follower.log.registers_at(1) == () and follower.log.registers_at(3) == A


def test_the_log_file_replays_registers_and_old_records_unchanged() -> None:
    log = ReplicaLog()
    log.changes = []
    log.term = 1
    log.append(Entry(1, 1, 0, 0, b""))
    log.append(Entry(1, 2, 0, 2, b"ab", A))
    log.append(Entry(1, 3, 2, 3, b"c", ()))  # registers emptied: an empty set, not None
    log.sync()
    log.set_commit(3)
    replayed = replay(decode_log(encode_log(log.changes)).changes)
    assert durable_state(replayed) == durable_state(log)
    assert replayed.registers_at(2) == A and replayed.registers_at(3) == ()
    log.compact_through(2)
    rewritten = replay(decode_log(encode_log(snapshot(log))).changes)
    assert durable_state(rewritten) == durable_state(log) and rewritten.base.registers == A

    # Records of a file written before registers existed (the documented layout, kinds 5
    # and 8) still replay, and an entry or base without registers is written the same way.
    def record(body: bytes) -> bytes:
        length = struct.pack("<I", len(body))
        crc = int(google_crc32c.extend(google_crc32c.value(length), body))
        return b"\xa7QLR" + length + struct.pack("<I", crc) + body

    old_entry = record(bytes((5,)) + struct.pack("<QQQQ", 2, 8, 10, 12) + b"xy")
    old_base = record(bytes((8,)) + struct.pack("<QQQ", 2, 7, 10))
    old = decode_log(HEADER + old_base + old_entry).changes
    assert old == [ResetTo(LogBase(2, 7, 10)), EntryAppended(Entry(2, 8, 10, 12, b"xy"))]
    assert encode_change(old[0]) == old_base and encode_change(old[1]) == old_entry


def test_damaged_register_records_are_refused_not_misread() -> None:
    body = encode_change(EntryAppended(Entry(1, 1, 0, 1, b"z", A)))
    kind_at = 12  # marker, length, crc
    assert body[kind_at] == 9
    payload = body[kind_at:]
    count_at = 1 + 32
    bad = payload[:count_at] + struct.pack("<I", 1 << 30) + payload[count_at + 4 :]
    assert _decode_body(bad) is None
    assert _decode_body(payload) == EntryAppended(Entry(1, 1, 0, 1, b"z", A))
