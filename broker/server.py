"""The broker process: the gRPC Journal service over a keyspace, a resolver and local replicas.

A ``Broker`` is one broker of a cluster, runnable in-process (tests, the embedded mode) or as
``gazette serve``. Starting it:

1. binds the gRPC server (port 0 picks a free one), so that the endpoint is known, behind a
   closed readiness gate (``broker.readiness``): until step 4, every RPC is answered UNAVAILABLE
   ("starting"), which clients retry, never from an empty view of the cluster;
2. grants a lease and announces the member, ``<root>/members/<zone>#<suffix>`` = BrokerSpec,
   under it: if the broker dies, the lease expires, the key vanishes, and the allocator moves
   its journals elsewhere. A broker restarted with the same ID first waits for its
   predecessor's key to go (``broker.allocator.announce``);
3. loads the KeySpace mirror, which must hold the member key just announced, under our lease,
   then runs, in one TaskGroup: the keyspace watch, the lease keep-alive, the resolver (which
   runs a Replica per assigned journal) and the persister;
4. once the resolver runs the local replicas, opens the gate: ``start()`` returns, and
   ``is_ready()`` (``/debug/ready``) turns true.

Any of those failing fails the broker (``stop()`` re-raises): a broker that lost its lease or its
view of etcd must not go on serving. It stops answering at once; with scratch or memory spools
(which go with the process) it then stops its replicas and persists their fragments as a
graceful stop does, since they may hold the last copy of acknowledged content (an etcd outage
past the lease TTL fails every broker at once); durable spools are left to a restart's
recovery (docs/reliability.md, "A broker that fails").

Stopping is graceful: the gRPC server drains (appends in flight roll back), local replicas roll
their spools (completing fragments for the persister), queued fragments are persisted within a
bound, and the lease is revoked.

A graceful *exit* (``gazette serve`` on SIGTERM, as Gazette's broker does) first hands the
broker's journals off (``hand_off``): it re-announces itself with a zero journal limit, keeps
serving while the allocator moves each journal to other brokers without ever leaving it short
of consistent replicas, and stops once it serves none (or after a bound). Appends in flight
meanwhile wait for the new route, then go to (or are proxied to) the new primary: none fail.

The Journal service (each RPC implemented by its own module) is ``broker.journal_service``; the
configuration ``broker.broker_config``; the graceful exit's hand-off ``broker.hand_off``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import tempfile
import time
from collections.abc import Callable

import grpc

from broker.allocator.announce import announce
from broker.append_api import AppendApi
from broker.append_fsm import AppendEnv
from broker.append_pulse import pulse
from broker.auth import KeyedAuth, KeyedAuthorizer, client_interceptors
from broker.auth_server import AuthInterceptor, ResolverScope
from broker.broker_config import BrokerConfig
from broker.client.route_cache import ChannelPool
from broker.fragment.index import FragmentIndex
from broker.fragment.persister import Persister
from broker.fragment.spool_blocks import BlockPool, BlockSpoolFile
from broker.fragment.spool_dir import SpoolDir
from broker.fragment.spool_file import SpoolFile, TempSpoolFile
from broker.fragment.store_health import StoreHealthMonitor
from broker.fragment.stores.registry import StoreRegistry, new_registry
from broker.fragments_api import FragmentsAPI, StoreHealthAPI
from broker.grpc_transport import (
    EXCLUSIVE_PORT_SERVER_OPTIONS,
    PEER_KEEPALIVE_SERVER_OPTIONS,
    with_options,
)
from broker.hand_off import hand_off, handoff_wait_s_default
from broker.journal_service import SERVER_OPTIONS, JournalService
from broker.keyspace.backend import Backend, KeySpaceError, LeaseNotFoundError
from broker.keyspace.embedded import log_failure
from broker.keyspace.keyspace import KeySpace
from broker.keyspace.lease import keep_lease_alive_from_grant, lease_kept
from broker.list_apply_api import ListApplyAPI
from broker.logging import get_logger
from broker.peer_dialer import PEER_READ_CHANNEL_OPTIONS
from broker.pipeline import Dialer, pipeline_close_wait_s_default
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import is_quorum_journal
from broker.protocol.validate import validate_broker_spec
from broker.quorum_shell.journals import QuorumJournals
from broker.quorum_shell.node_config import broker_quorum_config
from broker.quorum_shell.pulse import quorum_pulse
from broker.quorum_shell.status import status_handler
from broker.quorum_shell.transport import deliver_handler
from broker.read_api import ReadAPI
from broker.read_staging import StagingArea, disk_space_of
from broker.readiness import ReadinessGate, check_own_member
from broker.replica import PulseResult, Replica, ReplicaEnv
from broker.replicate_api import ReplicateApi
from broker.resolver import Resolver
from broker.rpc_tasks import InFlightRpcs
from broker.service_handlers import add_journal_service
from broker.tls import bind_port
from broker.topology import (
    Decoded,
    etcd_header,
    make_header,
    member_key,
    new_keyspace,
    validate_process_id,
)

# Re-exported: callers build a Broker from ``broker.server`` alone.
__all__ = ["Broker", "BrokerConfig", "BrokerStateError"]

log = get_logger(__name__)


class BrokerStateError(RuntimeError):
    """start()/stop() called out of order."""


class Broker:
    """One broker (see the module docstring)."""

    def __init__(
        self,
        backend: Backend,
        config: BrokerConfig,
        *,
        stores: StoreRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.backend = backend
        self.config = config
        self.stores = stores
        self.clock = clock
        # Blocks of memory spools, shared by this broker's journals (unused with files).
        self._spool_blocks = BlockPool()
        # Durable spools, when the broker has a data directory (and does not spool in memory).
        self.spool_dir: SpoolDir | None = None
        if config.data_dir is not None and not config.memory_spools:
            self.spool_dir = SpoolDir(config.data_dir, fsync=config.fsync)
        self.id = pb.ProcessSpec.ID(zone=config.zone, suffix=config.suffix)
        self.ks: KeySpace[Decoded] = new_keyspace(config.root)
        # With keys, every RPC must be authorized, and this broker signs its own calls.
        self.auth = KeyedAuth.parse(config.auth_keys) if config.auth_keys else None
        signing = client_interceptors(KeyedAuthorizer(self.auth) if self.auth else None)
        self.dialer = Dialer(signing, tls=config.peer_tls)
        # Channels of the read path (proxied reads and fragment listings).
        self.channels = ChannelPool(
            interceptors=signing, tls=config.peer_tls, options=PEER_READ_CHANNEL_OPTIONS
        )
        self.resolver = Resolver(
            self.ks,
            config.root,
            self.id,
            self._new_replica,
            revision_wait_s=config.revision_wait_s,
        )
        # Health checks of fragment stores: of journals' primary stores before appends (only
        # with stores to persist to), and of any store for the FragmentStoreHealth RPC.
        self.store_health = StoreHealthMonitor(
            stores if stores is not None else new_registry(), config.store_health
        )
        self.append_env = AppendEnv(
            resolver=self.resolver,
            backend=backend,
            dialer=self.dialer,
            clock=clock,
            store_health=self.store_health if stores is not None else None,
            peer_response_timeout_s=config.peer_response_timeout_s,
            pipeline_close_wait_s=config.pipeline_close_wait_s,
        )
        self.persister: Persister | None = None
        if stores is not None:
            self.persister = Persister(
                stores,
                self.resolver.lookup_spec,
                new_file=self._new_spool_file,
                index_of=self._index_of,
                clock=clock,
            )
        self.replica_env = ReplicaEnv(
            lookup_spec=self.resolver.lookup_spec,
            new_spool_file=self._new_spool_file,
            stores=stores,
            persister=self.persister,
            pulse=self._pulse if config.pulse_enabled else None,
            clock=clock,
            pulse_interval_s=config.pulse_interval_s,
            shutdown_wait_s=config.shutdown_wait_s,
            spool_dir=self.spool_dir,
        )
        # Journals labelled replication-mode=quorum: their nodes follow the keyspace.
        self.quorum = QuorumJournals(
            self.ks,
            config.root,
            self.id,
            backend,
            replica_of=lambda journal: self.resolver.replicas.get(journal),
            spec_of=self.resolver.lookup_spec,
            clock=clock,
            # Member logs under <data_dir>/quorum (quorum_shell/log_file.py), synced like
            # the spools.
            data_dir=config.data_dir,
            fsync=config.fsync,
            stores=stores,
        )
        if config.quorum_log_bytes_max is not None:
            self.quorum.quorum_config = dataclasses.replace(
                broker_quorum_config(), log_bytes_max=config.quorum_log_bytes_max
            )
        self.ks.observers.append(self.quorum.observe)
        self.resolver.replica_started.append(self.quorum.replica_started)
        self._server: grpc.aio.Server | None = None
        self._task: asyncio.Task[None] | None = None
        # Answers every RPC UNAVAILABLE until start() has the broker ready (broker.readiness).
        self.gate = ReadinessGate(f"broker {config.zone}#{config.suffix}")
        # Every RPC's task, so that stopping waits for their cleanup (broker.rpc_tasks).
        self.rpcs = InFlightRpcs()
        # Set once the gRPC port is bound (``endpoint`` known), before the broker is ready.
        self.bound = asyncio.Event()
        self.lease_id = 0
        # The lease's refresh loop, from the grant on (keep_lease_alive_from_grant).
        self._keepalive: asyncio.Task[None] | None = None
        self.endpoint = ""
        # The BrokerSpec announced under the lease (set by start()).
        self.spec = pb.BrokerSpec()

    def __repr__(self) -> str:
        return f"Broker<{self.config.zone}#{self.config.suffix} {self.endpoint}>"

    def is_ready(self) -> bool:
        """Whether the broker serves: started (it knows the cluster: see broker.readiness),
        and neither stopping nor failed."""
        return (
            self.gate.is_open
            and self._server is not None
            and self._task is not None
            and not self._task.done()
        )

    # --- Wiring ---

    def _new_spool_file(self) -> SpoolFile:
        """Content files of non-durable spools, and scratch files (compressed copies)."""
        if self.config.memory_spools:
            return BlockSpoolFile(self._spool_blocks)
        if self.spool_dir is not None:
            return self.spool_dir.new_scratch_file()
        return TempSpoolFile(self.config.spool_dir)

    def _new_stage_file(self) -> SpoolFile:
        """Scratch files of stored fragments staged for Reads (read_staging.py): files where
        the spools' scratch goes, never memory blocks (which are for appends; a staged copy
        can be GiBs)."""
        return TempSpoolFile(self._stage_dir())

    def _stage_dir(self) -> str:
        if self.spool_dir is not None:
            return str(self.spool_dir.scratch)
        return self.config.spool_dir or tempfile.gettempdir()

    async def _recover_spools(self) -> None:
        """Recover the durable spools of a previous run (fragment/spool_dir.py), before the
        broker serves anything: their journals' replicas resume from them once assigned."""
        if self.spool_dir is None:
            return
        report = await asyncio.to_thread(self.spool_dir.recover)
        if report.journals or report.set_aside:
            log.info(
                "spools recovered",
                journals=report.journals,
                completed_fragments=report.completed,
                open_bytes=report.open_bytes,
                set_aside=report.set_aside,
            )

    def _new_replica(self, journal: str) -> Replica:
        return Replica(journal, self.replica_env)

    def _index_of(self, journal: str) -> FragmentIndex | None:
        replica = self.resolver.replicas.get(journal)
        return replica.index if replica is not None else None

    async def _pulse(self, journal: str) -> PulseResult:
        spec = self.resolver.lookup_spec(journal)
        if spec is not None and is_quorum_journal(spec.labels):
            # No all-replicas pipeline (it would hold the members' spools, which the quorum
            # applier writes): only the route is advertised.
            return await quorum_pulse(self.resolver, self.backend, journal)
        result = await pulse(self.append_env, journal)
        if result.committed and self.persister is not None:
            # This broker is the primary now: what it holds for a former primary's upload is
            # uploaded at once (persister.expedite).
            self.persister.expedite(journal)
        return result

    # --- Lifecycle ---

    async def start(self) -> None:
        """Bind, announce, load the mirror, start the replicas, then serve (see the module
        docstring). RPCs that arrive before (the port is bound first) are answered UNAVAILABLE
        by the readiness gate. Returns once the broker serves; raises (having released the
        port and the lease) if it cannot."""
        if self._server is not None:
            raise BrokerStateError(f"{self!r}: already started")
        validate_process_id(self.id)  # Before binding anything: a bad ID changes nothing.
        # Before binding: a spool directory that cannot be recovered changes nothing.
        await self._recover_spools()
        server = await self._bind()
        try:
            announced = await self._announce()
            await self._load_keyspace(announced)
            self._task = asyncio.create_task(self._run(), name=f"{self!r}")
            await self._until_serving(self._task)
        except BaseException:
            # Not serving: release the port (and the member key) rather than hold them as a
            # member that answers nothing.
            self._server = None
            await self._abandon_start(server)
            raise
        self.gate.open()
        log.info("broker ready", broker=repr(self), revision=self.ks.header.revision)

    async def _bind(self) -> grpc.aio.Server:
        """Start the gRPC server, behind the closed readiness gate; sets ``endpoint``."""
        cfg = self.config
        auth = [AuthInterceptor(self.auth, ResolverScope(self.resolver))] if self.auth else []
        # The gate first: a broker that is not ready answers before checking anything else.
        # Peers ping their calls here (grpc_transport.py): accept their rate.
        options = with_options(
            SERVER_OPTIONS, (*PEER_KEEPALIVE_SERVER_OPTIONS, *EXCLUSIVE_PORT_SERVER_OPTIONS)
        )
        server = grpc.aio.server(options=options, interceptors=[self.rpcs, self.gate, *auth])
        registry = self.store_health.registry
        service = JournalService(
            AppendApi(
                self.append_env,
                min_rate_bytes_per_s=cfg.min_append_rate_bytes_per_s,
                burst_s=cfg.flow_control_burst_s,
                quorum=self.quorum,
            ),
            ReplicateApi(self.resolver),
            ReadAPI(
                self.resolver,
                registry,
                self.channels,
                zone=cfg.zone,
                quorum=self.quorum,
                # Stored fragments are verified whole in scratch files on disk.
                staging=StagingArea(
                    self._new_stage_file,
                    bytes_max=cfg.stage_bytes_max,
                    disk_space=disk_space_of(self._stage_dir()),
                ),
            ),
            FragmentsAPI(
                self.resolver,
                registry,
                self.channels,
                zone=cfg.zone,
                first_refresh_wait_s=cfg.fragments_listing_wait_s,
            ),
            ListApplyAPI(self.ks, self.backend, cfg.root, self.id),
            StoreHealthAPI(self.store_health, self._unrouted_header),
        )
        # Append and Replicate read content chunks without copying them (service_handlers.py).
        add_journal_service(service, server)
        # Quorum journals' replication RPC and their status (gazette.quorum.Replica), beside
        # protocol.Journal.
        server.add_generic_rpc_handlers(
            [
                deliver_handler(self.quorum.route),
                status_handler(
                    self.ks,
                    cfg.root,
                    self.quorum.nodes,
                    self.quorum.open_failures,
                    self.quorum.name,
                ),
            ]
        )
        port, scheme = bind_port(server, f"{cfg.host}:{cfg.port}", cfg.tls)
        await server.start()
        self._server = server
        self.endpoint = f"{scheme}://{cfg.host}:{port}"
        self.bound.set()
        return server

    async def _announce(self) -> int:
        """Grant the lease, start keeping it alive (through the rest of the start and the
        run), and put the member key under it: the revision of the put."""
        cfg = self.config
        spec = pb.BrokerSpec(
            process_spec=pb.ProcessSpec(id=self.id, endpoint=self.endpoint),
            journal_limit=cfg.journal_limit,
        )
        validate_broker_spec(spec)
        self.spec = spec
        self.lease_id, ttl_s = await self.backend.lease_grant(cfg.lease_ttl_s)
        self._keepalive = keep_lease_alive_from_grant(self.backend, self.lease_id, ttl_s)
        # A predecessor with this ID (crashed, its lease not yet expired) still holds the key
        # and its assignments: wait for them to go rather than take them as ours.
        return await announce(
            self.backend,
            self._member_key(),
            spec.SerializeToString(),
            self.lease_id,
            ttl_s,
            keepalive=self._keepalive,
        )

    async def _load_keyspace(self, announced: int) -> None:
        """Load the mirror; it must show this broker's own announcement."""
        await self.ks.load(self.backend)
        check_own_member(self.ks, self._member_key(), self.lease_id, announced)

    async def _until_serving(self, task: asyncio.Task[None]) -> None:
        """Wait until the resolver runs the local replicas (or ``task`` fails first)."""
        serving = asyncio.ensure_future(self.resolver.serving.wait())
        try:
            await asyncio.wait([serving, task], return_when=asyncio.FIRST_COMPLETED)
        finally:
            serving.cancel()
        if task.done():
            task.result()  # Raises what failed it.
            raise BrokerStateError(f"{self!r}: stopped while starting")

    async def _abandon_start(self, server: grpc.aio.Server) -> None:
        keepalive, self._keepalive = self._keepalive, None
        if keepalive is not None:
            keepalive.cancel()
            with contextlib.suppress(BaseException):
                await keepalive
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
        if task is not None:
            with contextlib.suppress(BaseException):
                await task
        await server.stop(0)
        await self.rpcs.drain()
        if self.lease_id:
            with contextlib.suppress(LeaseNotFoundError, KeySpaceError):
                await self.backend.lease_revoke(self.lease_id)
        await self.dialer.close()
        await self.channels.close()

    def _unrouted_header(self) -> pb.Header:
        """The header of answers about no journal (Gazette's unrouted header)."""
        return make_header(
            self.resolver.local_id(), pb.Route(primary=-1), etcd_header(self.ks.header)
        )

    def _member_key(self) -> bytes:
        return member_key(self.config.root, self.config.zone, self.config.suffix).encode()

    async def _run(self) -> None:
        persister = self.persister
        assert self._keepalive is not None  # Started by _announce.
        # Shielded from the group's cancellation: when a daemon fails, the replicas may still
        # stop in order (below), completing their fragments for the persister.
        serving = asyncio.ensure_future(self.resolver.run())
        try:
            async with asyncio.TaskGroup() as tg:
                daemons = [
                    tg.create_task(self.ks.watch(self.backend)),
                    tg.create_task(lease_kept(self._keepalive)),
                    tg.create_task(self.store_health.run()),
                ]
                if persister is not None:
                    daemons.append(tg.create_task(persister.run()))
                await asyncio.shield(serving)
                for task in daemons:
                    task.cancel()
        except Exception as exc:
            # A lost lease, a dead keyspace watch, a failed replica: this broker's view of the
            # cluster can no longer be trusted. Stop answering at once, rather than serve (or
            # proxy) on it until someone calls stop().
            log_failure(log, "broker failed; no longer serving", exc, broker=repr(self))
            self.gate.close()
            server = self._server
            if server is not None:
                await server.stop(0)
            if self.spool_dir is None:
                # Persist what this broker holds, as a graceful stop does: scratch spools
                # (no --data-dir) and memory spools go with the process, and may be the last
                # copy of acknowledged content (an etcd outage longer than the lease TTL fails
                # every broker at once). Gazette's brokers do the same on any exit (their
                # replicas stop, then the persister finishes). Durable spools are left as they
                # are: a restart recovers them, and checks first whether the journal went on
                # without this broker (fragment/spool_recovery.py), which persisting now could
                # not (see docs/reliability.md, "a broker that fails"). The cancelled RPCs'
                # handlers first give back the pipelines and spools they hold (appends roll
                # back), as in stop(). Whatever fails here, the failure reported is the first.
                try:
                    await self.rpcs.drain()
                    await self._stop_replicas(serving)
                    await self._drain_persister()
                except Exception as err:
                    log.error("broker failed: persisting what it held failed", error=str(err))
            raise
        finally:
            if not serving.done():  # Failed with durable spools, or this task was cancelled.
                serving.cancel()
                with contextlib.suppress(BaseException):
                    await serving
        await self._drain_persister()

    async def _stop_replicas(self, serving: asyncio.Future[None]) -> None:
        """Stop every local replica and wait (bounded) until they did: each completes its
        fragment for the persister. A replica bounds its own shutdown: the pipeline
        (``shutdown_wait_s``), its close (``pipeline_close_wait_s_default``), then the spool
        (``shutdown_wait_s``); past all of it, the rest is left to the caller's cancellation.
        Never raises: the failure being handled is what the caller reports."""
        self.resolver.stop_serving()
        bound_s = (
            2 * self.config.shutdown_wait_s
            + pipeline_close_wait_s_default
            + self.config.stop_grace_s
        )
        await asyncio.wait([serving], timeout=bound_s)
        if not serving.done():
            log.warning("broker failed: its replicas did not stop in time", broker=repr(self))
        elif not serving.cancelled() and (err := serving.exception()) is not None:
            # Failed before (the failure being handled, or part of it), or as it stopped.
            log.warning("broker failed: stopping its replicas failed", error=str(err))

    async def _drain_persister(self) -> None:
        """Persist the fragments replicas completed as they stopped, within a bound."""
        persister = self.persister
        if persister is None:
            return
        persister.close()
        try:
            async with asyncio.timeout(self.config.persist_drain_s):
                await persister.run(drain=True)
        except TimeoutError:
            log.warning("stopping broker: fragments left unpersisted", pending=persister.pending)

    async def hand_off(self, timeout_s: float = handoff_wait_s_default) -> bool:
        """Announce that this broker is exiting, then wait until it serves no journal
        (broker/hand_off.py). Returns False if ``timeout_s`` passes first. Call between start()
        and stop(); the broker keeps serving throughout (stop() does the rest of a graceful
        exit)."""
        if self._task is None or self._server is None:
            raise BrokerStateError(f"{self!r}: not started")
        return await hand_off(
            self.backend,
            self.ks,
            self.config.root,
            self.spec,
            self._member_key(),
            self.lease_id,
            broker=repr(self),
            timeout_s=timeout_s,
        )

    async def wait(self) -> None:
        """Wait until the broker stops (or fails: its error is raised)."""
        if self._task is None:
            raise BrokerStateError(f"{self!r}: not started")
        await asyncio.shield(self._task)

    async def stop(self) -> None:
        """Stop gracefully (see the module docstring). Raises what made the broker fail, if it
        did."""
        if self._server is None or self._task is None:
            raise BrokerStateError(f"{self!r}: not started")
        server, self._server = self._server, None
        self.gate.close()
        try:
            await server.stop(self.config.stop_grace_s)
            # Handlers of cancelled calls close their files and pipelines after stop returns.
            await self.rpcs.drain()
            self.resolver.stop_serving()
            await self._task
        finally:
            if not self._task.done():
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
            with contextlib.suppress(LeaseNotFoundError, KeySpaceError):
                await self.backend.lease_revoke(self.lease_id)
            await self.quorum.stop()
            await self.dialer.close()
            await self.channels.close()
