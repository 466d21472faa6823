"""The coordinator of a journal's terms (sans-IO): fences, elects, appoints, watches.

Any number of coordinators may run (the broker may run one per member); the term register's
compare-and-swap makes each term owned by exactly one, and its leader appointed once.

  READING     read the register. A leader appointed: MONITORING. No leader and the record
              unchanged since we last waited (or the initial record): CLAIMING. Else another
              coordinator is electing: WAITING.
  CLAIMING    CAS the record to (term + 1, owner = us, no leader). Won: FENCING.
  FENCING     send NewTerm to every member of the ensemble (re-sent to the silent ones with
              backoff) and collect the answers of Fenced members. A quorum answered: choose the
              most up-to-date (Rules.choose_leader), APPOINTING. Too slow: CLAIMING again.
  APPOINTING  CAS the record to name the leader. Won: MONITORING.
  MONITORING  the leader must send heartbeats; silence for leader_timeout_ticks: CLAIMING.
              We send BecomeLeader until the leader's first heartbeat, NewTerm to members that
              have not answered (a late or restarted member), and AddFollower for each Fenced
              answer until the leader's heartbeat lists that follower. The host wants another
              ensemble (`wanted`) and the record is settled: CLAIMING (an ensemble change).
  WAITING     another coordinator's election is under way: wait (election_timeout_ticks plus
              jitter), then READING. If nothing changed meanwhile, that election stalled.

An election can be impossible: members back from a lost disk do not vote until a leader has
caught them up (Rules.may_vote), so once more of them answer than the ensemble can spare
(more than n - quorum), no quorum of voters can ever form. The coordinator then says so:
`election_blocked` holds an `ElectionBlocked` (the term, the non-voters, the voters needed)
until a leader is appointed, so the shell can log it, count it and show it, rather than retry
silently. It never elects anyway: a short log elected would lose acknowledged appends.
Only while an ensemble change is unsettled is there a way out: the next claim goes back to
the ensemble the change left (Rules.next_ensemble, `blocked`), which may still have a quorum
of voters (a remove-first step decided before the leader knew a remaining member had lost its
disk). A settled ensemble that is blocked needs an operator.

Ensemble changes (Rules.next_ensemble). A claim's ensemble is the record's moved one member
towards `wanted` (the host's wish: the allocator's route; `doubtful`, the members the
leader cannot count on, orders a replacement's two steps), and only from a settled record; the
new term's record then names the ensemble it left (`previous`) until the change is known to
have established: a leader's heartbeat says its barrier committed (`established`), and a
monitoring coordinator CASes the record (same term, same leader) to settled. Until then every
claim keeps the record's ensemble and `previous`.

Hosted coordinators (`member`: a broker runs one per member of each journal). A leader tells
its ensemble's coordinators, so one whose member is outside the ensemble of its term (an
*outsider*: a leader whose change removes its own member claims such a term) hears no
heartbeats and takes no initiative; it only carries through the election it started, until
the leader it appointed leads or leader_timeout_ticks pass (`takes_part`): then the
ensemble's coordinators, which hear that leader, have the term.

A lost CAS answers with the register's value, interpreted as a read. A register request
unanswered for request_timeout_ticks is re-sent (doubling to retry_backoff_max_ticks); an
answer to an older request is ignored. A crashed coordinator restarts in READING with nothing
but its name: it never re-uses a term, since every claim is a new one.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, replace
from typing import Final

from broker.quorum.config import CoordinatorConfig
from broker.quorum.errors import IllegalTransitionError
from broker.quorum.messages import (
    AddFollower,
    BecomeLeader,
    Heartbeat,
    NewTerm,
    NewTermResponse,
)
from broker.quorum.register import RegisterCas, RegisterRead, RegisterReply, TermRecord, Versioned
from broker.quorum.rules import CORRECT_RULES, Rules
from broker.quorum.states import ReplicaState

# Destination of register requests (the shell routes them to etcd or the simulated register).
REGISTER = "*register*"


class CoordState(enum.Enum):
    READING = "reading"
    CLAIMING = "claiming"
    FENCING = "fencing"
    APPOINTING = "appointing"
    MONITORING = "monitoring"
    WAITING = "waiting"


class CoordEvent(enum.Enum):
    LEADER_KNOWN = "leader_known"  # the register names a leader
    ELECTION_STALLED = "election_stalled"  # no leader, and no election progressing
    ELECTION_IN_PROGRESS = "election_in_progress"  # no leader; another owns the newest term
    CLAIMED = "claimed"
    MAJORITY_FENCED = "majority_fenced"
    APPOINTED = "appointed"
    LEADER_SILENT = "leader_silent"
    REGISTER_MOVED = "register_moved"  # a newer term was seen: re-read
    ENSEMBLE_CHANGE = "ensemble_change"  # the host wants another ensemble: a new term
    WAIT_OVER = "wait_over"


C, V = CoordState, CoordEvent
COORDINATOR_TRANSITIONS: Final[dict[tuple[CoordState, CoordEvent], CoordState]] = {
    (C.READING, V.LEADER_KNOWN): C.MONITORING,
    (C.READING, V.ELECTION_STALLED): C.CLAIMING,
    (C.READING, V.ELECTION_IN_PROGRESS): C.WAITING,
    (C.CLAIMING, V.CLAIMED): C.FENCING,
    (C.CLAIMING, V.LEADER_KNOWN): C.MONITORING,
    (C.CLAIMING, V.ELECTION_STALLED): C.CLAIMING,
    (C.CLAIMING, V.ELECTION_IN_PROGRESS): C.WAITING,
    (C.FENCING, V.MAJORITY_FENCED): C.APPOINTING,
    (C.FENCING, V.ELECTION_STALLED): C.CLAIMING,
    (C.FENCING, V.REGISTER_MOVED): C.READING,
    (C.APPOINTING, V.APPOINTED): C.MONITORING,
    (C.APPOINTING, V.LEADER_KNOWN): C.MONITORING,
    (C.APPOINTING, V.ELECTION_STALLED): C.CLAIMING,
    (C.APPOINTING, V.ELECTION_IN_PROGRESS): C.WAITING,
    (C.MONITORING, V.LEADER_SILENT): C.CLAIMING,
    (C.MONITORING, V.REGISTER_MOVED): C.READING,
    (C.MONITORING, V.ENSEMBLE_CHANGE): C.CLAIMING,
    (C.WAITING, V.WAIT_OVER): C.READING,
    (C.WAITING, V.REGISTER_MOVED): C.READING,
}


@dataclass(frozen=True, slots=True)
class ElectionBlocked:
    """Why a journal cannot elect: `non_voters` (members back from a lost disk, not yet caught
    up) answered NewTerm of `term`, leaving fewer than `voters_needed` possible voters in the
    ensemble. Only an operator can unblock it (docs/design/quorum.md, "Built (lost disks)"),
    unless `ensemble` is an unsettled change: the next claim then goes back to the ensemble it
    left (Rules.next_ensemble)."""

    term: int
    non_voters: tuple[str, ...]
    voters_needed: int
    ensemble: tuple[str, ...]

    def __str__(self) -> str:
        return (
            f"term {self.term}: {len(self.non_voters)} of {len(self.ensemble)} members lost"
            f" their disk and are not caught up ({', '.join(self.non_voters)}); an election"
            f" needs {self.voters_needed} voters"
        )


@dataclass(slots=True)
class _Retry:
    deadline: int
    backoff: int


class Coordinator:
    def __init__(
        self,
        name: str,
        ensemble: tuple[str, ...],
        rng: random.Random,
        config: CoordinatorConfig | None = None,
        rules: Rules = CORRECT_RULES,
        member: str = "",
    ) -> None:
        self.name = name
        # The member whose broker hosts this coordinator ("": a coordinator of its own, as
        # the simulation's, which every leader's heartbeats reach): see `outsider`.
        self.member = member
        self.ensemble = ensemble
        self.config = config or CoordinatorConfig()
        self.rules = rules
        self._rng = rng
        self.outbox: list[tuple[str, object]] = []
        self.state = CoordState.READING
        self.term = 0  # the term being elected or monitored
        self.leader = ""
        self._known: Versioned | None = None  # the register as last read or written
        self._claim: TermRecord | None = None
        self._appoint: TermRecord | None = None
        self._settle: TermRecord | None = None  # the settled record being written
        # The ensemble the host wants (None: keep the record's); see the module docstring.
        self.wanted: tuple[str, ...] | None = None
        # Members the leader cannot count on (LeaderRole.doubtful), from the host with
        # `wanted`: a replacement of the only one removes it first (ensemble_step). None: no
        # leader can tell yet (none here, or its term is too young), and `wanted` waits.
        self.doubtful: frozenset[str] | None = None
        self._stalled_revision = -1
        self._request_id = 0
        self._request: RegisterRead | RegisterCas | None = None
        self._request_retry = _Retry(0, self.config.request_timeout_ticks)
        self._deadline = 0  # fencing, monitoring or waiting deadline, by state
        # Terms this coordinator claimed in the register (elections it started): for metrics.
        self.terms_claimed = 0
        self._responses: dict[str, NewTermResponse] = {}  # Fenced answers of this term
        self._answered: set[str] = set()  # members that answered NewTerm in this term
        self._member_retry: dict[str, _Retry] = {}
        self._become_leader: BecomeLeader | None = None
        self._leader_followers: frozenset[str] = frozenset()
        # Set while no quorum of voters can form (see the module docstring).
        self.election_blocked: ElectionBlocked | None = None
        # This coordinator's own election is under way: from its claim until another's record
        # is seen or, monitoring the leader it appointed, until it hands the term over
        # (`takes_part`).
        self._carrying = False

    def __repr__(self) -> str:
        return (
            f"Coordinator({self.name} {self.state.value} term={self.term} leader={self.leader!r})"
        )

    @property
    def record(self) -> TermRecord | None:
        """The term register's record as this coordinator last read or wrote it."""
        return self._known.record if self._known is not None else None

    # --- Inputs ---------------------------------------------------------------------------------

    @property
    def outsider(self) -> bool:
        """Hosted by a member outside the ensemble of the term it elects or monitors: a
        leader removing its own member claims such a term. See `takes_part`."""
        return bool(self.member) and self.member not in self.ensemble

    @property
    def takes_part(self) -> bool:
        """Whether ticks move this coordinator. An outsider hears no leader's heartbeats (a
        leader tells its ensemble's coordinators), so it takes no initiative: it would find
        every leader silent and claim a term each leader timeout, deposing a healthy leader
        each time. It still carries its own election through (`_carrying`): it claimed the
        term, so it alone re-sends its NewTerms, times out its fencing, retries its
        appointment, and re-sends its BecomeLeader until the leader's first heartbeat, or,
        unheard, until leader_timeout_ticks have passed; then it hands the term over to the
        ensemble's coordinators, which the leader's heartbeats reach (they settle it, and
        replace a silent leader). It goes on once a change adds its member (a newer term's
        heartbeat then reaches it)."""
        return not self.outsider or self._carrying

    def start(self, now: int) -> None:
        self._read(now)

    def handle(self, msg: object, now: int) -> None:
        if isinstance(msg, RegisterReply):
            self._on_register_reply(msg, now)
        elif isinstance(msg, NewTermResponse):
            self._on_new_term_response(msg, now)
        elif isinstance(msg, Heartbeat):
            self._on_heartbeat(msg, now)

    def tick(self, now: int) -> None:
        if not self.takes_part:
            return
        state = self.state
        if self._request is not None and now >= self._request_retry.deadline:
            self._send_request(self._request, now, retry=True)
        if state is CoordState.FENCING:
            if now >= self._deadline:
                self._go(CoordEvent.ELECTION_STALLED)
                self._claim_next(now)
                return
            self._resend_new_terms(now)
        elif state is CoordState.MONITORING:
            if now >= self._deadline and self.outsider:
                # Unheard is not silent: the leader tells the ensemble's coordinators, whose
                # own timeouts replace it if it is silent. Its term is theirs now.
                self._carrying = False
                return
            if now >= self._deadline:
                self._go(CoordEvent.LEADER_SILENT)
                self._claim_next(now)
                return
            if self._wants_change():
                self._go(CoordEvent.ENSEMBLE_CHANGE)
                self._claim_next(now)
                return
            self._resend_new_terms(now)
            self._resend_to_leader(now)
        elif state is CoordState.WAITING and now >= self._deadline:
            self._go(CoordEvent.WAIT_OVER)
            self._read(now)

    # --- Register -------------------------------------------------------------------------------

    def _read(self, now: int) -> None:
        self._request_id += 1
        self._send_request(RegisterRead(self.name, self._request_id), now)

    def _cas(self, expect_revision: int, record: TermRecord, now: int) -> None:
        self._request_id += 1
        self._send_request(RegisterCas(self.name, self._request_id, expect_revision, record), now)

    def _send_request(self, req: RegisterRead | RegisterCas, now: int, retry: bool = False) -> None:
        config = self.config
        if retry:
            backoff = min(self._request_retry.backoff * 2, config.retry_backoff_max_ticks)
        else:
            backoff = config.request_timeout_ticks
        self._request = req
        self._request_retry = _Retry(now + backoff, backoff)
        self.outbox.append((REGISTER, req))

    def _on_register_reply(self, reply: RegisterReply, now: int) -> None:
        if self._request is None or reply.request_id != self._request.request_id:
            return  # an answer to an older request
        self._request = None
        self._known = reply.current
        record = reply.current.record
        if self.state is CoordState.MONITORING:
            # The answer to a settling CAS (won, or lost to another's): still this term and
            # leader, keep monitoring; else the register moved on.
            self._settle = None
            if record.term == self.term and record.leader == self.leader:
                return
            self._go(CoordEvent.REGISTER_MOVED)
        if self.state is CoordState.CLAIMING and record == self._claim:
            self._go(CoordEvent.CLAIMED)
            self.terms_claimed += 1
            self._start_fencing(record, now)
        elif self.state is CoordState.APPOINTING and record == self._appoint:
            self._go(CoordEvent.APPOINTED)
            self._start_monitoring(record, now)
        elif record.leader:
            self._go(CoordEvent.LEADER_KNOWN)
            self._start_monitoring(record, now)
        elif record.term == 0 or reply.current.revision == self._stalled_revision:
            self._go(CoordEvent.ELECTION_STALLED)
            self._claim_next(now)
        else:
            self._go(CoordEvent.ELECTION_IN_PROGRESS)
            self._stalled_revision = reply.current.revision
            self._deadline = now + self._jittered(self.config.election_timeout_ticks)

    def _claim_next(self, now: int) -> None:
        known = self._known
        if known is None:
            raise IllegalTransitionError("coordinator", self.state, "claim without a read")
        doubtful, wanted = self.doubtful, self.wanted
        if doubtful is None:  # no leader can tell which members are silent: change nothing
            doubtful, wanted = frozenset(), None
        record, blocked = known.record, self.election_blocked
        # This coordinator's own election in the record's term found its ensemble blocked:
        # an unsettled change then goes back to the ensemble it left (Rules.next_ensemble).
        found_blocked = (
            blocked is not None
            and blocked.term == record.term
            and blocked.ensemble == record.ensemble
        )
        ensemble, previous = self.rules.next_ensemble(record, wanted, doubtful, found_blocked)
        self._claim = TermRecord(record.term + 1, self.name, ensemble, previous=previous)
        self._cas(known.revision, self._claim, now)

    def _wants_change(self) -> bool:
        """Monitoring a record whose ensemble the host wants changed (and the rules allow it
        now), with no register request under way."""
        known = self._known
        doubtful = self.doubtful
        if self.wanted is None or doubtful is None or known is None or self._request is not None:
            return False
        record = known.record
        if record.term != self.term or not record.leader or self.outsider:
            return False  # an outsider starts no change: it would not carry it (takes_part)
        # Unsettled: next_ensemble keeps the record's ensemble (the rule is the Rules').
        return self.rules.next_ensemble(record, self.wanted, doubtful)[0] != record.ensemble

    def _settle_if_established(self, now: int) -> None:
        """The leader's barrier committed: write the record settled (see the module
        docstring), once, unless a register request is under way."""
        known = self._known
        if known is None or self._request is not None:
            return
        record = known.record
        if record.settled or record.term != self.term or record.leader != self.leader:
            return
        self._settle = replace(record, previous=())
        self._cas(known.revision, self._settle, now)

    # --- Terms ----------------------------------------------------------------------------------

    def _new_term_state(self, record: TermRecord) -> None:
        self.term = record.term
        self.ensemble = record.ensemble
        self.leader = record.leader
        self._responses = {}
        self._answered = set()
        self._member_retry = {
            m: _Retry(0, self.config.request_timeout_ticks) for m in self.ensemble
        }
        self._become_leader = None
        self._leader_followers = frozenset()
        self._settle = None

    def _start_fencing(self, record: TermRecord, now: int) -> None:
        self._new_term_state(record)
        self._deadline = now + self._jittered(self.config.election_timeout_ticks)
        self._resend_new_terms(now)

    def _start_monitoring(self, record: TermRecord, now: int) -> None:
        self.election_blocked = None  # a leader is appointed
        if record.term != self.term:  # another coordinator's term (else: the one we fenced)
            self._new_term_state(record)
        self.leader = record.leader
        if record.owner == self.name and self._responses:
            followers = tuple(r for m, r in sorted(self._responses.items()) if m != self.leader)
            self._become_leader = BecomeLeader(
                self.term, self.name, self.ensemble, followers, not record.settled
            )
            self._answered.update(self._responses)
        # Our own election goes on while the leader we appointed has its BecomeLeader to
        # come (takes_part); another's appointment is not ours to carry.
        self._carrying = self._become_leader is not None
        self._deadline = now + self._jittered(self.config.leader_timeout_ticks)
        self._resend_to_leader(now)
        self._resend_new_terms(now)

    def _on_new_term_response(self, resp: NewTermResponse, now: int) -> None:
        if resp.term != self.term or resp.member not in self.ensemble:
            return
        self._answered.add(resp.member)
        if resp.state != ReplicaState.FENCED.value:
            return
        if self.state is CoordState.APPOINTING:
            # Kept for the BecomeLeader (its followers) once appointed: else a member that
            # answers while the appointment is written, marked answered, would get neither
            # NewTerm again nor AddFollower, and no leader would replicate to it all term.
            self._responses[resp.member] = resp
        elif self.state is CoordState.FENCING:
            self._responses[resp.member] = resp
            # Only voters elect (a member with a lost disk does not); the others still get
            # aligned as followers of the chosen leader.
            voters = [r for r in self._responses.values() if r.voter]
            quorum = self.rules.quorum(len(self.ensemble))
            non_voters = tuple(sorted(m for m, r in self._responses.items() if not r.voter))
            if len(non_voters) > len(self.ensemble) - quorum:
                self.election_blocked = ElectionBlocked(
                    self.term, non_voters, quorum, self.ensemble
                )
            if len(voters) >= quorum:
                chosen = self.rules.choose_leader(voters)
                self._go(CoordEvent.MAJORITY_FENCED)
                known = self._known
                if known is None or self._claim is None:
                    raise IllegalTransitionError("coordinator", self.state, "appoint unclaimed")
                self._appoint = replace(self._claim, leader=chosen.member)
                self._cas(known.revision, self._appoint, now)
        elif self.state is CoordState.MONITORING and resp.member != self.leader:
            self._responses[resp.member] = resp
            self._member_retry[resp.member] = _Retry(0, self.config.request_timeout_ticks)
            self._resend_to_leader(now)

    def _on_heartbeat(self, hb: Heartbeat, now: int) -> None:
        if hb.term > self.term and self.state in (
            CoordState.FENCING,
            CoordState.MONITORING,
            CoordState.WAITING,
        ):
            self._go(CoordEvent.REGISTER_MOVED)
            self._read(now)
            return
        if (
            self.state is CoordState.MONITORING
            and hb.term == self.term
            and hb.leader == self.leader
        ):
            self._deadline = now + self._jittered(self.config.leader_timeout_ticks)
            self._become_leader = None  # the leader is leading
            self._carrying = False  # and its heartbeats reach the ensemble's coordinators
            self._leader_followers = frozenset(hb.followers)
            if hb.established:
                self._settle_if_established(now)

    # --- Re-sending -------------------------------------------------------------------------------

    def _due(self, member: str, now: int) -> bool:
        retry = self._member_retry.setdefault(member, _Retry(0, self.config.request_timeout_ticks))
        if now < retry.deadline:
            return False
        retry.deadline = now + retry.backoff
        retry.backoff = min(retry.backoff * 2, self.config.retry_backoff_max_ticks)
        return True

    def _resend_new_terms(self, now: int) -> None:
        msg = NewTerm(self.term, self.name, self.ensemble)
        for member in self.ensemble:
            if member not in self._answered and self._due(member, now):
                self.outbox.append((member, msg))

    def _resend_to_leader(self, now: int) -> None:
        """BecomeLeader until the leader's first heartbeat; AddFollower for each Fenced answer
        the leader's heartbeats do not list yet. Paced per member with their NewTerm retries
        (a member that answered gets no more NewTerms)."""
        leader = self.leader
        if self._become_leader is not None and self._due(leader, now):
            self.outbox.append((leader, self._become_leader))
        for member, resp in sorted(self._responses.items()):
            if member == leader or member in self._leader_followers:
                continue
            if self._become_leader is not None and any(
                r.member == member for r in self._become_leader.followers
            ):
                continue
            if self._due(member, now):
                self.outbox.append((leader, AddFollower(self.term, self.name, resp)))

    # --- Helpers ----------------------------------------------------------------------------------

    def _go(self, event: CoordEvent) -> None:
        try:
            self.state = COORDINATOR_TRANSITIONS[(self.state, event)]
        except KeyError:
            raise IllegalTransitionError("coordinator", self.state, event) from None
        # A claim starts an election of our own; reading or waiting means another's record
        # was seen (monitoring decides in _start_monitoring).
        if self.state is CoordState.CLAIMING:
            self._carrying = True
        elif self.state in (CoordState.READING, CoordState.WAITING):
            self._carrying = False

    def _jittered(self, ticks: int) -> int:
        return ticks + self._rng.randrange(ticks)
