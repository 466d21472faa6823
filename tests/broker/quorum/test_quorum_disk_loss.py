"""A member that lost its disk comes back with an empty log: it must not count in an election
until a leader has aligned it and brought it into the term (Rules.may_vote). Counted, it and a
lagging member form a majority that elects the lagging one and drops committed entries."""

from __future__ import annotations

from broker.quorum.entry import EntryId
from broker.quorum.log import ReplicaLog
from broker.quorum.log_replay import replay, snapshot
from broker.quorum.member import Member
from broker.quorum.messages import Replicate, ReplyStatus
from broker.quorum.register import MemoryCasRegister, TermRecord
from broker.quorum.rules import CORRECT_RULES, Rules
from broker.quorum.states import ReplicaState
from tests.broker.quorum.quorum_testkit import (
    CONFIG,
    ENSEMBLE,
    Router,
    cluster,
    coordinator,
    elect,
    make_log,
    response_of,
)
from tests.sim.quorum_mutations import LostDiskVotes


def _after_m0_lost_its_disk(rules: Rules) -> Router:
    # "b" (entry 2.2) is committed: m0 and m1 hold it. m2 lags at 1.1. Then m0's disk is lost
    # and m1, the only other holder, is unreachable.
    members = {
        "m0": Member("m0", ReplicaLog(), CONFIG, rules, lost_state=True, lost_nonce=1),
        "m1": Member("m1", make_log([(1, b"a"), (2, b"b")], term=2, commit=2), CONFIG, rules),
        "m2": Member("m2", make_log([(1, b"a")], term=2, commit=1), CONFIG, rules),
    }
    register = MemoryCasRegister(TermRecord(0, "", ENSEMBLE))
    register.compare_and_swap(1, TermRecord(2, "old", ENSEMBLE, "m1"))
    router = Router(members, {"c0": coordinator(rules=rules)}, register)
    router.cut = lambda src, dst, msg: "m1" in (src, dst)
    router.coordinators["c0"].start(0)
    router.tick(80)
    return router


def _leaders(router: Router) -> list[str]:
    return [n for n, m in router.members.items() if m.state is ReplicaState.LEADER]


def test_a_member_with_a_lost_disk_does_not_elect_a_lagging_member() -> None:
    router = _after_m0_lost_its_disk(CORRECT_RULES)
    assert _leaders(router) == []
    assert router.register.read().record.leader == ""
    assert not router.members["m0"].voter

    router.cut = lambda src, dst, msg: False  # m1 is back: m1 and m2 are a majority of voters
    router.tick(80)
    assert _leaders(router) == ["m1"]
    m0 = router.members["m0"]
    assert m0.voter  # aligned by m1 and holding m1's barrier
    assert m0.log.read(0, 2) == b"ab"
    assert router.members["m2"].log.read(0, 2) == b"ab"


def test_counted_as_a_voter_it_elects_the_lagging_member() -> None:
    # Part three's behaviour (the LostDiskVotes mutation): the scenario above loses "b".
    router = _after_m0_lost_its_disk(LostDiskVotes())
    assert _leaders(router) == ["m2"]
    assert router.members["m0"].log.read(0, 1) == b"a"
    assert router.members["m0"].log.head_end == 1  # "b" at offset 1 is gone from the majority


def test_a_follower_that_lost_its_disk_mid_term_is_aligned_again() -> None:
    # m0 follows m1 in term 2, then comes back with an empty log: the leader's next Replicate
    # is of a term m0 forgot. m0 joins the term as a non-voter and answers LOST; the leader
    # aligns it again from nothing.
    members = {
        "m0": Member("m0", make_log([(1, b"a")], term=1, commit=1), CONFIG),
        "m1": Member("m1", make_log([(1, b"a")], term=1, commit=1), CONFIG),
        "m2": Member("m2", make_log([(1, b"a")], term=1, commit=1), CONFIG),
    }
    router = elect(members, "m1", 2)
    members["m1"].append(b"b", "t1", router.now)
    router.run()
    assert members["m0"].log.read(0, 2) == b"ab"

    members["m0"] = Member("m0", ReplicaLog(), CONFIG, lost_state=True, lost_nonce=1)
    members["m1"].append(b"c", "t2", router.now)
    router.run()
    statuses = [m.status for s, d, m in router.delivered if s == "m0" and d == "m1"]
    assert ReplyStatus.LOST in statuses
    m0 = members["m0"]
    assert m0.term == 2 and m0.state is ReplicaState.FOLLOWER
    assert m0.log.read(0, 3) == b"abc" and m0.voter


def test_two_lost_disks_of_three_block_the_election_with_a_reason() -> None:
    # m0 and m1 lost their disks; only m2 kept its log. No quorum of voters can ever form: the
    # coordinator says why (election_blocked) and elects no one, however long it runs.
    members = {
        "m0": Member("m0", ReplicaLog(), CONFIG, lost_state=True, lost_nonce=1),
        "m1": Member("m1", ReplicaLog(), CONFIG, lost_state=True, lost_nonce=1),
        "m2": Member("m2", make_log([(1, b"a")], term=2, commit=1), CONFIG),
    }
    register = MemoryCasRegister(TermRecord(0, "", ENSEMBLE))
    register.compare_and_swap(1, TermRecord(2, "old", ENSEMBLE, "m1"))
    router = Router(members, {"c0": coordinator()}, register)
    router.coordinators["c0"].start(0)
    router.tick(200)
    blocked = router.coordinators["c0"].election_blocked
    assert blocked is not None
    assert blocked.non_voters == ("m0", "m1") and blocked.voters_needed == 2
    assert "m0, m1" in str(blocked)
    assert _leaders(router) == [] and router.register.read().record.leader == ""


def test_one_lost_disk_of_three_does_not_block() -> None:
    router = _after_m0_lost_its_disk(CORRECT_RULES)
    assert router.coordinators["c0"].election_blocked is None
    router.cut = lambda src, dst, msg: False
    router.tick(80)
    assert _leaders(router) == ["m1"]
    assert router.coordinators["c0"].election_blocked is None


def _snapshot_below_an_entry_it_acknowledged() -> tuple[dict[str, Member], Router, EntryId]:
    """m2 acknowledged X (m0 commits X with it, m1 lagging), loses its disk, and m0 (which
    compacted below X) aligns m2's new log by a Snapshot whose base is below X; every
    Replicate carrying entries to m2 is lost. m2 then holds an entry of the aligning term
    (m0's barrier) but not X: m0 is the only one holding X durably."""
    members = cluster()
    router = elect(members, "m0", 1)
    m0 = members["m0"]
    for i in range(6):  # 6 x 100 bytes: past compact_at_fraction of log_bytes_max
        m0.append(bytes([65 + i]) * 100, i, router.now)
        m0.sync(router.now)
        router.run()
    stored = m0.log.head_end
    router.cut = lambda src, dst, msg: "m1" in (src, dst)  # m1 lags from here
    m0.append(b"X" * 100, "x", router.now)
    m0.sync(router.now)
    router.run()
    x = m0.log.head
    assert m0.log.commit_index == x.index and members["m2"].log.has(x)
    m0.on_stored(stored)  # the store holds everything before X: m0 compacts below X
    assert m0.log.base.index < x.index
    members["m2"] = Member("m2", ReplicaLog(), CONFIG, lost_state=True, lost_nonce=1)
    router.cut = lambda src, dst, msg: (
        "m1" in (src, dst) or (dst == "m2" and isinstance(msg, Replicate) and msg.entries != ())
    )
    router.tick(CONFIG.retry_backoff_max_ticks * 2)
    return members, router, x


def test_a_member_aligned_below_an_entry_it_acknowledged_does_not_vote() -> None:
    members, router, x = _snapshot_below_an_entry_it_acknowledged()
    m1, m2 = members["m1"], members["m2"]
    assert m2.log.aligned_term == 1 and not m2.log.has(x)  # aligned, short of X
    assert not m1.log.has(x)
    # A quorum of voters {m1, m2} would hold no X: m2 must not count.
    assert not m2.voter
    assert m2.log.aligned_head.index >= x.index  # m0's head when it sent the Snapshot

    router.cut = lambda src, dst, msg: "m1" in (src, dst)  # m2 gets X: now it votes
    router.tick(CONFIG.retry_backoff_max_ticks * 2)
    assert m2.log.holds_durably(x) and m2.voter
    assert response_of(m2, 2).voter


def test_the_catch_up_target_survives_a_restart() -> None:
    members, router, x = _snapshot_below_an_entry_it_acknowledged()
    m2 = members["m2"]
    # The broker restarts m2 from its log file (still marked lost: it had not caught up).
    restarted = Member("m2", replay(snapshot(m2.log)), CONFIG, lost_state=True, lost_nonce=1)
    assert restarted.log.aligned_term == 1 and not restarted.voter
    members["m2"] = restarted
    router.cut = lambda src, dst, msg: "m1" in (src, dst)
    router.tick(CONFIG.retry_backoff_max_ticks * 2)
    assert restarted.log.holds_durably(x) and restarted.voter


def test_a_lost_member_that_joined_a_stale_term_joins_the_current_one() -> None:
    # Seed 1524: m0 comes back with an empty log; a Replicate of term 2 from a deposed leader,
    # late in the network, arrives first (m0 joins term 2, answers LOST), then the current
    # leader's message of term 5. m0 forgot term 5 just as it forgot term 2: it joins it
    # and answers LOST (never TermNotJoinedError), and that leader aligns it.
    m0 = Member("m0", ReplicaLog(), CONFIG, lost_state=True, lost_nonce=1)
    stale = Replicate(2, "m1", EntryId(2, 3), (), 3, 0)
    m0.handle(stale, 0)
    assert m0.term == 2
    current = Replicate(5, "m2", EntryId(5, 9), (), 8, 0)
    m0.handle(current, 1)
    assert m0.term == 5 and not m0.voter
    answers = [(to, msg.term, msg.status) for to, msg in m0.outbox]
    assert answers == [("m1", 2, ReplyStatus.LOST), ("m2", 5, ReplyStatus.LOST)]
