"""The leader: its barrier, the commit rule in action, follower cursors (window, gaps,
retries), catch-up of a lagging or new follower from the log or a snapshot, and stepping down."""

from __future__ import annotations

import itertools

import pytest

from broker.quorum.cursor import CursorState
from broker.quorum.entry import EntryId
from broker.quorum.errors import LogFullError, NotLeaderError, PendingAppendsFullError
from broker.quorum.leader import AppendFailed, Committed, LeaderRole
from broker.quorum.log import ReplicaLog
from broker.quorum.member import Member
from broker.quorum.messages import (
    AddFollower,
    BecomeLeader,
    Heartbeat,
    ReplicaResponse,
    Replicate,
    Snapshot,
    Truncate,
)
from broker.quorum.states import ReplicaState
from tests.broker.quorum.quorum_testkit import (
    CONFIG,
    ENSEMBLE,
    Router,
    cluster,
    elect,
    make_log,
    new_term,
    response_of,
)


def _leader(member: Member) -> LeaderRole:
    assert member.leader is not None
    return member.leader


def test_a_term_opens_with_a_barrier_and_aligns_every_follower() -> None:
    members = cluster()
    elect(members, "m0", 1)
    m0 = members["m0"]
    assert m0.state is ReplicaState.LEADER and m0.log.head == EntryId(1, 1)
    for name in ("m1", "m2"):
        assert members[name].state is ReplicaState.FOLLOWER
        assert members[name].log.head == EntryId(1, 1)
        assert _leader(m0).cursors[name].state is CursorState.STREAMING
    # Both followers hold the barrier: committed though the leader has not synced it yet.
    assert _leader(m0).commit_index == 1
    assert m0.log.commit_index == 0  # read-visible only once durable here
    m0.sync(0)
    assert m0.log.commit_index == 1


def test_an_append_commits_once_a_majority_holds_it() -> None:
    members = cluster()
    router = elect(members, "m0", 1)
    m0 = members["m0"]
    m0.sync(0)
    router.cut = lambda src, dst, msg: dst == "m2" or src == "m2"
    m0.append(b"hello", "t1", router.now)
    router.run()
    # m1 holds it; the leader has not synced it: one of three.
    assert m0.notices == [] and _leader(m0).commit_index == 1
    m0.sync(router.now)
    assert m0.notices == [Committed("t1", EntryId(1, 2), 0, 5)]
    assert m0.read_limit == 5


def test_a_majority_of_followers_commits_before_the_leader_syncs() -> None:
    members = cluster()
    router = elect(members, "m0", 1)
    m0 = members["m0"]
    m0.append(b"abc", "t", router.now)
    router.run()
    assert m0.notices == [Committed("t", EntryId(1, 2), 0, 3)]
    assert m0.read_limit == 0  # not durable on the leader yet: not read-visible there


def test_followers_learn_the_commit_offset_on_later_messages() -> None:
    members = cluster()
    router = elect(members, "m0", 1)
    m0, m1 = members["m0"], members["m1"]
    m0.sync(0)
    m0.append(b"abc", "t", router.now)
    router.run()
    m0.sync(router.now)
    assert _leader(m0).commit_index == 2
    assert m1.log.commit_index < 2 and m1.read_limit == 0  # it acked before the commit
    router.tick(CONFIG.heartbeat_interval_ticks)
    assert m1.log.commit_index == 2 and m1.read_limit == 3


def test_unacknowledged_messages_per_follower_are_bounded() -> None:
    members = cluster()
    router = elect(members, "m0", 1)
    m0 = members["m0"]
    router.cut = lambda src, dst, msg: src == "m1"  # m1's answers are lost
    sent_before = len(router.delivered)
    for i in range(10):
        m0.append(b"x%d" % i, i, router.now)
    router.run()
    to_m1 = [
        m for s, d, m in router.delivered[sent_before:] if d == "m1" and isinstance(m, Replicate)
    ]
    assert len(to_m1) == CONFIG.inflight_messages_max
    assert _leader(m0).cursors["m1"].inflight == CONFIG.inflight_messages_max


def test_a_silent_follower_is_retried_from_its_acknowledgement_then_catches_up() -> None:
    members = cluster()
    router = elect(members, "m0", 1)
    m0 = members["m0"]
    router.cut = lambda src, dst, msg: "m2" in (src, dst)
    for i in range(5):
        m0.append(b"abc%d" % i, i, router.now)
    router.tick(100)
    cursor = _leader(m0).cursors["m2"]
    assert cursor.backoff == CONFIG.retry_backoff_max_ticks
    assert cursor.window == 1  # one message at a time while it is silent
    assert cursor.last_pushed <= cursor.ack_index + CONFIG.replicate_entries_max
    router.cut = lambda src, dst, msg: False
    router.tick(CONFIG.retry_backoff_max_ticks + 1)
    assert members["m2"].log.head == m0.log.head
    assert cursor.ack_index == m0.log.head_index
    assert cursor.window == CONFIG.inflight_messages_max
    assert cursor.backoff == CONFIG.ack_timeout_ticks


def test_retries_to_a_silent_follower_back_off_exponentially() -> None:
    members = cluster()
    router = elect(members, "m0", 1)
    m0 = members["m0"]
    sends: list[int] = []

    def cut(src: str, dst: str, msg: object) -> bool:
        if dst == "m2" and isinstance(msg, Replicate):
            sends.append(router.now)
            return True
        return False

    router.cut = cut
    m0.append(b"abc", "t", router.now)
    router.run()
    router.tick(300)
    gaps = [b - a for a, b in itertools.pairwise(sends)]
    assert gaps[:3] == [10, 20, 40], gaps
    assert max(gaps) == CONFIG.retry_backoff_max_ticks


def test_a_gap_rewinds_the_cursor_to_the_followers_head() -> None:
    members = cluster()
    router = elect(members, "m0", 1)
    m0, m1 = members["m0"], members["m1"]
    dropped: list[object] = []

    def cut(src: str, dst: str, msg: object) -> bool:
        if dst == "m1" and isinstance(msg, Replicate) and msg.entries and not dropped:
            dropped.append(msg)
            return True
        return False

    router.cut = cut
    for i in range(4):
        m0.append(b"y%d" % i, i, router.now)
    router.run()
    # The second message did not continue m1's log: m1 answered GAP and got the rest again.
    gaps = [
        m
        for s, d, m in router.delivered
        if isinstance(m, ReplicaResponse) and m.status.value == "gap"
    ]
    assert gaps
    router.tick(CONFIG.heartbeat_interval_ticks)
    assert m1.log.head == m0.log.head


def test_a_new_member_catches_up_from_the_log_and_then_counts() -> None:
    members = cluster()
    router = Router(members)
    # m2 takes no part in term 1's election.
    m0, m1, m2 = members["m0"], members["m1"], members["m2"]
    r1 = response_of(m1, 1)
    response_of(m0, 1)
    m0.handle(BecomeLeader(1, "c0", ENSEMBLE, (r1,)), 0)
    router.run()
    m0.sync(0)
    for i in range(5):
        m0.append(b"z%d" % i, i, router.now)
    router.run()
    assert m2.state is ReplicaState.NOT_MEMBER
    # Late: fenced, then added by the coordinator; it catches up from the leader's log.
    m0.handle(AddFollower(1, "c0", response_of(m2, 1)), router.now)
    router.run()
    assert m2.state is ReplicaState.FOLLOWER and m2.log.head == m0.log.head
    # It now counts: with m1 silent, m0 and m2 commit.
    router.cut = lambda src, dst, msg: "m1" in (src, dst)
    m0.append(b"late", "late", router.now)
    router.run()
    m0.sync(router.now)
    assert m0.notices[-1] == Committed("late", m0.log.head, m0.log.head_end - 4, m0.log.head_end)


def test_a_follower_behind_the_compacted_log_catches_up_from_a_snapshot() -> None:
    members = cluster()
    router = elect(members, "m0", 1)
    m0, m2 = members["m0"], members["m2"]
    router.cut = lambda src, dst, msg: "m2" in (src, dst)
    for i in range(40):
        m0.append(b"0123456789abcdefghijklmnopqrst" + b"%02d" % i, i, router.now)
        router.run()
        m0.sync(router.now)
        m0.on_stored(m0.read_limit)  # the store holds everything committed
    assert m0.log.base.index > m2.log.head_index  # m2's next entries are gone from m0's log
    snapshots: list[Snapshot] = []

    def watch(src: str, dst: str, msg: object) -> bool:
        if isinstance(msg, Snapshot):
            snapshots.append(msg)
        return False

    router.cut = watch
    router.tick(CONFIG.retry_backoff_max_ticks + CONFIG.heartbeat_interval_ticks)
    assert snapshots and snapshots[0].base.index > 1
    assert m2.state is ReplicaState.FOLLOWER
    assert m2.log.head == m0.log.head
    assert m2.log.base.index >= snapshots[0].base.index
    assert m2.read_limit == m0.read_limit


def test_a_full_log_or_too_many_pending_appends_are_refused_unchanged() -> None:
    members = cluster()
    router = elect(members, "m0", 1)
    m0 = members["m0"]
    router.cut = lambda src, dst, msg: True  # nothing commits
    with pytest.raises(LogFullError):
        m0.append(b"x" * (CONFIG.log_bytes_max + 1), "big", router.now)
    for i in range(CONFIG.pending_appends_max):
        m0.append(b"p", i, router.now)
    head = m0.log.head
    with pytest.raises(PendingAppendsFullError):
        m0.append(b"p", "one too many", router.now)
    assert m0.log.head == head


def test_only_the_leader_takes_appends() -> None:
    members = cluster()
    elect(members, "m0", 1)
    with pytest.raises(NotLeaderError) as err:
        members["m1"].append(b"x", "t", 0)
    assert err.value.leader_hint == "m0"


def test_a_deposed_leader_steps_down_and_fails_its_pending_appends() -> None:
    members = cluster()
    router = elect(members, "m0", 1)
    m0, m1 = members["m0"], members["m1"]
    m1.handle(new_term(2), 0)
    m1.outbox.clear()
    m0.append(b"lost?", "t", router.now)
    router.run()
    assert m0.state is ReplicaState.FENCED and m0.term == 2 and m0.leader is None
    assert m0.notices == [AppendFailed("t", "m0 stopped leading term 1")]


def test_an_empty_append_is_a_barrier_answered_once_an_entry_of_its_term_commits() -> None:
    members = cluster()
    router = elect(members, "m0", 1)
    m0 = members["m0"]
    m0.append(b"abc", "data", router.now)
    m0.sync(router.now)
    router.run()
    assert [type(n) for n in m0.notices] == [Committed]
    m0.notices.clear()
    head = m0.log.head
    m0.append(b"", "barrier", router.now)
    # Everything before it is committed, yet it is not answered until its own (empty) entry
    # of this term commits: that is what proves this leader still leads.
    assert m0.notices == [] and m0.log.head == EntryId(1, head.index + 1)
    m0.sync(router.now)
    router.run()
    assert m0.notices == [Committed("barrier", EntryId(1, head.index + 1), 3, 3)]


def test_a_deposed_leader_never_answers_an_empty_append_with_a_stale_head() -> None:
    # A leader stopped (SIGSTOP) while another was elected and committed more, then resumed
    # not yet knowing it: an empty append asks it for the journal's head. Answered from its
    # own committed entries it said 3, while a newer leader had acknowledged [3, 6).
    members = cluster()
    router = elect(members, "m0", 1)
    m0, m1 = members["m0"], members["m1"]
    m0.append(b"abc", "t1", router.now)
    m0.sync(router.now)
    router.run()
    assert [type(n) for n in m0.notices] == [Committed]
    m0.notices.clear()
    router.cut = lambda src, dst, msg: src == "m0" or dst == "m0"
    others = [response_of(m, 2) for n, m in members.items() if n not in ("m0", "m1")]
    response_of(m1, 2)
    m1.handle(BecomeLeader(2, "c0", ENSEMBLE, tuple(others)), 0)
    m1.sync(0)
    router.run()
    m1.append(b"def", "t2", router.now)
    m1.sync(router.now)
    router.run()
    assert [n.end for n in m1.notices if isinstance(n, Committed)] == [6]
    m0.append(b"", "barrier", router.now)
    m0.sync(router.now)
    router.tick(CONFIG.ack_timeout_ticks)
    assert m0.notices == []  # Not answered from its stale commit.
    router.cut = lambda src, dst, msg: False
    router.tick(CONFIG.retry_backoff_max_ticks + 1)  # Its followers answer STALE.
    assert [type(n) for n in m0.notices] == [AppendFailed]
    assert m0.leader is None


def test_heartbeats_tell_coordinators_the_followers() -> None:
    members = cluster()
    router = elect(members, "m0", 1)
    m0 = members["m0"]
    m0.outbox.clear()
    m0.tick(router.now + CONFIG.heartbeat_interval_ticks)
    beats = [m for _, m in m0.outbox if isinstance(m, Heartbeat)]
    assert beats and beats[0].followers == ("m1", "m2") and beats[0].term == 1


def test_a_leader_that_restarted_does_not_lead_its_term_again() -> None:
    # Found by the simulation (seed 84): the leader sent an unsynced entry to a follower and
    # crashed; a re-delivered BecomeLeader made it lead the same term with another entry at
    # that index. Leading is once per term.
    members = cluster()
    router = elect(members, "m0", 1)
    m0 = members["m0"]
    router.cut = lambda src, dst, msg: dst == "m2"
    m0.sync(0)
    m0.append(b"unsynced", "t", router.now)
    router.run()  # m1 holds entry 1.2; m0 never synced it
    assert members["m1"].log.head == EntryId(1, 2)
    m0.log.crash()
    restarted = Member("m0", m0.log, CONFIG)
    assert restarted.state is ReplicaState.FENCED and restarted.log.head == EntryId(1, 1)
    restarted.handle(BecomeLeader(1, "c0", ENSEMBLE, ()), router.now)
    assert restarted.state is ReplicaState.FENCED and restarted.leader is None
    assert restarted.log.head == EntryId(1, 1)


def test_a_follower_never_truncates_below_its_commit() -> None:
    log = make_log([(1, b"ab"), (1, b"cd")], term=1, commit=2)
    member = Member("m1", log, CONFIG)
    member.handle(new_term(2), 0)
    with pytest.raises(Exception, match="below commit"):
        member.handle(Truncate(2, "m0", EntryId(1, 1)), 0)
    assert member.log.head == EntryId(1, 2) and member.state is ReplicaState.FENCED


def test_an_aligned_follower_refuses_entries_that_disagree_with_its_log() -> None:
    log = make_log([(1, b"ab")], term=1)
    member = Member("m1", log, CONFIG)
    member.handle(new_term(2), 0)
    member.handle(Truncate(2, "m0", EntryId(1, 1)), 0)
    with pytest.raises(Exception, match="holds no"):
        member.handle(Replicate(2, "m0", EntryId(2, 1), (), 0, 0), 0)
    assert member.log.head == EntryId(1, 1)


def test_leader_hints_reach_clients() -> None:
    log = ReplicaLog()
    assert Member("m9", log, CONFIG).leader_hint == ""


def test_a_new_leader_compacts_content_its_predecessor_stored() -> None:
    # Found by the simulation (seed 6698): the store already held everything, so the new
    # leader never uploaded, never compacted, and refused appends for ever (log full).
    entries = [(1, b"x" * 100)] * 9  # 900 bytes, over half of log_bytes_max
    members = cluster({name: make_log(entries, term=1) for name in ("m0", "m1", "m2")})
    for member in members.values():
        member.on_stored(900)  # stored by term 1's leader; not yet known committed here
    router = elect(members, "m1", 2)
    m1 = members["m1"]
    m1.sync(router.now)
    assert m1.log.commit_index == 10  # the barrier committed the term-1 entries
    assert m1.log.base.index == 9  # ... and what the store holds was compacted
    m1.append(b"y" * 200, "t", router.now)
    router.run()
    assert m1.notices == [Committed("t", EntryId(2, 11), 900, 1100)]
