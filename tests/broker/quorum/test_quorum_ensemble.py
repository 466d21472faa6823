"""Ensemble changes in the core: the coordinator moves the term register's ensemble towards
the one its host wants, one member per term and only from a settled record (Rules.
next_ensemble); a change settles once the new term's leader says its barrier committed."""

from __future__ import annotations

import random

from broker.quorum.config import CoordinatorConfig
from broker.quorum.coordinator import Coordinator, CoordState
from broker.quorum.log import ReplicaLog
from broker.quorum.member import Member
from broker.quorum.messages import BecomeLeader, Heartbeat, NewTerm
from broker.quorum.register import MemoryCasRegister, TermRecord
from broker.quorum.rules import CORRECT_RULES, Rules, ensemble_step
from broker.quorum.states import ReplicaState
from broker.quorum_shell.term_record import (
    TermRecordDecodeError,
    decode_term_record,
    encode_term_record,
)
from broker.quorum_shell.wire import Envelope, decode_envelope, encode_envelope
from tests.broker.quorum.quorum_testkit import CONFIG, Router
from tests.sim.quorum_mutations import (
    ChangeBeforeEstablished,
    KeepABlockedChange,
    ReplaceInOneStep,
)

ABC = ("a", "b", "c")


def test_a_replacement_is_an_addition_then_a_removal() -> None:
    assert ensemble_step(ABC, ("b", "c", "d")) == ("a", "b", "c", "d")
    assert ensemble_step(("a", "b", "c", "d"), ("b", "c", "d")) == ("b", "c", "d")
    assert ensemble_step(ABC, ABC) == ABC
    assert ensemble_step(("a",), ()) == ("a",)  # never below one member


def test_a_dead_member_is_removed_before_its_successor_is_added() -> None:
    dead = frozenset({"a"})
    assert ensemble_step(ABC, ("b", "c", "d"), dead) == ("b", "c")
    assert ensemble_step(("b", "c"), ("b", "c", "d"), dead) == ("b", "c", "d")
    # Another doubtful member: removing first could leave two that cannot elect; add first.
    assert ensemble_step(ABC, ("b", "c", "d"), frozenset({"a", "b"})) == ("a", "b", "c", "d")
    # A doubtful member that stays: the live one leaving is replaced add first.
    assert ensemble_step(ABC, ("b", "c", "d"), frozenset({"b"})) == ("a", "b", "c", "d")
    # Shrinking removes a doubtful member before a live one.
    assert ensemble_step(("a", "b", "c", "d"), ("b", "c"), frozenset({"d"})) == ("a", "b", "c")
    assert ensemble_step(("a",), ("d",), frozenset({"a"})) == ("a", "d")  # never below one
    assert CORRECT_RULES.next_ensemble(TermRecord(4, "c0", ABC, "b"), ("b", "c", "d"), dead) == (
        ("b", "c"),
        ABC,
    )


def test_only_a_settled_record_changes_and_the_change_names_what_it_left() -> None:
    rules = CORRECT_RULES
    settled = TermRecord(4, "c0", ABC, "a")
    assert rules.next_ensemble(settled, None) == (ABC, ())
    assert rules.next_ensemble(settled, ABC) == (ABC, ())
    assert rules.next_ensemble(settled, ("b", "c", "d")) == (("a", "b", "c", "d"), ABC)
    unsettled = TermRecord(5, "c0", ("a", "b", "c", "d"), "a", previous=ABC)
    # Term 5 may not have established: the next term keeps its ensemble and what it left.
    assert rules.next_ensemble(unsettled, ("b", "c", "d")) == (unsettled.ensemble, ABC)
    # The two mutations the simulation catches (tests/sim/test_quorum_sim_mutations.py).
    assert ReplaceInOneStep().next_ensemble(settled, ("b", "c", "d"))[0] == ("b", "c", "d")
    assert ChangeBeforeEstablished().next_ensemble(unsettled, ("b", "c", "d"))[0] == (
        "b",
        "c",
        "d",
    )


def test_a_blocked_unsettled_change_goes_back_to_the_ensemble_it_left() -> None:
    rules = CORRECT_RULES
    removed_first = TermRecord(5, "c0", ("a", "b"), "", previous=ABC)
    # Found blocked (b lost its disk and votes only once a leader aligned it): back to ABC,
    # naming the blocked ensemble as what it left; whatever the host wants meanwhile.
    for wanted in (None, ("a", "b", "d")):
        assert rules.next_ensemble(removed_first, wanted, frozenset(), True) == (
            ABC,
            ("a", "b"),
        )
    assert rules.next_ensemble(removed_first, ("a", "b", "d"), frozenset(), False) == (
        ("a", "b"),
        ABC,
    )
    # The way back is itself unsettled: kept until it establishes, or swapped again if blocked.
    back = TermRecord(6, "c0", ABC, "", previous=("a", "b"))
    assert rules.next_ensemble(back, ("a", "b", "d")) == (ABC, ("a", "b"))
    assert rules.next_ensemble(back, None, frozenset(), True) == (("a", "b"), ABC)
    # A settled ensemble has nothing to go back to: blocked, it waits for an operator.
    settled = TermRecord(5, "c0", ABC, "")
    assert rules.next_ensemble(settled, None, frozenset(), True) == (ABC, ())
    assert KeepABlockedChange().next_ensemble(removed_first, None, frozenset(), True) == (
        ("a", "b"),
        ABC,
    )


def _remove_first_then_lose_a_disk(rules: Rules) -> tuple[Router, list[tuple[str, ...]], bytes]:
    """A follower falls silent and the allocator moves its replica to d: the leader removes
    it first. Just as the register names the two that remain, the other one loses its disk
    (its NewTerm of the new term reaches an empty log); the silent member was only slow and
    comes back. Returns the router, the ensembles the register named, and what committed."""
    members = {n: Member(n, ReplicaLog(), CONFIG, rules) for n in (*ABC, "d")}
    register = MemoryCasRegister(TermRecord(0, "", ABC))
    coordinator = _coordinator(rules)
    router = Router(members, {"c0": coordinator}, register)
    coordinator.start(0)
    router.tick(40)
    leader = register.read().record.leader
    assert leader
    _commit(router, leader, b"before ")
    silent = next(m for m in ABC if m != leader)
    live = tuple(m for m in ABC if m != silent)
    lost = next(m for m in live if m != leader)
    wiped = False

    def cut(src: str, dst: str, msg: object) -> bool:
        nonlocal wiped
        if not wiped and dst == lost and isinstance(msg, NewTerm) and msg.ensemble == live:
            wiped = True
            member = Member(lost, ReplicaLog(), CONFIG, rules)  # its disk is new
            member.begin_lost(1, register.read().record.term)
            members[lost] = member
            router.cut = lambda src, dst, msg: False  # and the silent one is back
            return False
        return silent in (src, dst) or "d" in (src, dst)

    router.cut = cut
    for _ in range(CONFIG.silent_after_ticks):
        _tick(router, coordinator)
    coordinator.wanted = tuple(sorted((*live, "d")))
    seen = [register.read().record.ensemble]
    for _ in range(600):
        _tick(router, coordinator)
        record = register.read().record
        if seen[-1] != record.ensemble:
            seen.append(record.ensemble)
        if record.ensemble == coordinator.wanted and record.settled and record.leader:
            break
    assert wiped, seen
    return router, seen, b"before "


def test_a_remove_first_step_blocked_by_a_lost_disk_goes_back_and_completes() -> None:
    """{a,b,c} -> {a,b} with b's disk lost as the step lands: {a,b} has one voter. The next
    term goes back to {a,b,c} (c was only slow), elects, catches b up, and the move then
    completes (add first: no member is doubtful any more), every committed byte kept."""
    router, seen, committed = _remove_first_then_lose_a_disk(CORRECT_RULES)
    record = router.register.read().record
    assert record.settled and record.leader and record.ensemble == seen[-1], (seen, record)
    live = seen[1]
    assert seen[:3] == [ABC, live, ABC], seen  # removed first, then back
    assert len(live) == 2 and len(seen[-1]) == 3 and "d" in seen[-1]
    leader = router.members[record.leader]
    _, end = _commit(router, record.leader, b"after")
    for name in record.ensemble:
        member = router.members[name]
        if member.log.commit_index >= leader.log.commit_index:
            assert member.log.read(0, end) == committed + b"after", name
    assert all(router.members[m].voter for m in record.ensemble)


def test_keeping_the_blocked_step_never_elects_again() -> None:
    """The rule before the fix (a mutation): every term keeps {a,b}, whose one voter cannot
    elect, for good."""
    router, seen, _ = _remove_first_then_lose_a_disk(KeepABlockedChange())
    record = router.register.read().record
    assert len(seen) == 2 and len(seen[1]) == 2, seen
    assert not record.leader and not record.settled and record.term > 10, record


def test_the_register_value_keeps_an_unsettled_change_and_settled_ones_are_unchanged() -> None:
    settled = TermRecord(3, "c0", ABC, "a")
    assert b"previous" not in encode_term_record(settled)  # as before ensemble changes
    changing = TermRecord(4, "c0", ("a", "b", "c", "d"), "d", previous=ABC)
    assert decode_term_record(encode_term_record(changing, 7)) == changing
    bad = encode_term_record(changing).replace(b'"previous":["a","b","c"]', b'"previous":["a","a"]')
    try:
        decode_term_record(bad)
    except TermRecordDecodeError as err:
        assert "previous" in str(err)
    else:
        raise AssertionError("a malformed previous ensemble decoded")


def _coordinator(rules: Rules = CORRECT_RULES) -> Coordinator:
    config = CoordinatorConfig(
        leader_timeout_ticks=20,
        election_timeout_ticks=10,
        request_timeout_ticks=4,
        retry_backoff_max_ticks=16,
    )
    return Coordinator("c0", ABC, random.Random(1), config, rules)


def _tick(router: Router, coordinator: Coordinator) -> None:
    """One tick, the coordinator told what the register's leader cannot count on, as a
    broker's node tells its own coordinator (node.py)."""
    record = router.register.read().record
    member = router.members.get(record.leader)
    leader = member.leader if member is not None else None
    coordinator.doubtful = leader.doubtful(router.now) if leader is not None else None
    router.tick()
    for member in router.members.values():
        member.sync(router.now)


def _commit(router: Router, leader: str, data: bytes) -> tuple[int, int]:
    member = router.members[leader]
    member.append(data, data, router.now)
    member.sync(router.now)
    for _ in range(50):
        router.tick()
        member.sync(router.now)
        for notice in member.notices:
            if notice.token == data:
                member.notices.clear()
                return notice.begin, notice.end  # type: ignore[union-attr]
    raise AssertionError(f"{data!r} not committed")


def test_a_member_replaced_holds_every_byte_and_counts_in_the_quorum() -> None:
    members = {n: Member(n, ReplicaLog(), CONFIG) for n in (*ABC, "d")}
    register = MemoryCasRegister(TermRecord(0, "", ABC))
    coordinator = _coordinator()
    router = Router(members, {"c0": coordinator}, register)
    coordinator.start(0)
    router.tick(40)
    leader = register.read().record.leader
    assert leader and register.read().record.ensemble == ABC
    _commit(router, leader, b"before ")
    # The allocator moved a's replica to d.
    before = register.read().record
    seen = [(before.ensemble, before.previous)]
    coordinator.wanted = ("b", "c", "d")
    for _ in range(400):
        _tick(router, coordinator)
        record = register.read().record
        if seen[-1] != (record.ensemble, record.previous):
            seen.append((record.ensemble, record.previous))
        if record.ensemble == ("b", "c", "d") and record.settled and record.leader:
            if coordinator.state is CoordState.MONITORING:
                break
    else:
        raise AssertionError(f"the change did not complete: {seen}")
    # Two single-member changes, each settled before the next.
    assert seen[0] == (ABC, ())
    assert (("a", "b", "c", "d"), ABC) in seen
    assert (("a", "b", "c", "d"), ()) in seen
    assert (("b", "c", "d"), ("a", "b", "c", "d")) in seen
    assert seen[-1] == (("b", "c", "d"), ())
    leader = register.read().record.leader
    # d counts: with b cut off, c and d commit.
    victim = "b" if leader != "b" else "c"
    router.cut = lambda src, dst, msg: victim in (src, dst)
    _, end = _commit(router, leader, b"after")
    assert members["d"].log.read(0, end) == b"before after"
    assert members["d"].log.synced_index >= members[leader].log.commit_index
    assert members["a"].state is not ReplicaState.LEADER


def test_only_a_changing_term_says_established_on_the_wire() -> None:
    """Heartbeats and BecomeLeader of terms that change no ensemble are encoded as before
    (older brokers refuse fields they do not know)."""
    plain = Heartbeat(3, "a", 5, 6, ("b", "c"))
    follower_free = BecomeLeader(3, "c0", ABC, ())
    for msg in (plain, follower_free):
        raw = encode_envelope(Envelope("j", "a", msg))
        assert b"established" not in raw and b"changing" not in raw
    changing = BecomeLeader(4, "c0", ("a", "b", "c", "d"), (), changing=True)
    established = Heartbeat(4, "a", 7, 7, ("b", "c", "d"), established=True)
    for msg in (changing, established):
        assert decode_envelope(encode_envelope(Envelope("j", "a", msg))).message == msg


def test_a_dead_member_is_replaced_without_waiting_for_its_successor() -> None:
    """A follower dies and d, its successor, cannot catch up yet (cut off too): the ensemble
    goes {a,b,c} -> the two others -> them and d, and they commit all along. Adding d first
    needs 3 of {a,b,c,d}: with one dead and d not caught up, nothing would commit (nor
    elect). (The leader's own view says who is silent: it is the one that stays.)"""
    members = {n: Member(n, ReplicaLog(), CONFIG) for n in (*ABC, "d")}
    register = MemoryCasRegister(TermRecord(0, "", ABC))
    coordinator = _coordinator()
    router = Router(members, {"c0": coordinator}, register)
    coordinator.start(0)
    router.tick(40)
    leader = register.read().record.leader
    assert leader
    _commit(router, leader, b"before ")
    dead = next(m for m in ABC if m != leader)
    live = tuple(m for m in ABC if m != dead)
    wanted = tuple(sorted((*live, "d")))
    cut = {dead, "d"}
    router.cut = lambda src, dst, msg: src in cut or dst in cut
    # The allocator moves a replica once its broker's lease expired: long after it fell silent.
    for _ in range(CONFIG.silent_after_ticks):
        _tick(router, coordinator)
    coordinator.wanted = wanted
    seen = [register.read().record.ensemble]
    for _ in range(600):
        _tick(router, coordinator)
        record = register.read().record
        if seen[-1] != record.ensemble:
            seen.append(record.ensemble)
        if record.ensemble == wanted and record.leader in members:
            if members[record.leader].leader is not None:
                break
    else:
        raise AssertionError(f"the change did not complete: {seen} {register.read()}")
    assert seen == [ABC, live, wanted], seen
    leader = register.read().record.leader
    assert leader in live
    _, end = _commit(router, leader, b"during")  # d not caught up: b and c commit
    assert members["d"].log.head_end == 0
    router.cut = lambda src, dst, msg: dead in (src, dst)  # d reachable: it catches up
    for _ in range(200):
        _tick(router, coordinator)
        if members["d"].log.commit_index >= members[leader].log.commit_index > 0:
            break
    assert members["d"].log.read(0, end) == b"before during"
