"""One broker's asyncio shell around the quorum core for one journal: a `Member` (the replica
state machine and, when it leads, the leader role) and a `Coordinator`, driven by a clock in
milliseconds, with their messages carried by a transport (transport.py) and the term register
in the keyspace (term_register.py).

Names. A node is the member named after its broker; its coordinator is `<member>!coordinator`.
Messages to a coordinator (NewTermResponse, Heartbeat) go to that name; COORDINATORS fans out
to every member's coordinator. Messages to this node itself are handled on the next loop turn,
never re-entrantly.

Appends. `append(data)` is answered once the entry commits (a majority holds it, in the
leader's term): the committed [begin, end). `append_checked` also checks and updates the
journal's registers (leader.py): it answers the core's `Committed` notice (with the registers
after the append) or `RegistersMismatched` (the check failed against committed registers). A follower raises `NotLeaderError` naming the
leader it knows; a leader that steps down first fails the append with
`AppendOutcomeUnknownError` (it may still commit under a later leader).

Durability. With a log file (log_file.py: a broker with a data directory) the member is
rebuilt from it, and every change the core makes is appended to it after each call into the
core and before anything that call produced is sent or answered (`_persist`, first thing in
`_flush`): a follower's acknowledgement, a NewTerm answer, a leader counting itself, a commit
readers may see. A write that fails stops the node (`failure`, a `LogWriteError`; `failed` is
set), and its owner (journals.py) starts a new node from the file after a back-off. Without a
file the log is in memory: a process crash loses it (tests, and brokers without --data-dir).

Lost disks. With a `joiner` (member_registry.py: every node a broker starts; without a data
directory its member log is in memory, and the node joins as one back from a lost disk whenever
the keyspace shows its member joined before and the journal had a term) the node first joins:
it decides from the keyspace whether its member lost its disk, and takes no part (drops
every message, starts no coordinator) until it knows. A lost member then reads the term
register and starts with `Member.begin_lost`: fenced into the register's current term (its
lost log forgot the term it had joined; a leader deposed before the loss must not align it)
and with a random nonce of this start (an alignment sent before the loss, late, must not
align the new log). It does not vote until a leader has caught it up; once `Member.voter`
latches (and the log that made it a voter is in its file) the node clears its `lost` mark. A
coordinator that finds the election impossible (`Coordinator.election_blocked`: too many
members lost their disk) is logged once per change and counted in
`gazette_quorum_elections_blocked`; `election_blocked` tells the node's owner. The node's
other metrics (term, commit lag, elections, refusals, Snapshots) are node_metrics.py's.

Ensemble changes. `ensemble` is the one the node started with (the route, or the term
register's); the members it talks to (`peers`) also include the register's ensemble as its
coordinator last read it and, while it leads, its term's ensemble, so that a member added or
removed by an ensemble change (Rules.next_ensemble) hears the leader's heartbeats and
replication. `wanted` (the owner's wish: the allocator's route) is handed to the coordinator
only while this node leads: one proposer, so brokers whose views of the route differ for a
moment do not move the ensemble back and forth; with it, the members its leader cannot count on
(`LeaderRole.doubtful`: silent lately), so that a dead member is removed before its successor is
added (no append stall while the successor catches up: Rules.next_ensemble). A node whose
broker is outside the register's current ensemble receives no heartbeats: its coordinator
(told its member) takes no initiative there, as it would otherwise claim a term every leader
timeout, deposing a healthy leader each time (what a route change did before), but carries
through an election it started, such as its own leader's change removing this member
(Coordinator.takes_part); it goes on once a change adds it (the new term's NewTerm reaches
its member, the leader's heartbeats its coordinator).
"""

from __future__ import annotations

import asyncio
import random
import secrets
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from broker.keyspace.backend import KeySpaceError
from broker.logging import get_logger
from broker.quorum.config import QuorumConfig
from broker.quorum.coordinator import REGISTER, Coordinator, ElectionBlocked
from broker.quorum.errors import LogFullError, ProtocolError, QuorumError, QuorumInvariantError
from broker.quorum.leader import (
    AppendFailed,
    Committed,
    RegisterCheck,
    RegistersMismatched,
    RegisterUpdate,
)
from broker.quorum.log import ReplicaLog
from broker.quorum.member import Member
from broker.quorum.messages import COORDINATORS, Heartbeat, NewTermResponse
from broker.quorum.read_index import ReadIndexAnswer, ReadIndexAsk
from broker.quorum.register import RegisterCas, RegisterRead, RegisterReply
from broker.quorum_shell.log_file import QuorumLogFile
from broker.quorum_shell.member_dir import clear_mark
from broker.quorum_shell.member_registry import (
    Decision,
    Joiner,
    join_backoff_initial_s,
    join_backoff_max_s,
)
from broker.quorum_shell.node_config import (
    broker_coordinator_config,
    broker_quorum_config,
    tick_interval_s,
)
from broker.quorum_shell.node_metrics import NodeMetrics
from broker.quorum_shell.read_barrier import ReadBarrier
from broker.quorum_shell.term_record import TermRecordDecodeError
from broker.quorum_shell.transport import SendOutcome
from broker.quorum_shell.wire import Envelope

log = get_logger(__name__)

COORDINATOR_SUFFIX = "!coordinator"


class AppendOutcomeUnknownError(QuorumError):
    """The leader stepped down before the append committed: it may or may not commit later."""


class LogWriteError(QuorumError):
    """The member's log file could not be written: the node stops taking part (what it did
    not persist it must not acknowledge)."""


class Transport(Protocol):
    def send(self, node: str, envelope: Envelope) -> asyncio.Future[SendOutcome]: ...


class Register(Protocol):
    async def answer(self, request: RegisterRead | RegisterCas) -> RegisterReply: ...


class QuorumNode:
    def __init__(
        self,
        journal: str,
        name: str,
        ensemble: tuple[str, ...],
        register: Register,
        transport: Transport,
        *,
        seed: int = 0,
        clock: Callable[[], float] = time.monotonic,
        log_file: QuorumLogFile | None = None,
        config: QuorumConfig | None = None,
        joiner: Joiner | None = None,
    ) -> None:
        self.journal = journal
        self.name = name
        self.ensemble = ensemble
        self._register = register
        self._transport = transport
        self._clock = clock
        self._epoch = clock()
        self.log_file = log_file
        self.member = Member(
            name,
            log_file.log if log_file is not None else ReplicaLog(),
            config or broker_quorum_config(),
        )
        self.coordinator = Coordinator(
            name + COORDINATOR_SUFFIX,
            ensemble,
            random.Random(f"{journal}/{name}/{seed}"),
            broker_coordinator_config(),
            member=name,
        )
        self._pending: dict[object, asyncio.Future[Committed | RegistersMismatched]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        # A ProtocolError means a core detected an impossible message, a LogWriteError that
        # the log could not be persisted: the node stops taking part (it neither acknowledges
        # nor leads) and the error is kept for its owner.
        self.failure: ProtocolError | LogWriteError | None = None
        self.failed = asyncio.Event()  # set with `failure` (what the node's owner waits on)
        # Why the last register request failed; None once one succeeds (status.py shows it).
        self.register_error: Exception | None = None
        self._register_requests = 0  # register requests sent so far
        self._register_outcome_of = 0  # the request whose outcome register_error is
        # Set whenever the cores may have changed (a message, a tick, an answer): observers
        # (tests, metrics) wait on it rather than polling.
        self.progress = asyncio.Event()
        # Set while this node knows the term's leader (itself or another): appends that
        # arrive during an election wait on it rather than fail.
        self.leader_known = asyncio.Event()
        # Set whenever the commit offset moved (the spool applier's only trigger).
        self.commit_changed = asyncio.Event()
        self._commit_seen = 0
        # Joining (see the module docstring): the node takes no part until `joined` is set.
        self._joiner = joiner
        self.joined = asyncio.Event()
        self.join_decision: Decision | None = None
        self._lost_marked = False  # the member's `lost` mark is on disk
        self.metrics = NodeMetrics(journal, name)
        # The ensemble the owner wants (see the module docstring); None: no change.
        self.wanted: tuple[str, ...] | None = None
        # Set by the owner while the node runs only because the term register names this
        # member, the journal not being assigned to its broker (journals.py): a member of the
        # ensemble, or of the one an unsettled change left, which may have to go back to it.
        self.kept_unassigned = False
        # Read-your-writes: the read index non-blocking reads wait for (read_barrier.py).
        self.reads = ReadBarrier(self)

    # --- Lifecycle -------------------------------------------------------------------------

    def now(self) -> int:
        return int((self._clock() - self._epoch) * 1000)

    async def start(self) -> None:
        """Start taking part: at once without a joiner, else once joined (in the background:
        `joined` is set then)."""
        if self._joiner is None:
            self._begin()
        self._loop_task = asyncio.get_running_loop().create_task(self._run())

    def _begin(self) -> None:
        self.joined.set()
        self.coordinator.start(self.now())
        self._flush()

    async def _join(self, joiner: Joiner) -> None:
        try:
            decision = await joiner.join()
        except OSError as err:
            # Its mark could not be written: it must not take part, voter or not.
            self._fail(LogWriteError(f"member mark beside {joiner.member_dir}: {err}"))
            return
        self.join_decision = decision
        self._lost_marked = decision.lost
        if decision.lost:
            term = await self._register_term()
            # Random: unique to this start with overwhelming odds (a restart draws another,
            # and the leader aligns it again with that one).
            self.member.begin_lost(secrets.randbits(62) + 1, term)
        log.info(
            "quorum member joined",
            journal=self.journal,
            node=self.name,
            lost=decision.lost,
            reason=decision.reason,
        )
        self._begin()

    def keep_unassigned(self, kept: bool) -> None:
        """The owner keeps (True) this node only because the term register names this member
        (`kept_unassigned`), or no longer only for that: logged and exported once per change
        (gazette_quorum_kept_unassigned)."""
        if kept == self.kept_unassigned:
            return
        self.kept_unassigned = kept
        self.metrics.kept_unassigned(kept)
        if kept:
            log.info(
                "quorum node kept: the term register names this member, though the journal"
                " is not assigned here (it stops once a settled ensemble no longer names it)",
                journal=self.journal,
                node=self.name,
            )
        else:
            log.info("quorum node assigned here again", journal=self.journal, node=self.name)

    async def stop(self) -> None:
        tasks = [t for t in (self._loop_task, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._fail_pending("the node stopped")
        self.metrics.close()
        if self.log_file is not None:
            self.log_file.close()

    async def _run(self) -> None:
        if self._joiner is not None:
            await self._join(self._joiner)
            if self.failure is not None:
                return
        while True:
            await asyncio.sleep(tick_interval_s)
            if self.failure is not None:
                continue
            now = self.now()
            self.member.tick(now)
            coordinator = self.coordinator
            leader = self.member.leader
            coordinator.wanted = self.wanted if leader is not None else None
            coordinator.doubtful = leader.doubtful(now) if leader is not None else None
            coordinator.tick(now)  # an outsider's does nothing (Coordinator.outsider)
            self._flush()

    # --- Appends and reads -----------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self.member.leader is not None

    @property
    def leader_name(self) -> str:
        """The member this node believes leads the current term ("": none known)."""
        if self.is_leader:
            return self.name
        return self.coordinator.leader or self.member.leader_hint

    @property
    def peers(self) -> tuple[str, ...]:
        """The members this node sends to: see the module docstring."""
        names = set(self.ensemble) | set(self.coordinator.ensemble)
        leader = self.member.leader
        if leader is not None:
            names.update(leader.ensemble)
        return tuple(sorted(names))

    @property
    def commit_offset(self) -> int:
        return self.member.read_limit

    @property
    def election_blocked(self) -> ElectionBlocked | None:
        """Why the coordinator finds the election impossible (None: it does not)."""
        return self.metrics.election_blocked

    def read_committed(self, begin: int = 0) -> bytes:
        """Committed content from `begin` (held in the log: not yet compacted)."""
        return self.member.log.read(begin, self.member.read_limit)

    async def append(self, data: bytes) -> tuple[int, int]:
        """Append `data`; answer its committed [begin, end) (see the module docstring)."""
        committed = await self.append_checked(data)
        if not isinstance(committed, Committed):
            raise QuorumInvariantError(f"{self.journal}: a mismatch without a check")
        return committed.begin, committed.end

    async def append_checked(
        self,
        data: bytes,
        check: RegisterCheck | None = None,
        update: RegisterUpdate | None = None,
        at: Callable[[int], None] | None = None,
    ) -> Committed | RegistersMismatched:
        """Append `data` with a register check and update (see the module docstring). `at`,
        given the log's head end (where the append would land), raises to refuse it: called
        synchronously with the append, so that nothing lands between them."""
        if self.failure is not None:
            raise self.failure
        if at is not None:
            at(self.member.log.head_end)
        token = object()
        now = self.now()
        # NotLeaderError, LogFullError, EmptyRegisterUpdateError, what `update` raises: to the
        # caller, nothing changed. The check runs against the head here, synchronously.
        try:
            self.member.append(data, token, now, check, update)
        except LogFullError:
            self.metrics.log_full()
            raise
        future: asyncio.Future[Committed | RegistersMismatched]
        future = asyncio.get_running_loop().create_future()
        self._pending[token] = future
        # Written to the file (synced with fsync): the leader counts itself from here.
        if self._persist():
            self.member.sync(now)
        self._flush()
        return await future

    def on_stored(self, end: int) -> None:
        """The fragment store holds the journal through offset `end`: the core may compact."""
        if self.failure is not None or not self.joined.is_set():
            return
        self.member.on_stored(end)
        self._flush()

    # --- Messages --------------------------------------------------------------------------

    def receive(self, envelope: Envelope) -> None:
        if self.failure is not None or not self.joined.is_set():
            return  # not joined yet: the senders re-send
        now = self.now()
        msg = envelope.message
        if isinstance(msg, ReadIndexAsk | ReadIndexAnswer):
            self.reads.receive(msg)  # no core state changes: nothing to persist
            return
        try:
            if envelope.to.endswith(COORDINATOR_SUFFIX):
                self.coordinator.handle(msg, now)
            else:
                base = self.member.log.base
                self.member.handle(msg, now)
                self.metrics.received(msg, base, self.member.log.base)
                if self._persist():
                    self.member.sync(now)
        except ProtocolError as err:
            self._fail(err)
            return
        self._flush()

    def _fail(self, err: ProtocolError | LogWriteError) -> None:
        self.failure = err
        self.failed.set()
        log.error("quorum node failed", journal=self.journal, node=self.name, error=str(err))
        self._fail_pending(f"{type(err).__name__}: {err}")
        self.progress.set()  # observers see the failure

    def _persist(self) -> bool:
        """Append the core's changes to the log file; False (the node failed) if it could
        not. Before anything the changes allow is sent."""
        if self.log_file is None or self.failure is not None:
            return self.failure is None
        try:
            self.log_file.persist()
        except OSError as err:
            self._fail(LogWriteError(f"{self.log_file.path}: {err}"))
            return False
        return True

    def _flush(self) -> None:
        if not self._persist():
            # Nothing the unpersisted changes allow may leave: drop it.
            self.member.outbox.clear()
            self.coordinator.outbox.clear()
            self.member.notices.clear()
            return
        if self._lost_marked and not self.member.lost_state:
            self._clear_lost_mark()
        if self.coordinator.election_blocked != self.election_blocked:
            self.metrics.on_election_blocked(self.coordinator.election_blocked)
        self.metrics.observe(self)
        self.progress.set()
        if self.leader_name:
            self.leader_known.set()
        else:
            self.leader_known.clear()
        if self.member.read_limit != self._commit_seen:
            self._commit_seen = self.member.read_limit
            self.commit_changed.set()
        member, coordinator = self.member, self.coordinator
        peers = self.peers
        while member.outbox or coordinator.outbox or member.notices:
            # Emptied in place: the leader role holds these very lists.
            out = list(member.outbox)
            member.outbox.clear()
            for dest, msg in out:
                if dest == COORDINATORS:
                    for m in peers:
                        self._deliver(Envelope(self.journal, m + COORDINATOR_SUFFIX, msg), peers)
                else:
                    self._deliver(Envelope(self.journal, dest, msg), peers)
            out = list(coordinator.outbox)
            coordinator.outbox.clear()
            for dest, msg in out:
                if dest == REGISTER:
                    assert isinstance(msg, RegisterRead | RegisterCas)
                    self._spawn(self._ask_register(msg))
                else:
                    self._deliver(Envelope(self.journal, dest, msg), peers)
            notices = list(member.notices)
            member.notices.clear()
            for notice in notices:
                future = self._pending.pop(notice.token, None)
                if future is None or future.done():
                    continue
                if isinstance(notice, Committed | RegistersMismatched):
                    future.set_result(notice)
                elif isinstance(notice, AppendFailed):
                    future.set_exception(AppendOutcomeUnknownError(notice.reason))

    def _clear_lost_mark(self) -> None:
        """The member is a voter again, and the log that made it one is in its file."""
        if self.log_file is not None:  # in memory: no mark (every start is a lost disk's)
            try:
                clear_mark(self.log_file.path.parent)
            except OSError as err:
                # Kept: a restart then starts it lost again, which is safe (it waits to be
                # caught up once more); retried on the next flush.
                log.warning("quorum lost mark not cleared", journal=self.journal, error=str(err))
                return
        self._lost_marked = False
        log.info("quorum member caught up: votes again", journal=self.journal, node=self.name)

    def _deliver(
        self, envelope: Envelope, peers: tuple[str, ...]
    ) -> asyncio.Future[SendOutcome] | None:
        """Send `envelope`: its outcome (transport.py), None if not sent over the transport
        (to this node itself, or to a node that is not a peer)."""
        self.metrics.sent(envelope.message)
        node = envelope.to.removesuffix(COORDINATOR_SUFFIX)
        if node == self.name:
            asyncio.get_running_loop().call_soon(self.receive, envelope)
        elif isinstance(envelope.message, NewTermResponse | Heartbeat) or node in peers:
            return self._transport.send(node, envelope)
        return None

    async def _register_term(self) -> int:
        """The term register's current term, for a member back from a lost disk: read
        again on failure, doubling from join_backoff_initial_s to join_backoff_max_s, never
        giving up (the member must not take part below it); the last error is kept."""
        backoff = join_backoff_initial_s
        while True:
            sent = self._register_sent()
            try:
                reply = await self._register.answer(RegisterRead(self.coordinator.name, 0))
                self._register_outcome(sent, None)
                return reply.current.record.term
            except (KeySpaceError, TermRecordDecodeError) as err:
                self._register_outcome(sent, err)
                log.warning("quorum term register", journal=self.journal, error=str(err))
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, join_backoff_max_s)

    async def _ask_register(self, request: RegisterRead | RegisterCas) -> None:
        # A failed request is not retried here: the coordinator re-sends it on its bounded
        # backoff. The error is kept (and logged) for the node's owner to report.
        sent = self._register_sent()
        try:
            reply = await self._register.answer(request)
        except (KeySpaceError, TermRecordDecodeError) as err:
            self._register_outcome(sent, err)
            log.warning("quorum term register", journal=self.journal, error=str(err))
            return
        self._register_outcome(sent, None)
        if self.failure is None:
            self.coordinator.handle(reply, self.now())
            self._flush()

    def _register_sent(self) -> int:
        """The sequence number of a register request being sent (see _register_outcome)."""
        self._register_requests += 1
        return self._register_requests

    def _register_outcome(self, sent: int, err: Exception | None) -> None:
        """Keep the outcome of request `sent` as `register_error`, unless a request sent after
        it has already ended: requests overlap (the coordinator re-sends one every backoff
        while an earlier one may wait for etcd's timeout), and the outcome to show is the
        newest, not the last to end (a stale timeout shown on a healthy journal)."""
        if sent < self._register_outcome_of:
            return
        self._register_outcome_of = sent
        self.register_error = err

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # For read_barrier.py: tasks cancelled with the node, messages to other members, the
    # term register.
    spawn = _spawn

    def send(self, member: str, msg: object) -> asyncio.Future[SendOutcome] | None:
        return self._deliver(Envelope(self.journal, member, msg), self.peers)

    @property
    def register(self) -> Register:
        return self._register

    def _fail_pending(self, reason: str) -> None:
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(AppendOutcomeUnknownError(reason))
