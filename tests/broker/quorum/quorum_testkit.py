"""Helpers for the quorum core's unit tests: logs built from a list of (term, bytes), members
put in each replica state, and a synchronous in-memory router (no simulation randomness) that
delivers outboxes in order, optionally dropping what a test cuts off."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Iterable

from broker.quorum.config import CoordinatorConfig, QuorumConfig
from broker.quorum.coordinator import REGISTER, Coordinator
from broker.quorum.entry import ORIGIN, Entry, EntryId
from broker.quorum.log import ReplicaLog
from broker.quorum.member import Member
from broker.quorum.messages import (
    COORDINATORS,
    BecomeLeader,
    NewTerm,
    NewTermResponse,
    Truncate,
)
from broker.quorum.register import (
    MemoryCasRegister,
    RegisterCas,
    RegisterRead,
    RegisterReply,
    TermRecord,
)
from broker.quorum.rules import CORRECT_RULES, Rules

ENSEMBLE = ("m0", "m1", "m2")
CONFIG = QuorumConfig(
    inflight_messages_max=2,
    replicate_entries_max=2,
    replicate_bytes_max=1 << 10,
    log_bytes_max=1 << 10,
    log_entries_max=64,
    pending_appends_max=16,
    ack_timeout_ticks=10,
    retry_backoff_max_ticks=40,
    heartbeat_interval_ticks=5,
)


def make_log(entries: Iterable[tuple[int, bytes]], *, term: int = 0, commit: int = 0) -> ReplicaLog:
    """A synced log of entries (term, data) from index 1 and offset 0."""
    log = ReplicaLog()
    for term_of, data in entries:
        log.append(Entry(term_of, log.head_index + 1, log.head_end, log.head_end + len(data), data))
    log.sync()
    log.term = max(term, log.head.term)
    log.set_commit(commit)
    return log


def durable_state(member: Member) -> tuple[object, ...]:
    log = member.log
    return (
        member.state,
        log.term,
        log.aligned_term,
        log.led_term,
        log.commit_index,
        log.base,
        log.head,
        log.synced_index,
        len(member.outbox),
    )


def new_term(term: int, coordinator: str = "c0") -> NewTerm:
    return NewTerm(term, coordinator, ENSEMBLE)


def response_of(member: Member, term: int) -> NewTermResponse:
    """What `member` answers NewTerm(term) with (it is fenced into `term` by it)."""
    member.handle(new_term(term), 0)
    dst, resp = member.outbox.pop()
    assert dst == "c0" and isinstance(resp, NewTermResponse)
    return resp


def member_in(
    state: str, name: str = "m1", log: ReplicaLog | None = None, rules: Rules = CORRECT_RULES
) -> Member:
    """A member of term 1 in `state`: not_member, fenced, fenced_aligned (a follower that
    restarted), follower or leader (with no followers yet). Its outbox is empty."""
    member = Member(name, log or ReplicaLog(), CONFIG, rules)
    if state != "not_member":
        member.handle(new_term(1), 0)
    if state in ("follower", "fenced_aligned"):
        member.handle(Truncate(1, "m0", member.log.head), 0)
    if state == "fenced_aligned":
        member = Member(name, member.log, CONFIG, rules)
    if state == "leader":
        member.handle(BecomeLeader(1, "c0", ENSEMBLE, ()), 0)
    member.outbox.clear()
    return member


class Router:
    """Delivers messages between members, coordinators and a register, in send order."""

    def __init__(
        self,
        members: dict[str, Member],
        coordinators: dict[str, Coordinator] | None = None,
        register: MemoryCasRegister | None = None,
    ) -> None:
        self.members = members
        self.coordinators = coordinators or {}
        self.register = register or MemoryCasRegister(TermRecord(0, "", ENSEMBLE))
        self.queue: deque[tuple[str, str, object]] = deque()
        self.cut: Callable[[str, str, object], bool] = lambda src, dst, msg: False
        self.delivered: list[tuple[str, str, object]] = []
        self.now = 0

    def collect(self) -> None:
        for name, node in (*self.members.items(), *self.coordinators.items()):
            for dst, msg in node.outbox:
                if dst == COORDINATORS:
                    for coordinator in self.coordinators:
                        self.queue.append((name, coordinator, msg))
                else:
                    self.queue.append((name, dst, msg))
            node.outbox.clear()

    def run(self, steps_max: int = 10_000) -> None:
        """Deliver until nothing is left to deliver."""
        self.collect()
        for _ in range(steps_max):
            if not self.queue:
                return
            src, dst, msg = self.queue.popleft()
            if self.cut(src, dst, msg):
                continue
            self.delivered.append((src, dst, msg))
            if dst == REGISTER:
                self._register(src, msg)
            elif dst in self.members:
                self.members[dst].handle(msg, self.now)
            elif dst in self.coordinators:
                self.coordinators[dst].handle(msg, self.now)
            self.collect()
        raise AssertionError(f"still delivering after {steps_max} messages")

    def tick(self, ticks: int = 1) -> None:
        """Advance time tick by tick, ticking every node and delivering after each tick."""
        for _ in range(ticks):
            self.now += 1
            for member in self.members.values():
                member.tick(self.now)
            for coordinator in self.coordinators.values():
                coordinator.tick(self.now)
            self.run()

    def _register(self, src: str, msg: object) -> None:
        if isinstance(msg, RegisterRead):
            reply = RegisterReply(msg.request_id, True, self.register.read())
        elif isinstance(msg, RegisterCas):
            result = self.register.compare_and_swap(msg.expect_revision, msg.record)
            reply = RegisterReply(msg.request_id, result.ok, result.current)
        else:
            raise AssertionError(f"register: {msg!r}")
        self.coordinators[src].handle(reply, self.now)


def cluster(
    logs: dict[str, ReplicaLog] | None = None, rules: Rules = CORRECT_RULES
) -> dict[str, Member]:
    logs = logs or {}
    return {name: Member(name, logs.get(name, ReplicaLog()), CONFIG, rules) for name in ENSEMBLE}


def elect(
    members: dict[str, Member], leader: str, term: int, router: Router | None = None
) -> Router:
    """Fence every member into `term` and make `leader` lead it, by hand (no coordinator)."""
    router = router or Router(members)
    responses = [response_of(m, term) for name, m in members.items() if name != leader]
    response_of(members[leader], term)
    members[leader].handle(BecomeLeader(term, "c0", ENSEMBLE, tuple(responses)), router.now)
    router.run()
    return router


def coordinator(name: str = "c0", rules: Rules = CORRECT_RULES, seed: int = 1) -> Coordinator:
    config = CoordinatorConfig(
        leader_timeout_ticks=20,
        election_timeout_ticks=10,
        request_timeout_ticks=4,
        retry_backoff_max_ticks=16,
    )
    return Coordinator(name, ENSEMBLE, random.Random(seed), config, rules)


def entry_id(term: int, index: int) -> EntryId:
    return EntryId(term, index)


__all__ = ["ORIGIN"]
