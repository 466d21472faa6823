"""Ensemble changes in the core: the coordinator moves the term register's ensemble towards
the one its host wants, one member per term and only from a settled record (Rules.
next_ensemble); a change settles once the new term's leader says its barrier committed."""

from __future__ import annotations

import random

from broker.quorum.config import CoordinatorConfig
from broker.quorum.coordinator import Coordinator, CoordState
from broker.quorum.log import ReplicaLog
from broker.quorum.member import Member
from broker.quorum.messages import BecomeLeader, Heartbeat
from broker.quorum.register import MemoryCasRegister, TermRecord
from broker.quorum.rules import CORRECT_RULES, ensemble_step
from broker.quorum.states import ReplicaState
from broker.quorum_shell.term_record import (
    TermRecordDecodeError,
    decode_term_record,
    encode_term_record,
)
from broker.quorum_shell.wire import Envelope, decode_envelope, encode_envelope
from tests.broker.quorum.quorum_testkit import CONFIG, Router
from tests.sim.quorum_mutations import ChangeBeforeEstablished, ReplaceInOneStep

ABC = ("a", "b", "c")


def test_a_replacement_is_an_addition_then_a_removal() -> None:
    assert ensemble_step(ABC, ("b", "c", "d")) == ("a", "b", "c", "d")
    assert ensemble_step(("a", "b", "c", "d"), ("b", "c", "d")) == ("b", "c", "d")
    assert ensemble_step(ABC, ABC) == ABC
    assert ensemble_step(("a",), ()) == ("a",)  # never below one member


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


def _coordinator() -> Coordinator:
    config = CoordinatorConfig(
        leader_timeout_ticks=20,
        election_timeout_ticks=10,
        request_timeout_ticks=4,
        retry_backoff_max_ticks=16,
    )
    return Coordinator("c0", ABC, random.Random(1), config)


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
        router.tick()
        for member in members.values():
            member.sync(router.now)
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
