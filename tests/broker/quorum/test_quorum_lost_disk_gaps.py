"""Two ways a member back from a lost disk could count, or help commit, without what it had
(docs/design/quorum.md, Built (lost disks), gaps (a) and (b)).

(a) A Truncate or Snapshot sent *before* the loss and delivered late carries the leader's
head of then, which may be below an entry the member acknowledged before the loss. Aligned by
it, the member would vote again once it holds that older head, without the entry. A lost
member takes only an alignment echoing the nonce of its current start (Rules.accepts_alignment).

(b) A lost log forgets the member's fence: fenced into term 2 (its answer counted in that
election), it could be aligned by the deposed leader of term 1 and acknowledge entries that
leader then commits, while term 2's leader lacks them. A lost member starts in the term
register's current term (Rules.lost_start_term).

Each test runs the scenario under the correct rules and under the mutation that restores the
old behaviour (tests/sim/quorum_mutations.py), which shows the flaw.
"""

from __future__ import annotations

import pytest

from broker.quorum.entry import EntryId
from broker.quorum.leader import AppendFailed
from broker.quorum.log import ReplicaLog
from broker.quorum.member import Member
from broker.quorum.messages import (
    ReplicaResponse,
    Replicate,
    ReplyStatus,
    Snapshot,
    Truncate,
)
from broker.quorum.rules import CORRECT_RULES, Rules
from broker.quorum.states import ReplicaState
from tests.broker.quorum.quorum_testkit import (
    CONFIG,
    Router,
    cluster,
    elect,
    response_of,
)
from tests.sim.quorum_mutations import AlignOnAnyNonce, LostStartsAtItsLogTerm

LOST_NONCE = 7


def _answers(member: Member) -> list[tuple[str, ReplicaResponse]]:
    out = [(dst, msg) for dst, msg in member.outbox if isinstance(msg, ReplicaResponse)]
    member.outbox.clear()
    return out


def _late_alignment_after_the_loss(rules: Rules) -> tuple[dict[str, Member], Router, EntryId]:
    """m0 leads term 1 and aligned m2 (Truncate to the origin, m0's head then: its barrier),
    then commits X with m2 while m1 lags. m2 loses its disk and comes back; m0's next message
    makes it answer LOST, and m0's new alignment is lost in the network. Then the Truncate
    and the first Replicate m0 sent m2 *before* the loss arrive again, late."""
    members = cluster(rules=rules)
    router = elect(members, "m0", 1)
    m0 = members["m0"]
    old = [msg for src, dst, msg in router.delivered if (src, dst) == ("m0", "m2")]
    old_truncate = next(m for m in old if isinstance(m, Truncate))
    old_replicate = next(m for m in old if isinstance(m, Replicate) and m.entries)
    assert old_truncate.leader_head.index == 1  # m0's barrier: all it held then
    router.cut = lambda src, dst, msg: "m1" in (src, dst)  # m1 lags from here
    m0.append(b"X" * 10, "x", router.now)
    m0.sync(router.now)
    router.run()
    x = m0.log.head
    assert m0.log.commit_index == x.index and members["m2"].log.has(x)
    assert not members["m1"].log.has(x)

    m2 = Member("m2", ReplicaLog(), CONFIG, rules)
    m2.begin_lost(LOST_NONCE, register_term=1)
    members["m2"] = m2
    # m0's heartbeat reaches m2 (LOST); m0's alignment after it is lost in the network.
    router.cut = lambda src, dst, msg: (
        "m1" in (src, dst) or (dst == "m2" and isinstance(msg, Truncate | Snapshot))
    )
    router.tick(CONFIG.heartbeat_interval_ticks + 1)
    assert m2.term == 1 and not m2.voter
    router.cut = lambda src, dst, msg: True  # nothing else arrives meanwhile
    m2.handle(old_truncate, router.now)
    m2.handle(old_replicate, router.now)
    return members, router, x


def test_a_late_alignment_sent_before_the_loss_does_not_align_the_new_log() -> None:
    members, router, x = _late_alignment_after_the_loss(CORRECT_RULES)
    m2 = members["m2"]
    # Neither late message is taken: the Truncate echoes no nonce of this start.
    assert m2.log.aligned_term == 0 and m2.log.head_index == 0
    assert [a.status for _, a in _answers(m2)] == [ReplyStatus.LOST, ReplyStatus.LOST]
    assert not m2.voter

    # The network heals (m1 still lags): m0 aligns m2 with its nonce and current head.
    router.cut = lambda src, dst, msg: "m1" in (src, dst)
    router.tick(CONFIG.retry_backoff_max_ticks * 2)
    echoed = [
        msg.nonce
        for src, dst, msg in router.delivered
        if (src, dst) == ("m0", "m2") and isinstance(msg, Truncate | Snapshot)
    ]
    assert echoed[-1] == LOST_NONCE
    assert m2.log.aligned_head.index >= x.index
    assert m2.log.holds_durably(x) and m2.voter


def test_taking_any_late_alignment_makes_it_vote_without_an_acknowledged_entry() -> None:
    # The old behaviour (AlignOnAnyNonce): the late Truncate aligns the new log with m0's head
    # of then (its barrier), the late Replicate brings it: m2 votes, without X. m1 and m2, a
    # majority of voters, hold no X, which m0 committed with m2 before the loss.
    members, _, x = _late_alignment_after_the_loss(AlignOnAnyNonce())
    m2 = members["m2"]
    assert m2.log.aligned_term == 1 and m2.log.aligned_head.index < x.index
    assert m2.voter and not m2.log.has(x) and not members["m1"].log.has(x)


def test_the_lost_member_answers_with_its_nonce_and_the_leader_echoes_it() -> None:
    members, _, _ = _late_alignment_after_the_loss(CORRECT_RULES)
    m2 = members["m2"]
    answers = _answers(m2)
    assert [(dst, a.status, a.nonce) for dst, a in answers] == [
        ("m0", ReplyStatus.LOST, LOST_NONCE),
        ("m0", ReplyStatus.LOST, LOST_NONCE),
    ]
    assert response_of(m2, 2).nonce == LOST_NONCE  # its NewTerm answer too, while lost


def _deposed_leader_reaches_the_lost_member(rules: Rules) -> tuple[dict[str, Member], Router]:
    """m0 leads term 1 with m1 and m2. A coordinator fences m1 and m2 into term 2 (a quorum:
    m0 is deposed, unaware); then m2 loses its disk and comes back while the register holds
    term 2. m0, still leading term 1, appends Y and reaches m2 but not m1."""
    members = cluster(rules=rules)
    router = elect(members, "m0", 1)
    response_of(members["m1"], 2)
    response_of(members["m2"], 2)
    m2 = Member("m2", ReplicaLog(), CONFIG, rules)
    m2.begin_lost(LOST_NONCE, register_term=2)
    members["m2"] = m2
    router.cut = lambda src, dst, msg: "m1" in (src, dst)
    members["m0"].append(b"Y" * 10, "y", router.now)
    members["m0"].sync(router.now)
    router.run()
    router.tick(CONFIG.retry_backoff_max_ticks * 2)
    return members, router


def test_a_lost_member_starts_in_the_registers_term_and_deposes_the_old_leader() -> None:
    members, _ = _deposed_leader_reaches_the_lost_member(CORRECT_RULES)
    m0, m2 = members["m0"], members["m2"]
    assert m2.term == 2 and m2.state is ReplicaState.FENCED and m2.log.head_index == 0
    # m2 answered STALE: m0 stepped down, committing nothing of term 1 with m2.
    assert m0.leader is None and m0.term == 2
    assert m0.log.commit_index < m0.log.head_index
    assert [n.token for n in m0.notices if isinstance(n, AppendFailed)] == ["y"]


def test_starting_at_its_log_term_lets_the_deposed_leader_commit_with_it() -> None:
    # The old behaviour (LostStartsAtItsLogTerm): m2 starts at term 0, joins term 1 from m0's
    # message, is aligned by m0 and acknowledges Y; m0 commits Y with it. Term 2 was elected
    # from m1's and m2's answers before the loss: its leader need not hold Y.
    members, _ = _deposed_leader_reaches_the_lost_member(LostStartsAtItsLogTerm())
    m0, m1, m2 = members["m0"], members["m1"], members["m2"]
    assert m2.term == 1
    y = m0.log.head
    assert m0.log.commit_index == y.index and m2.log.has(y) and not m1.log.has(y)
    assert m1.term == 2  # the term whose election counted m2: its leader can lack Y


def test_a_lost_start_never_lowers_the_term_and_needs_a_nonce() -> None:
    m = Member("m0", ReplicaLog(), CONFIG)
    m.begin_lost(3, register_term=5)
    assert m.term == 5 and m.log.synced_index == 0
    m.begin_lost(4, register_term=2)  # a stale read: never below what it joined
    assert m.term == 5 and m.lost_nonce == 4
    with pytest.raises(ValueError, match="nonce"):
        m.begin_lost(0, register_term=5)
    with pytest.raises(ValueError, match="nonce"):
        Member("m1", ReplicaLog(), CONFIG, lost_state=True)
