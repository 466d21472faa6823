"""The resolver: which broker serves a journal, at which etcd revision, and the local replica.

Every RPC about a journal starts by resolving it against the broker's KeySpace mirror: the
journal's spec, its assignments and the Route they imply, the header to answer with (this
broker's ID, the route, the etcd revision the answer reflects), and the local Replica if this
broker is assigned the journal. Disagreements between brokers are settled by etcd revision,
which totally orders route changes: a request carrying a header from a broker (or client) that
saw a later revision first waits, boundedly, until the local mirror has caught up with it.

The resolver also keeps the set of local replicas in step with the assignments. It observes the
KeySpace: after every update it starts a Replica for each journal newly assigned to this broker,
stops the replicas of journals no longer assigned, and *invalidates* the outstanding resolutions
of every journal whose assignments changed (key or revision), so that requests blocked on a
replica's spool or pipeline re-resolve instead of acting on a stale route. Replicas run in the
resolver's TaskGroup.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from broker.keyspace.keyspace import Entry, KeySpace
from broker.logging import get_logger
from broker.protocol import protocol_pb2 as pb
from broker.protocol.validate import split_journal_meta
from broker.quorum_shell.leader_route import leader_route
from broker.replica import Replica
from broker.resolve_errors import (  # noqa: F401 (re-exported)
    ProxyTargetMismatchError,
    ReplicaNotReadyError,
    ResolveError,
    ResolverStoppedError,
)
from broker.slot import Signal
from broker.topology import (
    Decoded,
    JournalItem,
    assignment_of,
    attach_endpoints,
    etcd_header,
    format_id,
    journal_assignments,
    local_journals,
    lookup_item,
    lookup_member,
    make_header,
    route_from_assignments,
    same_id,
)

log = get_logger(__name__)

# How long a request may wait for the local KeySpace to reach a revision another broker (or the
# client) has already seen. Etcd watches deliver within milliseconds; a mirror this far behind
# is partitioned from etcd, and the request fails rather than act on a stale view.
revision_wait_s_default = 10.0

# Stands in for this broker's ID while its member key is absent from the keyspace (before it is
# announced, or after its lease is lost): matches no route member, so nothing resolves locally.
_MISSING_ID = pb.ProcessSpec.ID(zone="local-BrokerSpec", suffix="missing-from-Etcd")


@dataclass
class Resolution:
    """The outcome of one resolve. ``header.process_id`` is the broker to talk to: this one,
    or the primary / a replica to proxy to when status is OK and it differs from ``local_id``.
    """

    status: int
    header: pb.Header
    local_id: pb.ProcessSpec.ID
    journal: str
    spec: pb.JournalSpec | None
    assignments: list[Entry[Decoded]]
    replica: Replica | None
    # The allocator's route (slot 0 primary): what the assignments advertise and readiness
    # compares. ``header.route`` is what clients are told, which for a quorum journal names
    # the term's leader as primary instead (quorum_shell/leader_route.py).
    route: pb.Route
    # Set when this resolution no longer holds (assignments changed, replica stopping).
    invalidated: asyncio.Event = field(default_factory=asyncio.Event)
    # The journal's spec entry (key and revisions), to update it (suspension) guarded by them.
    item: Entry[Decoded] | None = None

    @property
    def is_local(self) -> bool:
        return same_id(self.header.process_id, self.local_id)

    @property
    def revision(self) -> int:
        return self.header.etcd.revision


@dataclass
class _LocalReplica:
    replica: Replica
    # (key, mod revision) of each assignment, to detect changes.
    assignments: list[tuple[bytes, int]]
    # Invalidates the resolutions made under the replica's current assignments.
    signal: Signal


@dataclass(frozen=True)
class _Routed:
    """What a journal resolves to at one keyspace revision, whoever asks: read from the mirror
    once per revision (resolve_cache_journals_max), not on every append."""

    assignments: list[Entry[Decoded]]
    item: Entry[Decoded] | None
    spec: pb.JournalSpec | None
    # The allocator's route, with endpoints; and the route clients are told (leader_route.py).
    route: pb.Route
    told: pb.Route


# Journals whose routing is kept for the current keyspace revision; past it, the cache starts
# over. (Every append resolves its journal: about a tenth of a small append's broker time went
# to reading the same assignments, spec and members from the mirror again.)
resolve_cache_journals_max = 4096


def _assignment_keys(entries: list[Entry[Decoded]]) -> list[tuple[bytes, int]]:
    return [(e.kv.key, e.kv.mod_revision) for e in entries]


class Resolver:
    """See the module docstring."""

    def __init__(
        self,
        ks: KeySpace[Decoded],
        root: str,
        local_id: pb.ProcessSpec.ID,
        new_replica: Callable[[str], Replica],
        *,
        revision_wait_s: float = revision_wait_s_default,
    ) -> None:
        self.ks = ks
        self.root = root
        self._local_id = local_id
        self._new_replica = new_replica
        self._revision_wait_s = revision_wait_s
        # None once stop_serving() was called.
        self._replicas: dict[str, _LocalReplica] | None = {}
        self._tg: asyncio.TaskGroup | None = None
        self._stop = asyncio.Event()
        # Set once run() has started the replicas of the journals assigned here: before it, a
        # journal assigned here would resolve locally with no replica to serve it.
        self.serving = asyncio.Event()
        # Called with each journal whose local replica this resolver started (a new or a
        # replacing one), once `replicas` holds it: a quorum journal's node may run before
        # its replica exists (quorum_shell/journals.py), and its applier waits for this.
        self.replica_started: list[Callable[[str], None]] = []
        # _Routed by journal, valid at the keyspace revision _routed_revision (and this
        # broker's ID as of it): nothing in the mirror changes without its revision changing.
        # (That holds as long as the events of one revision reach the mirror together, as
        # etcd and the embedded keyspace send them: KeySpace.apply would take a revision split
        # across watch responses without moving its header.)
        self._routed: dict[str, _Routed] = {}
        self._routed_revision = -1
        self._routed_local_id = _MISSING_ID

    # --- Lifecycle ---

    async def run(self) -> None:
        """Serve local replicas until ``stop_serving()``; then wait for them to shut down."""
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            self.ks.observers.append(self._update_replicas)
            try:
                self._update_replicas()
                self.serving.set()
                await self._stop.wait()
            finally:
                self.ks.observers.remove(self._update_replicas)
                self._stop_all()
        self._tg = None

    def stop_serving(self) -> None:
        """Stop every local replica; later resolutions to this broker fail."""
        self._stop.set()
        self._stop_all()

    def _stop_all(self) -> None:
        replicas, self._replicas = self._replicas, None
        if replicas:
            self._stop_replicas(replicas.values())

    @property
    def replicas(self) -> dict[str, Replica]:
        """The running local replicas, by journal."""
        return {name: lr.replica for name, lr in (self._replicas or {}).items()}

    # --- Resolution ---

    def local_id(self) -> pb.ProcessSpec.ID:
        """This broker's ID, if its member key is in the keyspace."""
        self._routed_at_current_revision()
        return self._routed_local_id

    def _routed_at_current_revision(self) -> dict[str, _Routed]:
        """The routing cache, emptied (and this broker's ID looked up again) if the keyspace
        moved on since it was filled."""
        revision = self.ks.header.revision
        if revision != self._routed_revision or len(self._routed) >= resolve_cache_journals_max:
            self._routed = {}
            self._routed_revision = revision
            member = lookup_member(self.ks, self.root, self._local_id.zone, self._local_id.suffix)
            self._routed_local_id = self._local_id if member is not None else _MISSING_ID
        return self._routed

    def _routed_now(self, journal: str) -> _Routed:
        cache = self._routed_at_current_revision()
        routed = cache.get(journal)
        if routed is not None:
            return routed
        assignments = journal_assignments(self.ks, self.root, journal)
        item = lookup_item(self.ks, self.root, journal)
        spec = (
            item.decoded.spec
            if item is not None and isinstance(item.decoded, JournalItem)
            else None
        )
        route = route_from_assignments(assignment_of(e) for e in assignments)
        attach_endpoints(route, self.ks, self.root)
        revision = item.kv.create_revision if item is not None else 0
        told = leader_route(self.ks, self.root, spec, revision, route)
        routed = cache[journal] = _Routed(assignments, item, spec, route, told)
        return routed

    async def resolve(
        self,
        journal: str,
        *,
        require_primary: bool,
        may_proxy: bool,
        min_revision: int = 0,
        proxy_header: pb.Header | None = None,
    ) -> Resolution:
        """Resolve ``journal`` (a ";meta" suffix is ignored). Raises ResolveError when a
        proxied request did not come from our cluster or was not meant for us, and TimeoutError
        when the keyspace does not reach the wanted revision within the bound."""
        journal, _ = split_journal_meta(journal)
        local_id = self.local_id()
        if proxy_header is not None:
            self._check_proxy_header(proxy_header, local_id)
            min_revision = max(min_revision, proxy_header.etcd.revision)
        if min_revision > self.ks.header.revision:
            await self.ks.wait_for_revision(min_revision, self._revision_wait_s)
            local_id = self.local_id()
        # Everything below reads the mirror without awaiting: one consistent revision.
        return self._resolve_now(journal, local_id, require_primary, may_proxy)

    def _check_proxy_header(self, hdr: pb.Header, local_id: pb.ProcessSpec.ID) -> None:
        if hdr.etcd.cluster_id != self.ks.header.cluster_id:
            raise ResolveError(
                f"proxied request's etcd cluster ID {hdr.etcd.cluster_id} is not ours "
                f"({self.ks.header.cluster_id})"
            )
        if (hdr.process_id.zone or hdr.process_id.suffix) and not same_id(hdr.process_id, local_id):
            raise ProxyTargetMismatchError(
                f"proxied request is for {format_id(hdr.process_id)}, not us "
                f"({format_id(local_id)})"
            )

    def _resolve_now(
        self, journal: str, local_id: pb.ProcessSpec.ID, require_primary: bool, may_proxy: bool
    ) -> Resolution:
        # Shared by every resolution at this revision: read, never changed, by their users.
        routed = self._routed_now(journal)
        spec, route, item = routed.spec, routed.route, routed.item

        process_id = pb.ProcessSpec.ID()
        if require_primary and route.primary != -1:
            process_id = route.members[route.primary]
        elif not require_primary:
            for m in route.members:
                if same_id(m, local_id):
                    process_id = local_id

        replica: Replica | None = None
        invalidated = asyncio.Event()
        if self._replicas is None:
            if same_id(process_id, local_id):
                # Still assigned here by our (possibly stale) view, but local replicas are
                # gone: fail rather than serve or proxy on a view we know is ending.
                raise ResolverStoppedError("resolver has stopped serving local replicas")
        elif (local := self._replicas.get(journal)) is not None:
            replica = local.replica
            invalidated = local.signal

        status = self._status(spec, route, process_id, local_id, require_primary, may_proxy)
        if status != pb.OK:
            # The answer is authored here, whoever the journal's broker is.
            process_id = local_id
        # The broker to talk to (process_id) and the status follow the allocator's route; only
        # the route clients are told names a quorum journal's leader (leader_route.py).
        header = make_header(process_id, routed.told, etcd_header(self.ks.header))
        return Resolution(
            status=status,
            header=header,
            local_id=local_id,
            journal=journal,
            spec=spec,
            assignments=routed.assignments,
            replica=replica,
            route=route,
            invalidated=invalidated,
            item=item if spec is not None else None,
        )

    @staticmethod
    def _status(
        spec: pb.JournalSpec | None,
        route: pb.Route,
        process_id: pb.ProcessSpec.ID,
        local_id: pb.ProcessSpec.ID,
        require_primary: bool,
        may_proxy: bool,
    ) -> int:
        if spec is None:
            return pb.JOURNAL_NOT_FOUND
        if spec.suspend.level == pb.JournalSpec.Suspend.FULL:
            return pb.SUSPENDED
        if require_primary and route.primary == -1:
            return pb.NO_JOURNAL_PRIMARY_BROKER
        if not route.members:
            return pb.INSUFFICIENT_JOURNAL_BROKERS
        if not may_proxy and not same_id(process_id, local_id):
            return pb.NOT_JOURNAL_PRIMARY_BROKER if require_primary else pb.NOT_JOURNAL_BROKER
        return pb.OK

    def lookup_spec(self, journal: str) -> pb.JournalSpec | None:
        item = lookup_item(self.ks, self.root, journal)
        if item is None or not isinstance(item.decoded, JournalItem):
            return None
        return item.decoded.spec

    # --- Local replicas (a KeySpace observer: runs synchronously after every update) ---

    def _update_replicas(self) -> None:
        if self._replicas is None or self._tg is None:
            return
        local_id = self.local_id()
        assigned = (
            local_journals(self.ks, self.root, local_id) if local_id is not _MISSING_ID else {}
        )
        prev, nxt = self._replicas, {}
        started = []
        for journal, entries in assigned.items():
            keys = _assignment_keys(entries)
            local = prev.pop(journal, None)
            if local is None:
                log.info("starting local journal replica", journal=journal)
                replica = self._new_replica(journal)
                local = _LocalReplica(replica, keys, Signal())
                self._tg.create_task(replica.serve(), name=f"replica {journal}")
                started.append(journal)
            elif local.assignments != keys:
                # The route (or its advertised consistency) changed: wake whoever waits under
                # the old resolution so that they re-resolve.
                local.signal.set()
                local.signal = Signal()
                local.assignments = keys
            nxt[journal] = local
        self._replicas = nxt
        self._stop_replicas(prev.values())
        for journal in started:
            for callback in self.replica_started:
                callback(journal)

    @staticmethod
    def _stop_replicas(replicas: Iterable[_LocalReplica]) -> None:
        for local in replicas:
            log.info("stopping local journal replica", journal=local.replica.journal)
            local.signal.set()
            local.replica.stop()
