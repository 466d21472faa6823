"""A leader whose ensemble change removes its own member: its coordinator claims a term it is
not in and appoints that term's leader. Coordinators here are hosted by members, as on
brokers (node.py): a leader's heartbeats reach only its ensemble's coordinators, so the
claiming coordinator is an outsider (Coordinator.outsider) once its claim lands. It must still
carry its own election through: re-send the BecomeLeader that did not take effect, until it
hands the term over. Measured in ticks: how long the journal is without a leader of the
register's term."""

from __future__ import annotations

import random

from broker.quorum.config import CoordinatorConfig
from broker.quorum.coordinator import Coordinator, CoordState
from broker.quorum.log import ReplicaLog
from broker.quorum.member import Member
from broker.quorum.messages import BecomeLeader, Heartbeat
from broker.quorum.register import MemoryCasRegister, TermRecord
from tests.broker.quorum.quorum_testkit import CONFIG, Router

ABCD = ("a", "b", "c", "d")
SUFFIX = "!c"
COORDINATOR_CONFIG = CoordinatorConfig(
    leader_timeout_ticks=20,
    election_timeout_ticks=10,
    request_timeout_ticks=4,
    retry_backoff_max_ticks=16,
)


def _cluster() -> Router:
    members = {n: Member(n, ReplicaLog(), CONFIG) for n in ABCD}
    coordinators = {
        n + SUFFIX: Coordinator(n + SUFFIX, ABCD, random.Random(i), COORDINATOR_CONFIG, member=n)
        for i, n in enumerate(ABCD)
    }
    router = Router(members, coordinators, MemoryCasRegister(TermRecord(0, "", ABCD)))

    def heard(src: str, dst: str, msg: object) -> bool:
        """A leader's heartbeats reach the coordinators of its ensemble's members only (the
        broker's node fans them out to its peers)."""
        if not isinstance(msg, Heartbeat):
            return True
        leader = members[src].leader
        return leader is not None and dst.removesuffix(SUFFIX) in leader.ensemble

    router.cut = lambda src, dst, msg: not heard(src, dst, msg)
    return router


def _tick(router: Router, wanted: tuple[str, ...] | None = None) -> None:
    """One tick, as brokers' nodes do it: each coordinator is told what its member's leader
    wants (the allocator's route) and cannot count on; the others want nothing."""
    for name, coordinator in router.coordinators.items():
        leader = router.members[name.removesuffix(SUFFIX)].leader
        coordinator.wanted = wanted if leader is not None else None
        coordinator.doubtful = leader.doubtful(router.now) if leader is not None else None
    router.tick()
    for member in router.members.values():
        member.sync(router.now)


def _leads_register_term(router: Router) -> bool:
    record = router.register.read().record
    member = router.members.get(record.leader)
    return member is not None and member.leader is not None and member.term == record.term


def test_a_leader_removing_itself_hands_its_term_over_without_a_leaderless_gap() -> None:
    router = _cluster()
    for coordinator in router.coordinators.values():
        coordinator.start(0)
    for _ in range(60):
        _tick(router)
        if _leads_register_term(router) and router.register.read().record.settled:
            break
    first = router.register.read().record
    assert first.leader == "a" and first.ensemble == ABCD, first
    # The allocator moved a's replica away: a's coordinator removes its own member. The
    # BecomeLeader of that term is lost once (a message dropped, or the chosen member's
    # broker not ready for it).
    wanted = ("b", "c", "d")
    dropped: list[BecomeLeader] = []
    heard = router.cut

    def cut(src: str, dst: str, msg: object) -> bool:
        if isinstance(msg, BecomeLeader) and "a" not in msg.ensemble and not dropped:
            dropped.append(msg)
            return True
        return heard(src, dst, msg)

    router.cut = cut
    leaderless_since = -1
    gap = 0
    for _ in range(300):
        _tick(router, wanted)
        record = router.register.read().record
        if not _leads_register_term(router):
            if leaderless_since < 0:
                leaderless_since = router.now
        elif leaderless_since >= 0:
            gap = max(gap, router.now - leaderless_since)
            leaderless_since = -1
        if record.ensemble == ("b", "c", "d") and record.settled and _leads_register_term(router):
            break
    assert dropped, "the removal's BecomeLeader was never sent"
    record = router.register.read().record
    assert record.ensemble == ("b", "c", "d") and record.settled, record
    # The appointed leader leads the term a's coordinator claimed (no other term needed),
    # with the coordinator's re-sent BecomeLeader (paced with that member's NewTerms: 4 then
    # 8 ticks), before any other coordinator could even find a leader silent
    # (leader_timeout_ticks). 12 ticks here; 70 before, with a third term.
    assert gap < COORDINATOR_CONFIG.leader_timeout_ticks, (gap, record)
    assert record.term == first.term + 1 and record.owner == "a" + SUFFIX, record
    # Its election over, a's coordinator hands the term over: it claims nothing more.
    outsider = router.coordinators["a" + SUFFIX]
    assert outsider.outsider
    for _ in range(4 * COORDINATOR_CONFIG.leader_timeout_ticks):
        _tick(router, wanted)
    assert router.register.read().record == record
    assert outsider.state is CoordState.MONITORING and not outsider.takes_part
