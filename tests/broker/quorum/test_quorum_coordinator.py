"""The coordinator: claims a term by compare-and-swap, fences, elects the most up-to-date
member, appoints it, watches it, and replaces it when it falls silent."""

from __future__ import annotations

import itertools

import pytest

from broker.quorum.coordinator import (
    COORDINATOR_TRANSITIONS,
    REGISTER,
    CoordEvent,
    CoordState,
)
from broker.quorum.entry import EntryId
from broker.quorum.errors import IllegalTransitionError
from broker.quorum.messages import AddFollower, BecomeLeader, Heartbeat, NewTerm
from broker.quorum.register import MemoryCasRegister, RegisterCas, TermRecord
from broker.quorum.states import ReplicaState
from tests.broker.quorum.quorum_testkit import (
    ENSEMBLE,
    Router,
    cluster,
    coordinator,
    make_log,
)


def _leaders(router: Router) -> list[str]:
    return [n for n, m in router.members.items() if m.state is ReplicaState.LEADER]


def _register_at(record: TermRecord) -> MemoryCasRegister:
    register = MemoryCasRegister(TermRecord(0, "", ENSEMBLE))
    register.compare_and_swap(1, record)
    return register


def test_an_election_appoints_the_most_up_to_date_member() -> None:
    # Term 2's leader (m1) fell silent. m1's log has the latest term: it holds every entry a
    # majority acknowledged; m0's term-1 tail after the common prefix never committed.
    logs = {
        "m0": make_log([(1, b"a"), (1, b"b"), (1, b"c")], term=1),
        "m1": make_log([(1, b"a"), (2, b"")], term=2),
        "m2": make_log([(1, b"a")], term=2),
    }
    register = _register_at(TermRecord(2, "old", ENSEMBLE, "m1"))
    router = Router(cluster(logs), {"c0": coordinator()}, register)
    router.coordinators["c0"].start(0)
    router.tick(60)
    record = router.register.read().record
    assert record == TermRecord(3, "c0", ENSEMBLE, "m1")
    assert _leaders(router) == ["m1"]
    assert router.coordinators["c0"].state is CoordState.MONITORING
    assert router.members["m0"].log.head == router.members["m1"].log.head == EntryId(3, 3)
    assert router.members["m0"].log.read(0, 1) == b"a"


def test_two_coordinators_never_both_own_a_term() -> None:
    router = Router(cluster(), {"c0": coordinator("c0", seed=1), "c1": coordinator("c1", seed=2)})
    for c in router.coordinators.values():
        c.start(0)
    router.run()
    router.tick(60)
    record = router.register.read().record
    assert record.term == 1 and record.leader
    assert len(_leaders(router)) == 1
    claims = [m for _, d, m in router.delivered if d == REGISTER and isinstance(m, RegisterCas)]
    assert {m.coordinator for m in claims if m.record.term == 1 and not m.record.leader} == {
        "c0",
        "c1",
    }
    states = {c.state for c in router.coordinators.values()}
    assert states == {CoordState.MONITORING}


def test_a_silent_leader_is_replaced_in_a_newer_term() -> None:
    router = Router(cluster(), {"c0": coordinator()})
    router.coordinators["c0"].start(0)
    router.tick(10)
    old = router.register.read().record
    assert old.term == 1 and old.leader
    # The leader's heartbeats and replication stop reaching anyone (a partition).
    router.cut = lambda src, dst, msg: old.leader in (src, dst)
    router.tick(80)
    new = router.register.read().record
    assert new.term > old.term and new.leader and new.leader != old.leader
    assert router.members[new.leader].state is ReplicaState.LEADER
    # The old leader is still Leader of term 1 behind its partition, but it can no longer
    # commit: a majority was fenced into the new term.
    router.cut = lambda src, dst, msg: False
    router.tick(20)
    assert router.members[old.leader].state is ReplicaState.FOLLOWER
    assert _leaders(router) == [new.leader]


def test_a_member_that_answers_late_is_added_as_a_follower() -> None:
    router = Router(cluster(), {"c0": coordinator()})
    router.cut = lambda src, dst, msg: dst == "m2" and isinstance(msg, NewTerm)
    router.coordinators["c0"].start(0)
    router.tick(10)
    leader = router.register.read().record.leader
    assert leader and router.members["m2"].state is ReplicaState.NOT_MEMBER
    router.cut = lambda src, dst, msg: False
    router.tick(40)
    assert router.members["m2"].state is ReplicaState.FOLLOWER
    adds = [m for _, _, m in router.delivered if isinstance(m, AddFollower)]
    assert adds and adds[0].follower.member == "m2"
    beats = [m for _, _, m in router.delivered if isinstance(m, Heartbeat)]
    assert "m2" in beats[-1].followers


def test_a_lost_cas_answer_is_recognised_on_retry() -> None:
    lost: list[object] = []

    def cut(src: str, dst: str, msg: object) -> bool:
        # Lose the answer of the first claim: the CAS applied, the coordinator did not hear.
        if src == REGISTER and not lost:
            lost.append(msg)
            return True
        return False

    router = Router(cluster(), {"c0": coordinator()})
    coordinator_ = router.coordinators["c0"]
    coordinator_.start(0)
    router.run()  # the read
    router.cut = cut
    router.tick(30)
    assert router.register.read().record.term == 1  # no second term was claimed
    assert coordinator_.state is CoordState.MONITORING


def test_a_restarted_coordinator_takes_over_a_stalled_election() -> None:
    register = _register_at(TermRecord(1, "c0", ENSEMBLE))  # c0 claimed, then crashed
    router = Router(cluster(), {"c0": coordinator()}, register)
    router.coordinators["c0"].start(0)
    router.run()
    assert router.coordinators["c0"].state is CoordState.WAITING
    router.tick(60)
    record = router.register.read().record
    assert record.term == 2 and record.leader


def test_become_leader_is_resent_until_the_leader_heartbeats() -> None:
    sent: list[int] = []

    def cut(src: str, dst: str, msg: object) -> bool:
        if isinstance(msg, BecomeLeader):
            sent.append(router.now)
            return len(sent) < 3
        return False

    router = Router(cluster(), {"c0": coordinator()})
    router.cut = cut
    router.coordinators["c0"].start(0)
    router.tick(40)
    assert len(sent) == 3 and len(_leaders(router)) == 1


def test_leader_choice_breaks_ties_by_name() -> None:
    logs = {name: make_log([(1, b"x")], term=1) for name in ENSEMBLE}
    register = _register_at(TermRecord(1, "old", ENSEMBLE, "m2"))  # m2 fell silent
    router = Router(cluster(logs), {"c0": coordinator()}, register)
    router.coordinators["c0"].start(0)
    router.tick(60)
    assert router.register.read().record.leader == "m0"
    assert router.members["m0"].log.head == EntryId(2, 2)


@pytest.mark.parametrize(("state", "event"), list(itertools.product(CoordState, CoordEvent)))
def test_coordinator_transitions_outside_the_table_raise(
    state: CoordState, event: CoordEvent
) -> None:
    c = coordinator()
    c.state = state
    if (state, event) in COORDINATOR_TRANSITIONS:
        c._go(event)
        assert c.state is COORDINATOR_TRANSITIONS[(state, event)]
    else:
        with pytest.raises(IllegalTransitionError):
            c._go(event)
        assert c.state is state
