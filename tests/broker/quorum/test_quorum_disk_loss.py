"""A member that lost its disk comes back with an empty log: it must not count in an election
until a leader has aligned it and brought it into the term (Rules.may_vote). Counted, it and a
lagging member form a majority that elects the lagging one and drops committed entries."""

from __future__ import annotations

from broker.quorum.log import ReplicaLog
from broker.quorum.member import Member
from broker.quorum.messages import ReplyStatus
from broker.quorum.register import MemoryCasRegister, TermRecord
from broker.quorum.rules import CORRECT_RULES, Rules
from broker.quorum.states import ReplicaState
from tests.broker.quorum.quorum_testkit import (
    CONFIG,
    ENSEMBLE,
    Router,
    coordinator,
    elect,
    make_log,
)
from tests.sim.quorum_mutations import LostDiskVotes


def _after_m0_lost_its_disk(rules: Rules) -> Router:
    # "b" (entry 2.2) is committed: m0 and m1 hold it. m2 lags at 1.1. Then m0's disk is lost
    # and m1, the only other holder, is unreachable.
    members = {
        "m0": Member("m0", ReplicaLog(), CONFIG, rules, lost_state=True),
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

    members["m0"] = Member("m0", ReplicaLog(), CONFIG, lost_state=True)
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
        "m0": Member("m0", ReplicaLog(), CONFIG, lost_state=True),
        "m1": Member("m1", ReplicaLog(), CONFIG, lost_state=True),
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
