"""A broker's quorum journals: one `QuorumNode` per local journal labelled
`gazette.dev/replication-mode=quorum`, kept in step with the keyspace, and the broker's side of
the replication RPC and of quorum appends.

Reconciliation is a KeySpace observer (it runs synchronously after every keyspace update):
a quorum journal assigned to this broker whose route has all `replication` members, each with
an endpoint, gets a node; so does one whose term register (a term was claimed: the journal
elected before) names this broker in its ensemble, whatever its route, so that after a restart
a live majority elects without waiting for the members still down (their endpoints are
attached once they announce themselves, `_refresh_endpoints`); its ensemble is the route's members (`zone#suffix`, sorted) as first
seen, and the node keeps it while the journal stays assigned here (a member whose lease
expired is still in the ensemble).

A journal no longer assigned here keeps its node (or gets one, after a restart) while its
term register names this broker: in its ensemble, or in `previous` while a change is not
settled (the ensemble the change left, or gave up) (`registered_journals`,
`_keep_registered`; `kept`, `QuorumNode.kept_unassigned`, the `gazette_quorum_kept_unassigned`
gauge and the Status answer's `kept` say so). Why: the ensemble's quorum counts this member's
vote and acknowledgements until a change removes it. Stopped at once, a settled {A,B,C} whose
C lost its assignment (no successor yet, or one still catching up) runs on two members, and
one more failure stops it: if B is back from a lost disk (no vote until caught up), A alone
never elects again. An unsettled change may also have to go back to `previous`
(Rules.next_ensemble, `blocked`: a remove-first step {A,B,C} -> {A,B} whose remaining B lost
its disk), and that election needs the removed member C. Such a node's wish is the
allocator's route, as an assigned node's, so if it leads it moves the ensemble on itself (C
live: the new member added first, then C removed, its coordinator carrying that election
through though outside the new ensemble: Coordinator.takes_part); appends reach it through
the route the members tell (`leader_route` adds a leader outside the route). Once the register
no longer names this broker, the node stops; its files stay, as any unassigned journal's.

Ensemble changes follow the allocator: a running node's `wanted` is its route's members when
the route has exactly `replication` of them, else None (no change). So a route that shrinks for
a moment (a broker draining during a rolling restart: its assignment goes, then comes back
with the same broker) changes nothing, and a replica moved to another broker (the route
whole again, with another member) is a replacement: the leader's coordinator adds the new
member in one term and removes the old in the next (node.py, Rules.next_ensemble). Endpoints
follow every member the node talks to (`QuorumNode.peers`), route or not. The removed
member's broker stops its node once the register no longer names it (above; its files stay,
as for any journal no longer assigned: an operator removes them).

Durability: with a data directory each node's member log is a file (log_file.py,
`<data-dir>/quorum/<journal>/log`), replayed before the node starts, in a worker thread (a
broker starting many nodes must not stall its event loop: its lease refresh is due every
TTL/3). A journal's node is not started again until its previous node (and file) is closed; a
log file that cannot be replayed (LogFileCorruptError, OSError) is kept in `errors` and the
journal gets no node on this broker until it restarts, the journal leaves it or is re-created
(another journal, whose open moves the earlier files aside), unless it failed for want of room
(ENOSPC, EDQUOT): that is tried again after a back-off. Either way Status reports the
member failed ("log not opened: ...": `open_failures`, kept until an open succeeds or the
journal leaves this broker), so the journal does not look whole meanwhile. A node that stops
because its log could not be written (LogWriteError, a full disk) is started again from its
file after a back-off (`_restart_failed`), so the member rejoins once there is room.

Lost disks (member_dir.py, member_registry.py): with a data directory the broker has an
incarnation id, and each node first *joins*: a new log file gets a `joining` mark before it is
created, and the node looks its member up in `<root>/quorum-members/<journal>` (scoped to the
journal spec's create revision) before it takes part; a member that joined before but whose
log is new starts lost (no vote until caught up). Without a data directory the member log is
in memory and empty at every start of a node: the broker draws an incarnation per process, and
each node joins as one back from a lost disk whenever the record shows its member joined before
and the term register holds a term (`_memory_joiner`, member_registry.py).

A journal deleted and re-created under the same name is another journal: its spec key's create
revision differs. A node of the earlier one is stopped; the earlier journal's member files are
removed when the new journal's node opens them (open_member_log), and its term register and
member record in the keyspace are read as empty (term_record.py, members_record.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Coroutine
from typing import Any

from broker import metrics
from broker.client.append_errors import backoff_s
from broker.disk_errors import is_disk_full
from broker.fragment.index import IndexClosedError
from broker.fragment.naming import sum_from_digest
from broker.fragment.stores.registry import StoreRegistry
from broker.keyspace.backend import Backend
from broker.keyspace.keyspace import KeySpace
from broker.logging import get_logger
from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.quorum.config import QuorumConfig
from broker.quorum.entry import Registers
from broker.quorum.errors import LogFileCorruptError, NotLeaderError
from broker.quorum.leader import RegisterCheck, RegistersMismatched, RegisterUpdate
from broker.quorum_shell.append_offset import check_append_offset
from broker.quorum_shell.apply import CommitApplier
from broker.quorum_shell.leader_route import register_leader
from broker.quorum_shell.log_file import QuorumLogFile, log_path
from broker.quorum_shell.member_dir import (
    Mark,
    MemberDirError,
    load_incarnation,
    log_is_new,
    read_journal_revision,
    read_mark,
    retire_member_files,
    retired_dir,
    write_journal_revision,
    write_mark,
)
from broker.quorum_shell.member_registry import Joiner, MemberRegistry, memory_incarnation
from broker.quorum_shell.node import COORDINATOR_SUFFIX, LogWriteError, QuorumNode
from broker.quorum_shell.read_barrier import (
    QuorumReadUnavailableError,
    read_index_wait_s,
    wait_applied,
)
from broker.quorum_shell.registered import registered_journals, registered_route
from broker.quorum_shell.term_register import KeyspaceTermRegister
from broker.quorum_shell.transport import GrpcTransport, Receiver
from broker.replica import Replica
from broker.topology import (
    Decoded,
    JournalItem,
    assignment_of,
    attach_endpoints,
    format_id,
    journal_assignments,
    local_journals,
    lookup_item,
    lookup_member,
    route_from_assignments,
)

log = get_logger(__name__)

# Member logs replayed at once, each in a worker thread. Replay is pure Python: more threads
# would not finish sooner (one GIL), but each is one more the event loop's thread waits behind
# for the GIL, and one more log's records in memory at once.
log_replays_concurrent_max = 1

# How long an append waits for the journal's fragment index to list its stores for the first
# time: it cannot know where the journal continues before (as append_run's
# index_refresh_wait_s for all-replicas journals).
append_index_wait_s = 30.0


class IndexNotListedError(Exception):
    """An append found the journal's fragment index not listed yet, after waiting for it."""


# A node that stopped because its log could not be written (LogWriteError: say its disk is
# full) is started again from its file after a back-off, doubling from the first to the last
# of these, and again while it keeps failing; a node that ran `node_restart_healthy_s` before
# failing starts from the first again. So does opening a log that failed for want of room.
node_restart_initial_s = 1.0
node_restart_max_s = 60.0
node_restart_healthy_s = 300.0


async def _gather(*coros: Coroutine[Any, Any, None]) -> None:
    await asyncio.gather(*coros)


def open_member_log(
    data_dir: str,
    journal: str,
    member: str,
    incarnation: str,
    registry: MemberRegistry,
    *,
    fsync: bool = False,
) -> tuple[QuorumLogFile, Joiner]:
    """Open (creating) `member`'s log file of `journal` (the journal `registry` names, by its
    spec key's create revision) and the joiner its node runs first (see the module docstring).
    Files of an earlier journal of the same name are moved aside first. Raises
    LogFileCorruptError, MemberDirError or OSError."""
    path = log_path(data_dir, journal)
    member_dir = path.parent
    revision = registry.journal_revision
    found = read_journal_revision(member_dir)
    if found is not None and found != revision:
        to = retired_dir(data_dir, journal, found)
        moved = retire_member_files(member_dir, to)
        metrics.QUORUM_LOG_OPENED.labels("earlier_journal").inc()
        log.warning(
            "quorum member files of an earlier journal of this name moved aside: starting"
            " fresh (if the journal was not re-created, e.g. etcd's keys were copied into a new"
            " cluster, stop this broker and move them back)",
            journal=journal,
            earlier_revision=found,
            revision=revision,
            moved=moved,
            to=str(to),
        )
    log_new, mark_found = log_is_new(path), read_mark(member_dir)
    mark = mark_found
    if found != revision:
        if found is None and not log_new:
            log.info("quorum member log adopted for this journal", journal=journal)
        write_journal_revision(member_dir, revision)  # before a new log file exists
    if log_new and mark is None:
        # Before the file exists: until the keyspace records this member, a restart must not
        # take the (then existing) file for a log that took part.
        write_mark(member_dir, Mark.JOINING)
        mark = Mark.JOINING
    log_file = QuorumLogFile(path, fsync=fsync)
    joiner = Joiner(registry, member, incarnation, member_dir, log_new, mark_found, mark)
    return log_file, joiner


class QuorumJournals:
    def __init__(
        self,
        ks: KeySpace[Decoded],
        root: str,
        local_id: pb.ProcessSpec.ID,
        backend: Backend,
        *,
        replica_of: Callable[[str], Replica | None] = lambda _: None,
        spec_of: Callable[[str], pb.JournalSpec | None] = lambda _: None,
        clock: Callable[[], float] = time.time,
        data_dir: str | None = None,
        fsync: bool = False,
        stores: StoreRegistry | None = None,
    ) -> None:
        # The core's bounds for nodes started from now on (None: broker_quorum_config()).
        self.quorum_config: QuorumConfig | None = None
        self._data_dir = data_dir
        self._fsync = fsync
        # This broker's disk, as members record it when they join. Without a data directory,
        # one drawn for this process: its members' logs are in memory, so every start of a
        # node is a lost disk's (member_registry.py).
        self.incarnation = (
            load_incarnation(data_dir) if data_dir is not None else memory_incarnation()
        )
        # Journals whose log file could not be opened (see the module docstring).
        self.errors: dict[str, Exception] = {}
        # What Status reports for a journal without a node here: its log's last open failure,
        # kept while the open is tried again and until one succeeds (or the journal leaves
        # this broker), so that the member does not look whole meanwhile.
        self.open_failures: dict[str, Exception] = {}
        # The journals the last observe wanted a node for (assigned here, or kept by their
        # register): what `_still_wanted` asks.
        self._wanted: frozenset[str] = frozenset()
        # Journals whose node is being stopped: no new node until its file is closed.
        self._closing: dict[str, asyncio.Task[None]] = {}
        # Journals whose log is being opened (replayed) in a worker thread, and those opened
        # whose node starts at the next observe (see _open_log_later).
        self._opening: dict[str, asyncio.Task[None]] = {}
        self._opened: dict[str, tuple[QuorumLogFile, Joiner]] = {}
        self._replaying = asyncio.Semaphore(log_replays_concurrent_max)
        self._replica_of = replica_of
        self._spec_of = spec_of
        self._stores = stores  # what a leader without a replica here lists (apply.py)
        self._clock = clock
        self.appliers: dict[str, CommitApplier] = {}
        self._applier_tasks: dict[str, asyncio.Task[None]] = {}
        self._ks = ks
        self._root = root
        self._backend = backend
        self._local_id = local_id
        self.name = format_id(local_id)
        self.nodes: dict[str, QuorumNode] = {}
        self._routes: dict[str, pb.Route] = {}
        # The create revision of each local quorum journal's spec key (its identity).
        self._revisions: dict[str, int] = {}
        self._transports: dict[str, GrpcTransport] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopped = False
        # Per journal: the task that restarts its node if it fails (see _restart_failed),
        # and the consecutive restarts so far (the back-off's attempt).
        self._watchers: dict[str, asyncio.Task[None]] = {}
        self.restarts: dict[str, int] = {}
        self._open_retries: set[asyncio.Task[None]] = set()

    # --- The replication RPC -------------------------------------------------------------

    def route(self, journal: str, to: str) -> Receiver | None:
        node = self.nodes.get(journal)
        if node is None or to.removesuffix(COORDINATOR_SUFFIX) != self.name:
            return None
        return node.receive

    # --- Reconciliation ------------------------------------------------------------------

    def observe(self) -> None:
        """The KeySpace observer."""
        if self._stopped:
            return
        ks, root = self._ks, self._root
        wanted: dict[str, pb.Route] = {}
        for journal, entries in local_journals(ks, root, self._local_id).items():
            item = lookup_item(ks, root, journal)
            decoded = item.decoded if item is not None else None
            if not isinstance(decoded, JournalItem) or not gl.is_quorum_journal(
                decoded.spec.labels
            ):
                continue
            spec = decoded.spec
            assert item is not None
            revision = item.kv.create_revision
            if journal in self.nodes and self._revisions.get(journal) != revision:
                # Deleted and re-created under the same name while its node ran: the node
                # (of the earlier journal) stops; the next one starts on fresh files.
                continue
            if self._revisions.get(journal, revision) != revision:
                # Re-created: the earlier journal's log could not be opened; this journal's
                # is another (open_member_log moves the earlier files aside).
                self._forget_open_failure(journal)
            self._revisions[journal] = revision
            route = route_from_assignments(assignment_of(e) for e in entries)
            attach_endpoints(route, ks, root)
            if journal in self.nodes:
                # A running node stays while the journal is assigned here, whatever happens to
                # the route: a member whose lease expired (stopped, partitioned) is still in
                # the ensemble, and the majority keeps committing without it. A whole route
                # is the ensemble it should have (see the module docstring).
                wanted[journal] = self._routes[journal]
                whole = len(route.members) == spec.replication
                names = tuple(sorted(format_id(m) for m in route.members))
                self.nodes[journal].wanted = names if whole else None
                if whole and all(route.endpoints):
                    self._routes[journal] = route  # the leader is named in the route it has
                    wanted[journal] = route
                continue
            if len(route.members) >= spec.replication and all(route.endpoints):
                wanted[journal] = route
                continue
            registered = registered_route(ks, root, journal, revision, self.name)
            if registered is not None and len(registered.members) == spec.replication:
                # A journal that elected before: its members are in its term register, and a
                # live majority of them elects without waiting for the others to come back.
                wanted[journal] = registered
        kept = self._keep_registered(wanted)
        self._wanted = frozenset(wanted)
        for journal in self.errors.keys() | self.open_failures.keys():
            if journal not in wanted:
                # No longer this broker's: not reported, and opened again if it comes back.
                self._forget_open_failure(journal)
        for journal in list(self.nodes):
            if journal not in wanted:
                self._close_later(journal)
            else:
                self._refresh_endpoints(journal)
        for journal in list(self._opened):
            if journal not in wanted or journal in self.nodes:
                self._discard_opened(journal)  # no longer assigned while its log was replayed
        for journal, route in wanted.items():
            if journal in self.nodes or journal in self._closing or journal in self.errors:
                continue
            if journal in self._opening:
                continue  # its log is being replayed: the node starts once it is
            opened = self._opened.pop(journal, None)
            if self._data_dir is not None and opened is None:
                self._open_log_later(journal)
                continue
            if opened is not None:
                log_file, joiner = opened
            else:
                log_file, joiner = None, self._memory_joiner(journal)
            ensemble = tuple(sorted(format_id(m) for m in route.members))
            endpoints = {
                format_id(m): e for m, e in zip(route.members, route.endpoints, strict=True) if e
            }
            transport = GrpcTransport(endpoints)
            register = KeyspaceTermRegister(
                self._backend, root, journal, ensemble, self._revisions[journal]
            )
            node = QuorumNode(
                journal,
                self.name,
                ensemble,
                register,
                transport,
                log_file=log_file,
                config=self.quorum_config,
                joiner=joiner,
            )
            self.nodes[journal] = node
            self._routes[journal] = route
            self._transports[journal] = transport
            log.info("quorum node starting", journal=journal, ensemble=ensemble)
            self._spawn(node.start())
            self._watchers[journal] = asyncio.get_running_loop().create_task(
                self._restart_failed(journal, node)
            )
            applier = CommitApplier(
                node, self._replica_of, self._spec_of, self._clock, stores=self._stores
            )
            self.appliers[journal] = applier
            self._applier_tasks[journal] = asyncio.get_running_loop().create_task(
                _gather(applier.run(), applier.report_stored())
            )
        for journal, node in self.nodes.items():
            node.keep_unassigned(journal in kept)
            uploading = self.appliers.get(journal)
            if uploading is not None:
                uploading.uploads_for_leader = self._uploads_for_leader(journal)

    def _memory_joiner(self, journal: str) -> Joiner:
        """The joiner of a node whose member log is in memory (no data directory): its log is
        empty at every start, so it joins as a member back from a lost disk would (no vote
        until a leader caught it up) once the keyspace shows it joined before
        (member_registry.py). Without it, a restarted member voted with its empty log and a
        majority of such members elected it: the journal went on from offset 0, every
        acknowledged append gone."""
        registry = MemberRegistry(self._backend, self._root, journal, self._revisions[journal])
        return Joiner.in_memory(registry, self.name, self.incarnation)

    def _keep_registered(self, wanted: dict[str, pb.Route]) -> set[str]:
        """Add to `wanted` the journals not assigned here (or without a whole route) whose
        term register names this broker (registered_journals), and return them: they keep or
        get a node here (see the module docstring). Such a node's wish is the allocator's
        route, as an assigned one's."""
        kept: set[str] = set()
        ks, root = self._ks, self._root
        for journal, registered in registered_journals(ks, root, self.name).items():
            if journal in wanted:
                continue  # assigned here: its node runs anyway
            node = self.nodes.get(journal)
            if node is not None:
                if self._revisions.get(journal) != registered.revision:
                    continue  # a node of an earlier journal of this name: it stops
                wanted[journal] = self._routes[journal]
            else:
                self._revisions[journal] = registered.revision
                wanted[journal] = registered.route
            kept.add(journal)
        for journal in kept & set(self.nodes):
            item = lookup_item(ks, root, journal)  # there: registered_journals found it
            assert item is not None and isinstance(item.decoded, JournalItem)
            assigned = route_from_assignments(
                assignment_of(e) for e in journal_assignments(ks, root, journal)
            )
            whole = len(assigned.members) == item.decoded.spec.replication
            names = tuple(sorted(format_id(m) for m in assigned.members))
            self.nodes[journal].wanted = names if whole else None
        return kept

    def _uploads_for_leader(self, journal: str) -> bool:
        """Whether this broker uploads `journal`'s fragments at once though its node does not
        lead: the register's leader is outside the assigned route (it has no replica to upload
        from) and this broker is the route's primary (apply.py, `uploads_for_leader`)."""
        ks, root = self._ks, self._root
        term = register_leader(ks, root, journal, self._revisions.get(journal, 0))
        if term is None:
            return False
        assigned = route_from_assignments(
            assignment_of(e) for e in journal_assignments(ks, root, journal)
        )
        if assigned.primary < 0:
            return False
        if any(format_id(m) == term.record.leader for m in assigned.members):
            return False
        return format_id(assigned.members[assigned.primary]) == self.name

    @property
    def kept(self) -> frozenset[str]:
        """Journals whose node runs here only because their term register names this broker
        (not assigned here, or without a whole route)."""
        return frozenset(j for j, node in self.nodes.items() if node.kept_unassigned)

    def _refresh_endpoints(self, journal: str) -> None:
        """Members' endpoints as their BrokerSpecs say now: a member that was down when the
        node started (or came back on another port) is reached once it announces itself."""
        route, transport = self._routes[journal], self._transports[journal]
        for i, m in enumerate(route.members):
            member = lookup_member(self._ks, self._root, m.zone, m.suffix)
            if member is not None and member.spec.process_spec.endpoint:
                route.endpoints[i] = member.spec.process_spec.endpoint
                transport.endpoints[format_id(m)] = route.endpoints[i]
        # Members an ensemble change brought in (outside the route the node started with).
        for name in self.nodes[journal].peers:
            zone, _, suffix = name.partition("#")
            member = lookup_member(self._ks, self._root, zone, suffix)
            if member is not None and member.spec.process_spec.endpoint:
                transport.endpoints[name] = member.spec.process_spec.endpoint

    def _still_wanted(self, journal: str, revision: int) -> bool:
        """Whether an open of `journal`'s log at `revision` that just ended still matters: the
        broker runs, the journal was not re-created meanwhile, and it is still this broker's
        as of the last observe (an open that failed after the journal left or was re-created
        must not leave its error to the next journal of that name, which `observe` could no
        longer forget)."""
        if self._stopped or self._revisions.get(journal) != revision:
            return False
        return journal in self._wanted

    def _forget_open_failure(self, journal: str) -> None:
        self.errors.pop(journal, None)
        self.open_failures.pop(journal, None)

    def _open_log_later(self, journal: str) -> None:
        """Open the journal's log file (replaying it) and its member's joiner in a worker
        thread, then observe again: the node starts with them. Replaying takes about 0.1 s per
        MB of log (several times that under load), and a broker starts every node at once: on
        the event loop, the replays stalled it for seconds, long enough to miss the lease's
        refresh (docs/reliability.md). A log that cannot be read keeps its error in `errors`
        (no node)."""
        data_dir, incarnation = self._data_dir, self.incarnation
        assert data_dir is not None
        revision = self._revisions[journal]
        registry = MemberRegistry(self._backend, self._root, journal, revision)

        async def open_log() -> None:
            try:
                try:
                    async with self._replaying:
                        opened = await asyncio.to_thread(
                            open_member_log,
                            data_dir,
                            journal,
                            self.name,
                            incarnation,
                            registry,
                            fsync=self._fsync,
                        )
                finally:
                    self._opening.pop(journal, None)
            except Exception as err:
                self._open_failed(journal, revision, err)
            else:
                if self._stopped or self._revisions.get(journal) != revision:
                    opened[0].close()  # stopped, or re-created meanwhile: opened again if wanted
                else:
                    self._opened[journal] = opened
                    self.open_failures.pop(journal, None)
            self.observe()

        # Not cancelled by stop(): the thread could not be, and its file must be closed.
        self._opening[journal] = asyncio.get_running_loop().create_task(open_log())

    def _open_failed(self, journal: str, revision: int, err: Exception) -> None:
        """Keep the error of a log that could not be opened (no node), unless its journal has
        left meanwhile or been re-created; a full disk is retried. Called in the `except`."""
        if not self._still_wanted(journal, revision):
            return
        self.errors[journal] = self.open_failures[journal] = err
        if not isinstance(err, (LogFileCorruptError, MemberDirError, OSError)):
            log.exception("quorum log not opened: no node", journal=journal)  # a bug
            return
        log.error("quorum log not opened: no node", journal=journal, error=str(err))
        if is_disk_full(err):  # retried; other errors keep the journal in `errors`
            retry = asyncio.get_running_loop().create_task(self._retry_open(journal, err))
            self._open_retries.add(retry)
            retry.add_done_callback(self._open_retries.discard)

    def _discard_opened(self, journal: str) -> None:
        opened = self._opened.pop(journal, None)
        if opened is not None:
            opened[0].close()

    def _next_restart_s(self, journal: str, ran_s: float) -> tuple[int, float]:
        attempt = 1 if ran_s >= node_restart_healthy_s else self.restarts.get(journal, 0) + 1
        self.restarts[journal] = attempt
        metrics.QUORUM_NODE_RESTARTS.labels(journal).inc()
        return attempt, backoff_s(attempt, node_restart_initial_s, node_restart_max_s)

    async def _restart_failed(self, journal: str, node: QuorumNode) -> None:
        """Start `journal`'s node again from its file once it failed for want of a log write
        (see node_restart_initial_s): it rejoins, the leader catches it up, and it counts in
        the majority again. Without this, a member whose disk filled once stayed out until its
        broker restarted, the journal one more failure away from stopping. A ProtocolError (an
        impossible message: a bug) leaves the node stopped, for an operator."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        await node.failed.wait()
        if not isinstance(node.failure, LogWriteError):
            return
        attempt, delay_s = self._next_restart_s(journal, loop.time() - started)
        log.warning(
            "quorum node failed: starting it again from its log",
            journal=journal,
            attempt=attempt,
            delay_s=delay_s,
            error=str(node.failure),
        )
        await asyncio.sleep(delay_s)
        if not self._stopped and self.nodes.get(journal) is node:
            self._close_later(journal)  # its close observes: a new node opens the file

    async def _retry_open(self, journal: str, err: OSError) -> None:
        """Open `journal`'s log again after a back-off: it failed for want of room."""
        attempt, delay_s = self._next_restart_s(journal, 0.0)
        log.warning(
            "quorum log not opened for want of room: trying again",
            journal=journal,
            attempt=attempt,
            delay_s=delay_s,
        )
        await asyncio.sleep(delay_s)
        if not self._stopped and self.errors.get(journal) is err:
            del self.errors[journal]
            self.observe()

    def _close_later(self, journal: str) -> None:
        parts = self._detach(journal)

        async def close() -> None:
            try:
                await self._close(*parts)
            finally:
                self._closing.pop(journal, None)
                self.observe()  # Re-assigned meanwhile: start its node now.

        task = asyncio.get_running_loop().create_task(close())
        self._closing[journal] = task

    async def _stop_node(self, journal: str) -> None:
        await self._close(*self._detach(journal))

    def _detach(
        self, journal: str
    ) -> tuple[QuorumNode | None, asyncio.Task[None] | None, GrpcTransport | None]:
        """Forget `journal`'s node at once (so that a re-assignment before it has stopped
        starts a new one), returning what remains to be stopped."""
        self.appliers.pop(journal, None)
        self._routes.pop(journal, None)
        watcher = self._watchers.pop(journal, None)
        if watcher is not None and watcher is not asyncio.current_task():
            watcher.cancel()
        return (
            self.nodes.pop(journal, None),
            self._applier_tasks.pop(journal, None),
            self._transports.pop(journal, None),
        )

    async def _close(
        self,
        node: QuorumNode | None,
        applier: asyncio.Task[None] | None,
        transport: GrpcTransport | None,
    ) -> None:
        if applier is not None:
            applier.cancel()
            await asyncio.gather(applier, return_exceptions=True)
        if node is not None:
            await node.stop()
        if transport is not None:
            await transport.close()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        self._stopped = True
        for retry in list(self._open_retries):
            retry.cancel()
        for journal in list(self.nodes):
            await self._stop_node(journal)
        await asyncio.gather(*self._closing.values(), return_exceptions=True)
        # Logs being replayed close themselves once replayed (the thread is not cancellable).
        await asyncio.gather(*self._opening.values(), return_exceptions=True)
        for journal in list(self._opened):
            self._discard_opened(journal)

    def replica_started(self, journal: str) -> None:
        """This broker started a replica of `journal` (the resolver calls this): its node's
        applier, if it runs, applies to it what is committed (apply.py)."""
        applier = self.appliers.get(journal)
        if applier is not None:
            applier.replica_changed()

    # --- Reads ---------------------------------------------------------------------------

    async def read_barrier(self, journal: str) -> None:
        """Return once a non-blocking read of `journal` served here sees every append
        acknowledged before this call (read_barrier.py); QuorumReadUnavailableError if that
        cannot be known within `read_index_wait_s`."""
        node, applier = self.nodes.get(journal), self.appliers.get(journal)
        replica = self._replica_of(journal)  # the one the read is served by
        if node is None or applier is None or replica is None:
            raise QuorumReadUnavailableError(
                f"no quorum node of {journal!r} on this broker, or no replica (not started yet,"
                " or stopping): it cannot tell how far the journal is committed"
            )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + read_index_wait_s
        try:
            async with asyncio.timeout_at(deadline):
                # (A round already in flight is not joined: this call waits for the next.)
                offset = await node.reads.read_index()
        except TimeoutError:
            raise QuorumReadUnavailableError(
                f"the read index of {journal!r} not learned within {read_index_wait_s} s"
                " (read_index_wait_s)"
            ) from None
        await wait_applied(applier, replica, offset, max(deadline - loop.time(), 0.0))

    # --- Appends -------------------------------------------------------------------------

    def leader_route(self, journal: str) -> pb.Route | None:
        """The journal's route with the term's leader (as this node knows it) as primary. A
        leader outside the route (a member the register names whose broker no longer has the
        journal assigned: `kept`) is added to it, with its endpoint, so that appends reach it."""
        node, route = self.nodes.get(journal), self._routes.get(journal)
        if node is None or route is None:
            return None
        leader = node.leader_name
        out = pb.Route()
        out.CopyFrom(route)
        out.primary = next((i for i, m in enumerate(route.members) if format_id(m) == leader), -1)
        endpoint = self._transports[journal].endpoints.get(leader, "") if leader else ""
        if out.primary < 0 and endpoint:
            zone, _, suffix = leader.partition("#")
            members = [*route.members, pb.ProcessSpec.ID(zone=zone, suffix=suffix)]
            endpoints = [*route.endpoints, endpoint]
            order = sorted(range(len(members)), key=lambda i: (members[i].zone, members[i].suffix))
            out = pb.Route(
                members=[members[i] for i in order],
                endpoints=[endpoints[i] for i in order],
                primary=order.index(len(members) - 1),
            )
        return out

    async def append(
        self,
        journal: str,
        data: bytes,
        codec: int,
        check: RegisterCheck | None = None,
        update: RegisterUpdate | None = None,
        offset: int = 0,
    ) -> tuple[pb.Fragment | None, Registers]:
        """Append to the local node, which must lead: the committed fragment of `data` and
        the registers after it, or (None, the committed registers) if `check` failed. The
        append lands at the log's head, which must be `offset` if that is given, and not below
        the end of this broker's fragment index (append_offset.py: AppendOffsetError,
        StoreAheadOfLogError). A log that holds nothing yet first waits for the index to list
        the stores (IndexNotListedError after `append_index_wait_s`): content it did not write
        can only be met there (a journal created again over its old store); a log that holds
        content holds all the journal's committed content, and the stores hold no more, so its
        appends do not depend on the stores being up."""
        node = self.nodes.get(journal)
        replica = self._replica_of(journal)
        if (
            node is not None
            and node.member.log.head_end == 0
            and replica is not None
            and not replica.index.first_refresh.is_set()
        ):
            try:
                await replica.index.wait_first_refresh(append_index_wait_s)
            except (TimeoutError, IndexClosedError) as err:
                raise IndexNotListedError(
                    f"journal {journal!r}: its fragment stores were not listed yet ({err!r});"
                    " nothing appended"
                ) from None
            node = self.nodes.get(journal)
        if node is None:
            # Stopped since the append resolved it, while its content was read (this broker
            # lost the journal's assignment): not the leader, so the client retries.
            raise NotLeaderError(self.name)
        replica = self._replica_of(journal)
        # A leader without a replica here (kept by the term register, not assigned here) has
        # no index: its appends are not checked against the stores.
        index_end = replica.index.end_offset if replica is not None else 0

        def at(head_end: int) -> None:
            check_append_offset(journal, head_end, index_end, offset)

        outcome = await node.append_checked(data, check, update, at)
        if isinstance(outcome, RegistersMismatched):
            return None, outcome.registers
        fragment = pb.Fragment(
            journal=journal,
            begin=outcome.begin,
            end=outcome.end,
            sum=sum_from_digest(hashlib.sha1(data).digest()),
            compression_codec=codec,  # type: ignore[arg-type]
        )
        return fragment, outcome.registers
