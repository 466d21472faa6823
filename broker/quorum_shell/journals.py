"""A broker's quorum journals: one `QuorumNode` per local journal labelled
`gazette.dev/replication-mode=quorum`, kept in step with the keyspace, and the broker's side of
the replication RPC and of quorum appends.

Reconciliation is a KeySpace observer (it runs synchronously after every keyspace update):
a quorum journal assigned to this broker whose route has all `replication` members, each with
an endpoint, gets a node; its ensemble is the route's members (`zone#suffix`, sorted) as first
seen, and the node keeps it while the journal stays assigned here (a member whose lease
expired is still in the ensemble). A journal no longer assigned here has its node stopped. Ensemble changes of a live node
(the allocator moving a replica) are not followed yet: the node keeps its first ensemble
(docs/design/quorum.md, "part two: built / remaining").

Durability: with a data directory each node's member log is a file (log_file.py,
`<data-dir>/quorum/<journal>/log`), replayed when the node starts. A journal's node is not
started again until its previous node (and file) is closed; a log file that cannot be
replayed (LogFileCorruptError, OSError) is kept in `errors` and the journal gets no node on
this broker until it restarts.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Coroutine
from typing import Any

from broker.fragment.naming import sum_from_digest
from broker.keyspace.backend import Backend
from broker.keyspace.keyspace import KeySpace
from broker.logging import get_logger
from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.quorum.config import QuorumConfig
from broker.quorum.entry import Registers
from broker.quorum.errors import LogFileCorruptError
from broker.quorum.leader import RegisterCheck, RegistersMismatched, RegisterUpdate
from broker.quorum_shell.apply import CommitApplier
from broker.quorum_shell.log_file import QuorumLogFile, log_path
from broker.quorum_shell.node import COORDINATOR_SUFFIX, QuorumNode
from broker.quorum_shell.term_register import KeyspaceTermRegister
from broker.quorum_shell.transport import GrpcTransport, Receiver
from broker.replica import Replica
from broker.topology import (
    Decoded,
    JournalItem,
    assignment_of,
    attach_endpoints,
    format_id,
    local_journals,
    lookup_item,
    route_from_assignments,
)

log = get_logger(__name__)


async def _gather(*coros: Coroutine[Any, Any, None]) -> None:
    await asyncio.gather(*coros)


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
    ) -> None:
        # The core's bounds for nodes started from now on (None: broker_quorum_config()).
        self.quorum_config: QuorumConfig | None = None
        self._data_dir = data_dir
        self._fsync = fsync
        # Journals whose log file could not be opened (see the module docstring).
        self.errors: dict[str, Exception] = {}
        # Journals whose node is being stopped: no new node until its file is closed.
        self._closing: dict[str, asyncio.Task[None]] = {}
        self._replica_of = replica_of
        self._spec_of = spec_of
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
        self._transports: dict[str, GrpcTransport] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopped = False

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
            if journal in self.nodes:
                # A running node stays while the journal is assigned here, whatever happens to
                # the route: a member whose lease expired (stopped, partitioned) is still in
                # the ensemble, and the majority keeps committing without it.
                wanted[journal] = self._routes[journal]
                continue
            route = route_from_assignments(assignment_of(e) for e in entries)
            attach_endpoints(route, ks, root)
            if len(route.members) < spec.replication or not all(route.endpoints):
                continue
            wanted[journal] = route
        for journal in list(self.nodes):
            if journal not in wanted:
                self._close_later(journal)
        for journal, route in wanted.items():
            if journal in self.nodes or journal in self._closing or journal in self.errors:
                continue
            log_file = self._open_log(journal)
            if log_file is None and self._data_dir is not None:
                continue
            ensemble = tuple(sorted(format_id(m) for m in route.members))
            endpoints = {
                format_id(m): e for m, e in zip(route.members, route.endpoints, strict=True)
            }
            transport = GrpcTransport(endpoints)
            register = KeyspaceTermRegister(self._backend, root, journal, ensemble)
            node = QuorumNode(
                journal,
                self.name,
                ensemble,
                register,
                transport,
                log_file=log_file,
                config=self.quorum_config,
            )
            self.nodes[journal] = node
            self._routes[journal] = route
            self._transports[journal] = transport
            log.info("quorum node starting", journal=journal, ensemble=ensemble)
            self._spawn(node.start())
            applier = CommitApplier(node, self._replica_of, self._spec_of, self._clock)
            self.appliers[journal] = applier
            self._applier_tasks[journal] = asyncio.get_running_loop().create_task(
                _gather(applier.run(), applier.report_stored())
            )

    def _open_log(self, journal: str) -> QuorumLogFile | None:
        if self._data_dir is None:
            return None
        path = log_path(self._data_dir, journal)
        try:
            return QuorumLogFile(path, fsync=self._fsync)
        except (LogFileCorruptError, OSError) as err:
            self.errors[journal] = err
            log.error("quorum log not opened: no node", journal=journal, error=str(err))
            return None

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
        for journal in list(self.nodes):
            await self._stop_node(journal)
        await asyncio.gather(*self._closing.values(), return_exceptions=True)

    # --- Appends -------------------------------------------------------------------------

    def leader_route(self, journal: str) -> pb.Route | None:
        """The journal's route with the term's leader (as this node knows it) as primary."""
        node, route = self.nodes.get(journal), self._routes.get(journal)
        if node is None or route is None:
            return None
        leader = node.leader_name
        out = pb.Route()
        out.CopyFrom(route)
        out.primary = next((i for i, m in enumerate(route.members) if format_id(m) == leader), -1)
        return out

    async def append(
        self,
        journal: str,
        data: bytes,
        codec: int,
        check: RegisterCheck | None = None,
        update: RegisterUpdate | None = None,
    ) -> tuple[pb.Fragment | None, Registers]:
        """Append to the local node, which must lead: the committed fragment of `data` and
        the registers after it, or (None, the committed registers) if `check` failed."""
        node = self.nodes[journal]
        outcome = await node.append_checked(data, check, update)
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
