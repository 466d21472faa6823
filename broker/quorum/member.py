"""A member's replica state machine for one journal (sans-IO).

`Member.handle(message, now)` applies one protocol message; effects go to `outbox`
((destination, message) pairs the shell sends) and `notices` (answers to local appends). Every
handler first checks the message's term: an older term is answered STALE (leaders' messages) or
dropped (coordinators'); a newer term is only legal on NewTerm (TermNotJoinedError otherwise).
It then looks the (state, event) pair up in the transition table (states.py), which raises
IllegalTransitionError for a pair no correct peer produces, and only then changes anything.
Handlers check everything that can fail before they change the log, so that a raise leaves the
member as it was.

Durability: the ReplicaLog is the member's durable state. A follower syncs before it answers; a
member syncs (log and term) before it answers NewTerm, so that the head it reports survives a
crash. A restarted member is rebuilt from its log alone (`Member(name, log, ...)`): Fenced in its
persisted term (NotMember if it never joined one), with no leader role and no pending appends.

Reads: `read_limit` is the commit offset. Content below it is committed and never changes;
content above it is not served. A follower's trails the leader's by a message: read_index.py is
how a read through it still sees every acknowledged append.
"""

from __future__ import annotations

from broker.quorum.config import QuorumConfig
from broker.quorum.entry import EntryId
from broker.quorum.errors import (
    LogDivergedError,
    NotLeaderError,
    ProtocolError,
    TermNotJoinedError,
    TruncateBelowCommitError,
)
from broker.quorum.leader import (
    LeaderRole,
    Notice,
    Outbox,
    RegisterCheck,
    RegisterUpdate,
    compact,
)
from broker.quorum.log import ReplicaLog
from broker.quorum.messages import (
    AddFollower,
    BecomeLeader,
    NewTerm,
    NewTermResponse,
    ReplicaResponse,
    Replicate,
    ReplyStatus,
    Snapshot,
    Truncate,
)
from broker.quorum.rules import CORRECT_RULES, Rules
from broker.quorum.states import Event, ReplicaState, next_state


class Member:
    def __init__(
        self,
        name: str,
        log: ReplicaLog,
        config: QuorumConfig | None = None,
        rules: Rules = CORRECT_RULES,
        *,
        lost_state: bool = False,
        lost_nonce: int = 0,
    ) -> None:
        if lost_state and lost_nonce <= 0:
            raise ValueError(f"{name}: a member back from a lost disk needs a nonce above 0")
        self.name = name
        self.log = log
        self.config = config or QuorumConfig()
        self.rules = rules
        self.state = ReplicaState.FENCED if log.term > 0 else ReplicaState.NOT_MEMBER
        # `lost_state`: the shell knows this member's log is not the one it had (a new disk).
        # `lost_nonce`: unique to this start of it (begin_lost).
        self.lost_state = lost_state
        self.lost_nonce = lost_nonce if lost_state else 0
        self.leader: LeaderRole | None = None
        self.leader_hint = ""
        # How far the snapshot store holds the journal, as far as this member knows.
        self.stored_end = log.base.end
        self.outbox: Outbox = []
        self.notices: list[Notice] = []

    def __repr__(self) -> str:
        log = self.log
        return (
            f"Member({self.name} {self.state} term={log.term} head={log.head} "
            f"commit={log.commit_index} base={log.base.index})"
        )

    def begin_lost(self, nonce: int, register_term: int) -> None:
        """The shell learned that this member's log is new although the member was in the
        ensemble (a lost disk), before it took part. `nonce`: unique to this start (never
        given before, by this member or an earlier start of it): the member answers with it
        and takes an alignment only if it echoes it (Rules.accepts_alignment), so a Truncate
        or Snapshot sent before the loss and delivered late cannot align the new log.
        `register_term`: the term register's current term, read after the loss: the member
        starts fenced into it (Rules.lost_start_term), as its lost log was into a term at or
        below it, so a leader deposed before the loss cannot make it acknowledge entries."""
        if nonce <= 0:
            raise ValueError(f"{self.name}: a member back from a lost disk needs a nonce above 0")
        self.lost_state = True
        self.lost_nonce = nonce
        term = self.rules.lost_start_term(self.log.term, register_term)
        if term > self.log.term:
            state = next_state(self.state, Event.NEW_TERM)
            self._step_down(term)  # durably: a restart before catching up keeps the fence
            self.state = state

    # --- Reading -------------------------------------------------------------------------------

    @property
    def term(self) -> int:
        return self.log.term

    @property
    def voter(self) -> bool:
        """Whether this member's head counts in an election (Rules.may_vote). Latched: once
        caught up, a later alignment (truncating back into an earlier term) does not make it a
        non-voter again; its log then holds everything committed before its loss."""
        if self.lost_state and self.rules.may_vote(self.lost_state, self.log):
            self.lost_state = False  # the shell persists this (it clears its lost mark)
        return self.rules.may_vote(self.lost_state, self.log)

    @property
    def read_limit(self) -> int:
        """The commit offset: readers may see the journal's content before it, nothing after."""
        return self.log.end_at(self.log.commit_index)

    # --- Inputs --------------------------------------------------------------------------------

    def handle(self, msg: object, now: int) -> None:
        match msg:
            case Replicate():
                self._on_replicate(msg, now)
            case ReplicaResponse():
                self._on_replica_response(msg, now)
            case NewTerm():
                self._on_new_term(msg, now)
            case BecomeLeader():
                self._on_become_leader(msg, now)
            case AddFollower():
                self._on_add_follower(msg, now)
            case Truncate():
                self._on_truncate(msg, now)
            case Snapshot():
                self._on_snapshot(msg, now)
            case _:
                raise ProtocolError(f"{self.name}: unknown message {msg!r}")
        if self.lost_state:
            _ = self.voter  # latch as soon as it caught up (a shell persists that)

    def tick(self, now: int) -> None:
        if self.leader is not None:
            self.leader.tick(now)

    def append(
        self,
        data: bytes,
        token: object,
        now: int,
        check: RegisterCheck | None = None,
        update: RegisterUpdate | None = None,
    ) -> EntryId:
        """Append `data` (the leader only); see LeaderRole.append."""
        if self.leader is None:
            raise NotLeaderError(self.name, self.leader_hint)
        return self.leader.append(data, token, now, check, update)

    def sync(self, now: int) -> None:
        """The shell made this member's written entries durable (only a leader has unsynced
        entries: followers sync as they append)."""
        if self.leader is not None:
            self.leader.on_synced(now)
        else:
            self.log.sync()

    def on_stored(self, end: int) -> None:
        """The snapshot store holds the journal through offset `end`."""
        self.stored_end = max(self.stored_end, end)
        if self.leader is not None:
            self.leader.on_stored(end)
        else:
            compact(self.log, self.stored_end, self.config)

    # --- Coordinator messages ---------------------------------------------------------------------

    def _on_new_term(self, msg: NewTerm, now: int) -> None:
        log = self.log
        if msg.term < log.term:
            return
        if self.name not in msg.ensemble:
            raise ProtocolError(f"{self.name}: NewTerm {msg.term} for an ensemble without it")
        if msg.term == log.term and self.state is not ReplicaState.FENCED:
            if self.state is ReplicaState.NOT_MEMBER:
                raise ProtocolError(f"{self.name}: NewTerm of term {msg.term}")
            self._answer_new_term(msg)  # a re-delivery: where this member stands now
            return
        state = next_state(self.state, Event.NEW_TERM)
        if msg.term > log.term:
            self._step_down(msg.term)
        self.state = state
        self._answer_new_term(msg)

    def _answer_new_term(self, msg: NewTerm) -> None:
        log = self.log
        commit = EntryId(log.term_at(log.commit_index) or 0, log.commit_index)
        summary = log.term_summary(log.commit_index)
        voter = self.voter
        nonce = 0 if voter else self.lost_nonce
        resp = NewTermResponse(
            log.term, self.name, self.state.value, log.head, commit, summary, voter, nonce
        )
        self.outbox.append((msg.coordinator, resp))

    def _on_become_leader(self, msg: BecomeLeader, now: int) -> None:
        if not self._current(msg.term):
            return
        state = next_state(self.state, Event.BECOME_LEADER)
        if self.state is ReplicaState.LEADER or self.log.led_term == msg.term:
            # A re-delivery. After a restart (Fenced, led_term set) too: this member led the
            # term before and lost its unsynced entries, which followers may hold; leading
            # again would write other entries at those indices. The coordinator replaces it.
            return
        if self.name not in msg.ensemble:
            raise ProtocolError(f"{self.name}: BecomeLeader for an ensemble without it")
        if not self.voter:
            # Chosen on the answer it gave before its disk was lost: it holds nothing of what
            # it reported. It does not lead; the coordinator replaces a leader that is silent.
            return
        self.log.led_term = msg.term  # durably, before anything is written in the term
        self.state = state
        self.leader_hint = self.name
        self.leader = LeaderRole(
            self.name,
            msg.term,
            msg.ensemble,
            self.log,
            self.config,
            self.rules,
            self.outbox,
            self.notices,
            self.stored_end,
            changing=msg.changing,
        )
        self.leader.start(msg.followers, now)

    def _on_add_follower(self, msg: AddFollower, now: int) -> None:
        if not self._current(msg.term):
            return
        if self.state is ReplicaState.FENCED:
            # Chosen but not (or no longer: restarted) leading: the BecomeLeader is late, or
            # the coordinator will replace this silent leader. Not an error.
            return
        self.state = next_state(self.state, Event.ADD_FOLLOWER)
        if self.leader is not None:
            self.leader.add_follower(msg.follower, now)

    # --- Leader messages -------------------------------------------------------------------------

    def _on_truncate(self, msg: Truncate, now: int) -> None:
        if not self._current(msg.term, msg.leader):
            return
        state = next_state(self.state, Event.TRUNCATE)
        log = self.log
        if log.aligned_term != msg.term:  # else a re-delivery: already aligned in this term
            if not self.rules.accepts_alignment(self.lost_state, self.lost_nonce, msg.nonce):
                self._answer(msg.leader, ReplyStatus.LOST)  # sent before its loss: not this log
                return
            if not log.has(msg.to) and self.lost_state:
                self._answer(msg.leader, ReplyStatus.LOST)  # aligned on its lost log
                return
            if not log.has(msg.to):
                raise LogDivergedError(
                    f"{self.name}: told to truncate after {msg.to}, which it does not hold"
                )
            if msg.to.index < log.commit_index:
                raise TruncateBelowCommitError(
                    f"{self.name}: truncation after {msg.to} is below commit {log.commit_index}"
                )
            self.rules.align(log, msg.to.index)
            log.aligned_head = msg.leader_head  # before the term: a torn write stays a non-voter
            log.aligned_term = msg.term
            log.sync()
        else:
            self._raise_aligned_head(msg.leader_head)
        self._follow(state, msg.leader)
        self._answer(msg.leader, ReplyStatus.OK)

    def _on_replicate(self, msg: Replicate, now: int) -> None:
        if not self._current(msg.term, msg.leader):
            return
        state = next_state(self.state, Event.REPLICATE)
        log = self.log
        if log.aligned_term != msg.term:
            if self.lost_state:
                self._answer(msg.leader, ReplyStatus.LOST)  # aligned on its lost log
                return
            raise ProtocolError(f"{self.name}: Replicate of term {msg.term} before alignment")
        prev = msg.prev
        if prev.index > log.head_index:
            self._follow(state, msg.leader)
            self._answer(msg.leader, ReplyStatus.GAP)
            return
        # Check everything first: an aligned log is a prefix of the leader's, so any overlap
        # must agree, and the new entries must continue the log.
        if prev.index >= log.base.index and log.term_at(prev.index) != prev.term:
            raise LogDivergedError(f"{self.name}: holds no {prev} (Replicate from {msg.leader})")
        fresh = []
        next_index, next_begin = log.head_index + 1, log.head_end
        for entry in msg.entries:
            if entry.index < next_index:
                if entry.index > log.base.index and log.term_at(entry.index) != entry.term:
                    raise LogDivergedError(f"{self.name}: holds another entry than {entry!r}")
                continue
            if entry.index != next_index or entry.begin != next_begin:
                raise LogDivergedError(f"{self.name}: {entry!r} does not continue its log")
            fresh.append(entry)
            next_index, next_begin = entry.index + 1, entry.end
        for entry in fresh:
            log.append(entry)
        log.sync()
        log.set_commit(msg.commit_index)
        self.stored_end = max(self.stored_end, msg.stored_end)
        compact(log, self.stored_end, self.config)
        self._follow(state, msg.leader)
        self._answer(msg.leader, ReplyStatus.OK)

    def _on_snapshot(self, msg: Snapshot, now: int) -> None:
        if not self._current(msg.term, msg.leader):
            return
        state = next_state(self.state, Event.SNAPSHOT)
        log, base = self.log, msg.base
        if log.aligned_term != msg.term and not self.rules.accepts_alignment(
            self.lost_state, self.lost_nonce, msg.nonce
        ):
            self._answer(msg.leader, ReplyStatus.LOST)  # sent before its loss: not this log
            return
        if log.aligned_term != msg.term or log.head_index < base.index:
            if log.commit_index > base.index:
                raise TruncateBelowCommitError(
                    f"{self.name}: snapshot at {base.index} is below commit {log.commit_index}"
                )
            if base.index >= log.base.index and log.has(base.id):
                # This log holds the snapshot's base: keep it, drop what follows, compact.
                if log.aligned_term != msg.term:
                    self.rules.align(log, base.index)
                log.sync()
                log.set_commit(base.index)
                log.compact_through(base.index)
            else:
                log.reset_to(base)  # its registers too
                log.set_commit(base.index)
            if log.aligned_term != msg.term:
                log.aligned_head = msg.leader_head  # before the term, as in _on_truncate
            log.aligned_term = msg.term
        self._raise_aligned_head(msg.leader_head)
        log.set_commit(msg.commit_index)
        self.stored_end = max(self.stored_end, base.end)
        self._follow(state, msg.leader)
        self._answer(msg.leader, ReplyStatus.OK)

    def _on_replica_response(self, msg: ReplicaResponse, now: int) -> None:
        if self.leader is None:
            return  # an answer to a leader role that ended
        newer = self.leader.on_response(msg, now)
        if newer:
            # A follower was fenced into a newer term: this leader is deposed.
            self.state = next_state(self.state, Event.NEW_TERM)
            self._step_down(newer)

    # --- Helpers ---------------------------------------------------------------------------------

    def _current(self, term: int, leader: str = "") -> bool:
        """Whether a message of `term` is for this member's current term. An older one is
        answered STALE (if a leader sent it) and dropped; a newer one raises."""
        if term < self.log.term:
            if leader:
                self._answer(leader, ReplyStatus.STALE)
            return False
        if term > self.log.term:
            if self.lost_state and leader:
                # Its log is new: it forgot the term it had joined, and the leader may think
                # it aligned. Join the term (a non-voter: nothing to fence) and say so. Also
                # once it joined an earlier term this way: a deposed leader's message, late
                # in the network, may have come first (simulation seed 1524).
                self.state = next_state(self.state, Event.NEW_TERM)
                self._step_down(term)
                self._answer(leader, ReplyStatus.LOST)
                return False
            if self.lost_state:
                return False  # a coordinator's, for a term it forgot: NewTerm comes again
            raise TermNotJoinedError(
                f"{self.name}: a message of term {term}, but fenced only into {self.log.term}"
            )
        return True

    def _raise_aligned_head(self, leader_head: EntryId) -> None:
        """A later Truncate or Snapshot of the aligning term (a re-send) carries a later head
        of the same leader: a member not yet voting again waits for that one too. It may be
        the first to reach this log since the disk was lost (an earlier one was sent before
        the loss and delivered late), and only a head sent after the loss covers every entry
        acknowledged before it."""
        log = self.log
        if (
            self.lost_state
            and leader_head.term == log.aligned_term
            and leader_head.index > log.aligned_head.index
        ):
            log.aligned_head = leader_head

    def _follow(self, state: ReplicaState, leader: str) -> None:
        self.state = state
        self.leader_hint = leader

    def _answer(self, leader: str, status: ReplyStatus) -> None:
        log = self.log
        nonce = self.lost_nonce if self.lost_state else 0
        self.outbox.append((leader, ReplicaResponse(log.term, self.name, status, log.head, nonce)))

    def _step_down(self, term: int) -> None:
        """Enter `term` (durably, with everything written so far), ending any leader role."""
        if self.leader is not None:
            self.leader.fail_pending(f"{self.name} stopped leading term {self.log.term}")
            self.leader = None
        self.leader_hint = ""
        self.log.sync()
        self.log.term = term
        if self.state is not ReplicaState.NOT_MEMBER:
            self.state = ReplicaState.FENCED
