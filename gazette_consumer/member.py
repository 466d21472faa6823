"""A consumer process: membership, allocation, local shards and the Shard service.

A ``ConsumerMember`` is one member of a consumer group (one ``gazette-consumer serve``, or one
of several in an embedded process or a test). Starting it:

1. binds the gRPC server (port 0 picks a free one; TLS with ``tls``, advertised as https://)
   with the Shard service, so that the endpoint is known, behind a readiness gate
   (``broker.readiness``): until step 3 is done, every RPC is answered UNAVAILABLE
   ("starting"), never from an empty view of the cluster; then, with ``auth_keys``, behind the
   authorization interceptor (``shard_auth``);
2. grants a lease and announces the member, ``<root>/members/<zone>#<suffix>`` = ConsumerSpec,
   under it: if the process dies, the lease expires, the key and its assignments vanish, and the
   allocator promotes the standbys elsewhere. A process restarted with the same ID first waits
   for its predecessor's key to go (``broker.allocator.announce``);
3. loads the KeySpace mirror (it must hold the member key just announced, under our lease),
   opens the gate, and runs, in one TaskGroup: the keyspace watch, the lease
   keep-alive, the allocator (it acts only while this member leads) and the local shards, which
   start and stop replicas through ``start_shard`` and advertise their statuses.

Failure. A lost lease, a dead watch or a failed allocator fails the member: every local shard
is stopped at once and ``wait()`` / ``stop()`` raise the cause. A member whose view of the
cluster cannot be trusted must not go on running shards, since a new primary may already run
elsewhere (its store fence would stop us anyway; stopping first is cleaner).

Graceful stop (SIGTERM). ``stop()`` first *drains*: it re-announces the member as *exiting*
(``ConsumerSpec.exiting``, its shard limit kept, as Gazette's consumers do), so the allocator
gives it no new shard and moves every assignment away, each primary only once a standby
elsewhere is ready (STANDBY) to take over. The allocator returns once nothing is assigned here;
then the local shards stop, the lease is revoked and the server stops. Draining is bounded by
``drain_timeout_s`` (a lone member has nowhere to hand off to): past it the member stops anyway,
and its lease revocation makes the allocator re-assign what it held.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import grpc.aio

from broker.allocator import MemberId, MemberNotFoundError
from broker.allocator import serve as allocate
from broker.allocator.announce import announce
from broker.auth import KeyedAuth, KeyedAuthorizer, client_interceptors
from broker.client.route_cache import ChannelPool, message_bytes_max
from broker.grpc_transport import EXCLUSIVE_PORT_SERVER_OPTIONS, PEER_KEEPALIVE_SERVER_OPTIONS
from broker.keyspace.backend import Backend, KeySpaceError, LeaseNotFoundError
from broker.keyspace.embedded import log_failure
from broker.keyspace.lease import keep_lease_alive_from_grant, lease_kept
from broker.logging import get_logger
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import consumer_pb2_grpc as cpbg
from broker.protocol import protocol_pb2 as pb
from broker.protocol.validate import validate_consumer_spec
from broker.readiness import ReadinessGate, check_own_member
from broker.rpc_tasks import InFlightRpcs
from broker.tls import ClientTls, ServerTls, bind_port
from broker.topology import MEMBERS
from gazette_consumer.local_shards import LocalShards
from gazette_consumer.resolver import Resolver
from gazette_consumer.service import ShardService
from gazette_consumer.shard_auth import KeySpaceShardScope, ShardAuthInterceptor
from gazette_consumer.shard_handle import StartShard
from gazette_consumer.topology import (
    ConsumerMember as ConsumerMemberValue,
)
from gazette_consumer.topology import (
    consumer_item_limit,
    member_key,
    new_keyspace,
    shard_is_consistent,
    shard_replication,
)

log = get_logger(__name__)

# Member keys live this long without a keep-alive (etcd TTL, whole seconds; Gazette's default).
lease_ttl_s_default = 20
# Gazette's default per-consumer shard limit.
shard_limit_default = 1024
# Longest a graceful stop waits for the allocator to move this member's shards elsewhere.
drain_timeout_s_default = 60.0
# How long in-flight RPCs may finish when the server stops.
stop_grace_s_default = 1.0
# The allocator re-plans at least this often even when the keyspace is quiet.
allocator_idle_wake_s_default = 30.0

_SERVER_OPTIONS = [
    ("grpc.max_send_message_length", message_bytes_max),
    ("grpc.max_receive_message_length", message_bytes_max),
    # Clients' channels (ChannelPool: other members proxying, ShardClient, gazctl) ping while
    # calls are in flight, as the brokers' servers accept; by gRPC's default a call that waits
    # long without data (a Stat waiting to read through) would be cut "too_many_pings".
    *PEER_KEEPALIVE_SERVER_OPTIONS,
    *EXCLUSIVE_PORT_SERVER_OPTIONS,  # A port in use fails the start (tls.bind_port).
]


@dataclass(frozen=True)
class ConsumerConfig:
    zone: str
    suffix: str
    # The consumer group's etcd root (see topology.default_root).
    root: str
    host: str = "127.0.0.1"
    port: int = 0
    shard_limit: int = shard_limit_default
    lease_ttl_s: int = lease_ttl_s_default
    drain_timeout_s: float = drain_timeout_s_default
    stop_grace_s: float = stop_grace_s_default
    allocator_idle_wake_s: float = allocator_idle_wake_s_default
    # Pre-shared keys (base64, comma/space separated; see broker.auth); "": no authorization.
    # With keys, every RPC must be authorized (gazette_consumer.shard_auth), and the member
    # signs the Stat requests it proxies to peers.
    auth_keys: str = field(default="", repr=False)
    # Serve TLS (advertising https://) with this certificate (broker.tls); None: in the clear.
    tls: ServerTls | None = None
    # What peers' https:// endpoints are trusted with (and, for mutual TLS, our certificate).
    peer_tls: ClientTls | None = None


class ConsumerStateError(RuntimeError):
    """start()/stop() called out of order."""


class ConsumerMember:
    """One consumer process (see the module docstring).

    ``start_shard`` starts a replica when a shard is assigned here (see ``shard_handle``).
    ``add_services`` may register the application's own gRPC services on the member's server
    before it starts (they can route queries with ``resolver``)."""

    def __init__(
        self,
        backend: Backend,
        config: ConsumerConfig,
        start_shard: StartShard,
        *,
        add_services: Callable[[grpc.aio.Server], None] | None = None,
    ) -> None:
        if config.shard_limit < 1:
            # A zero limit drains a member (see consumer_item_limit): a member starting with
            # one would return from allocating at once, and stop allocating for everyone if it
            # led.
            raise ValueError(f"shard_limit: must be >= 1 (got {config.shard_limit})")
        self.backend = backend
        self.config = config
        self.id = pb.ProcessSpec.ID(zone=config.zone, suffix=config.suffix)
        self.member_id = MemberId(config.zone, config.suffix)
        self.ks = new_keyspace(config.root)
        self.local = LocalShards(
            self.ks, backend, config.root, config.zone, config.suffix, start_shard
        )
        self.resolver = Resolver(self.ks, config.root, self.id, self.local)
        self.auth = KeyedAuth.parse(config.auth_keys) if config.auth_keys else None
        signing = client_interceptors(KeyedAuthorizer(self.auth) if self.auth else None)
        self.channels = ChannelPool(interceptors=signing, tls=config.peer_tls)
        self._add_services = add_services
        self._server: grpc.aio.Server | None = None
        self._task: asyncio.Task[None] | None = None
        # Answers every RPC UNAVAILABLE until start() has the member ready (broker.readiness).
        self.gate = ReadinessGate(f"consumer {config.zone}#{config.suffix}")
        # Every RPC's task, so that stopping waits for their cleanup (broker.rpc_tasks).
        self.rpcs = InFlightRpcs()
        # Set once the gRPC port is bound (``endpoint`` known), before the member is ready.
        self.bound = asyncio.Event()
        self._draining = asyncio.Event()
        self._drained = asyncio.Event()
        self.lease_id = 0
        self.endpoint = ""

    def __repr__(self) -> str:
        return f"ConsumerMember<{self.config.zone}#{self.config.suffix} {self.endpoint}>"

    def _spec(self, *, exiting: bool = False) -> cpb.ConsumerSpec:
        spec = cpb.ConsumerSpec(
            process_spec=pb.ProcessSpec(id=self.id, endpoint=self.endpoint),
            shard_limit=self.config.shard_limit,
            exiting=exiting,
        )
        validate_consumer_spec(spec)
        return spec

    # --- Lifecycle ---

    async def start(self) -> None:
        """Bind, announce, load the mirror and start serving (see the module docstring). RPCs
        that arrive before (the port is bound first) are answered UNAVAILABLE by the readiness
        gate; returns once the member serves."""
        if self._server is not None:
            raise ConsumerStateError(f"{self!r}: already started")
        cfg = self.config
        # The gate first: a member that is not ready refuses every service's RPCs, the
        # application's own included; then authorization, if the member has keys.
        scope = KeySpaceShardScope(self.ks, cfg.root)
        auth = [ShardAuthInterceptor(self.auth, scope)] if self.auth else []
        server = grpc.aio.server(
            options=_SERVER_OPTIONS, interceptors=[self.rpcs, self.gate, *auth]
        )
        cpbg.add_ShardServicer_to_server(
            ShardService(self.ks, self.backend, cfg.root, self.resolver, self.channels, self.id),
            server,
        )
        if self._add_services is not None:
            self._add_services(server)
        port, scheme = bind_port(server, f"{cfg.host}:{cfg.port}", cfg.tls)
        await server.start()
        self._server = server
        self.endpoint = f"{scheme}://{cfg.host}:{port}"
        self.bound.set()
        keepalive: asyncio.Task[None] | None = None
        try:
            spec = self._spec()
            self.lease_id, ttl_s = await self.backend.lease_grant(cfg.lease_ttl_s)
            # Refreshed from the grant on, through the mirror's load and the run.
            keepalive = keep_lease_alive_from_grant(self.backend, self.lease_id, ttl_s)
            # A predecessor with this ID (crashed, its lease not yet expired) still holds the
            # key and its assignments: wait for them to go rather than take them as ours.
            announced = await announce(
                self.backend,
                self._key(),
                spec.SerializeToString(),
                self.lease_id,
                ttl_s,
                keepalive=keepalive,
            )
            await self.ks.load(self.backend)
            check_own_member(self.ks, self._key(), self.lease_id, announced)
        except BaseException:
            self._server = None
            if keepalive is not None:
                keepalive.cancel()
                with contextlib.suppress(BaseException):
                    await keepalive
            await server.stop(0)
            await self.rpcs.drain()
            if self.lease_id:
                with contextlib.suppress(LeaseNotFoundError, KeySpaceError):
                    await self.backend.lease_revoke(self.lease_id)
            raise
        self._task = asyncio.create_task(self._run(keepalive), name=repr(self))
        self.gate.open()

    def is_ready(self) -> bool:
        """Whether the member serves: started (it knows the cluster: see broker.readiness),
        and neither stopping nor failed."""
        task = self._task
        return self.gate.is_open and task is not None and not task.done()

    def _key(self) -> bytes:
        return member_key(self.config.root, self.config.zone, self.config.suffix).encode()

    async def _run(self, keepalive: asyncio.Task[None]) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                daemons = [
                    tg.create_task(self._watch()),
                    tg.create_task(lease_kept(keepalive)),
                    tg.create_task(self._allocate()),
                ]
                await self.local.run()
                for task in daemons:
                    task.cancel()
        except BaseException as exc:
            # A lost lease, a dead watch, a failed allocator: stop serving at once (the
            # TaskGroup has already stopped the local shards: see LocalShards.run).
            if not isinstance(exc, asyncio.CancelledError):
                log_failure(
                    log, "consumer member failed; no longer serving", exc, member=repr(self)
                )
            self.gate.close()
            server = self._server
            if server is not None:
                await server.stop(0)
            raise

    async def _watch(self) -> None:
        await self.ks.watch(self.backend)
        # The watch ends only when the backend closes: our view would silently go stale.
        raise KeySpaceError(f"{self!r}: keyspace watch ended (backend closed)")

    async def _allocate(self) -> None:
        """Run the allocator; it returns only once this member is drained."""
        try:
            await allocate(
                self.backend,
                self.ks,
                self.member_id,
                is_consistent=shard_is_consistent,
                replication_of=shard_replication,
                item_limit_of=consumer_item_limit,
                idle_wake_s=self.config.allocator_idle_wake_s,
            )
        except MemberNotFoundError:
            if not self._draining.is_set():
                raise
            # Our key went while draining (the stop revoked it, or the lease ran out): done.
        self._drained.set()
        if not self._draining.is_set():
            # Someone else set our shard limit to zero or marked us exiting (an operator
            # draining us): we hold nothing, and while our key remains we may be the leader
            # that no longer allocates for anyone. Exit, as Gazette's consumers do; stop()
            # then revokes the lease.
            log.info("consumer drained by its member key's shard limit; exiting", member=repr(self))
            self.local.stop_serving()

    @property
    def failure(self) -> BaseException | None:
        """What made the member fail, once it has (None while it runs or after a clean stop)."""
        task = self._task
        if task is None or not task.done() or task.cancelled():
            return None
        return task.exception()

    async def abort(self) -> None:
        """Stop at once as a crashed process would: no drain, and the lease is left to expire
        (simulations and tests of failover). The local shards are still stopped."""
        if self._server is None or self._task is None:
            raise ConsumerStateError(f"{self!r}: not started")
        self.gate.close()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        server, self._server = self._server, None
        await server.stop(0)
        await self.rpcs.drain()
        await self.channels.close()

    async def wait(self) -> None:
        """Wait until the member stops (or fails: its error is raised)."""
        if self._task is None:
            raise ConsumerStateError(f"{self!r}: not started")
        await asyncio.shield(self._task)

    async def drain(self) -> bool:
        """Hand every local shard off to other members (shard limit zero), waiting at most
        ``drain_timeout_s``; whether the member is drained."""
        if self._task is None:
            raise ConsumerStateError(f"{self!r}: not started")
        if self.local.shards and not self._others_can_take_over():
            # Waiting would only run out the timeout: stop at once instead.
            log.warning("no other consumer can take over; not draining", member=repr(self))
            return False
        self._draining.set()
        if self.ks.get(self._key()) is not None:
            await self.backend.put(
                self._key(), self._spec(exiting=True).SerializeToString(), lease=self.lease_id
            )
        drained = asyncio.ensure_future(self._drained.wait())
        try:
            await asyncio.wait(
                (drained, self._task),
                timeout=self.config.drain_timeout_s,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            drained.cancel()
        if not self._drained.is_set():
            log.warning(
                "consumer did not drain in time; stopping anyway",
                member=repr(self),
                shards=self.local.shards,
            )
        return self._drained.is_set()

    def _others_can_take_over(self) -> bool:
        """Whether another member with room for shards is announced."""
        prefix = self.config.root + MEMBERS
        for entry in self.ks.search(prefix):
            member = entry.decoded
            if (
                isinstance(member, ConsumerMemberValue)
                and (member.zone, member.suffix) != (self.config.zone, self.config.suffix)
                and member.spec.shard_limit > 0
                and not member.spec.exiting
            ):
                return True
        return False

    async def stop(self, *, graceful: bool = True) -> None:
        """Stop: drain first when ``graceful`` (see the module docstring), then stop the local
        shards, revoke the lease and stop the server. Raises what made the member fail, if it
        did."""
        if self._server is None or self._task is None:
            raise ConsumerStateError(f"{self!r}: not started")
        try:
            if graceful and not self._task.done():
                with contextlib.suppress(KeySpaceError):
                    await self.drain()
            self.local.stop_serving()
            await self._task
        finally:
            if not self._task.done():
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
            with contextlib.suppress(LeaseNotFoundError, KeySpaceError):
                await self.backend.lease_revoke(self.lease_id)
            self.gate.close()
            server, self._server = self._server, None
            if server is not None:
                await server.stop(self.config.stop_grace_s)
                await self.rpcs.drain()
            await self.channels.close()
