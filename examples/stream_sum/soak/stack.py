"""Everything a soak runs, as real processes on loopback: etcd, brokers, consumers, PostgreSQL,
and an S3 server.

`SoakStack` starts a `ProcessCluster` (etcd and brokers in zones, each broker with its HTTP
gateway, on ports it keeps across restarts), a durable `PgServer` of its own, a `MotoServer`
holding an S3 bucket, and one `ConsumerProcess` of the summer per consumer identity (each
pointed at a broker of its own, so that losing a broker costs a consumer its default endpoint
too). It applies the layout's journals and shards and waits until each journal is replicated as
specified and each shard has its primary and standbys.

It also watches the consumer group's etcd keys (a KeySpace mirror, like the cluster's own for
brokers), so that conditions on shard assignments are waited for on etcd revisions, and it
*supervises*: `exited()` names every process that exited although the soak did not stop it, and
`revive()` starts them again, as a process supervisor (systemd, Kubernetes) would.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from broker import task_dump
from broker.client.route_cache import JournalClient
from broker.keyspace.etcd import EtcdBackend
from broker.keyspace.keyspace import KeySpace
from broker.protocol import consumer_pb2 as cpb
from broker.testing.consumer_process import ConsumerProcess
from broker.testing.moto_server import MotoServer, credentials_env
from broker.testing.pg_server import PgServer
from broker.testing.process_cluster import BrokerProcess, ProcessCluster
from examples.stream_sum.layout import REPLICATION_MODES, Layout, default_layout
from examples.stream_sum.summer import PG_URL_ENV
from gazette_consumer.shard_client import ShardClient
from gazette_consumer.shard_client import upsert as shard_upsert
from gazette_consumer.topology import (
    Decoded,
    ShardAssignment,
    lookup_member,
    new_keyspace,
    shard_assignments,
    status_text,
)

__all__ = ["SoakStack", "StackConfig", "StackError"]

CONSUMER_ROOT: Final = "/stream-sum/consumers"
SUMMER_APP: Final = "examples.stream_sum:Summer"
BUCKET: Final = "stream-sum"
# Shard RPCs of the soak (List, Apply, Unassign) give up after this long.
shard_rpc_timeout_s: Final = 10.0

Condition = Callable[[], str | None]
Code = cpb.ReplicaStatus.Code


class StackError(RuntimeError):
    """The stack could not be brought up, or a wait on it timed out (the message says what
    was still missing)."""


@dataclass(frozen=True)
class StackConfig:
    brokers: Sequence[tuple[str, str]] = (
        ("zone-a", "broker-a1"),
        ("zone-a", "broker-a2"),
        ("zone-b", "broker-b1"),
    )
    consumers: Sequence[tuple[str, str]] = (
        ("zone-a", "consumer-a1"),
        ("zone-a", "consumer-a2"),
        ("zone-b", "consumer-b1"),
    )
    lease_ttl_s: int = 3  # Brokers'.
    # A SIGTERM'd broker waits this long at most for its journals to move, then exits anyway.
    handoff_timeout_s: float = 20.0
    # Then its stop (journals torn down, lease revoked) at most this long: past it the broker
    # logs its threads' stacks and tasks and exits 70 (an "unclean exit" finding), before the
    # harness's own bound (Timeouts.exit_s, 60 s) would kill it with nothing in its log.
    stop_timeout_s: float = 30.0
    consumer_lease_ttl_s: int = 3
    s3: bool = True
    postgres: bool = True
    # Keep logs and data after close (None: if $GAZETTE_TEST_KEEP_CLUSTER_DIR is set).
    keep_dir: bool | None = None
    # Which R=3 journals are quorum journals: "all" (none), "quorum" (every one), "mixed"
    # (some): Layout.with_replication_mode.
    replication_mode: str = "all"

    def __post_init__(self) -> None:
        if self.replication_mode not in REPLICATION_MODES:
            raise ValueError(
                f"unknown replication mode {self.replication_mode!r}; known: {REPLICATION_MODES}"
            )


class SoakStack:
    """See the module docstring. Use as ``async with SoakStack(config) as stack``."""

    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.moto = MotoServer() if config.s3 else None
        self.pg = PgServer() if config.postgres else None
        self.cluster = ProcessCluster(
            config.brokers,
            lease_ttl_s=config.lease_ttl_s,
            extra_args=[
                "--handoff-timeout",
                str(config.handoff_timeout_s),
                "--stop-timeout",
                str(config.stop_timeout_s),
            ],
            keep_dir=config.keep_dir,
            http_gateway=True,
            keep_ports=True,
            env=credentials_env(),
        )
        self.consumers: list[ConsumerProcess] = []
        self.layout: Layout = default_layout(file_store="file:///fragments/")
        self.cks: KeySpace[Decoded] = new_keyspace(CONSUMER_ROOT)
        self._admin: EtcdBackend | None = None
        self._watch: asyncio.Task[None] | None = None
        # Processes stopped on purpose (not to be revived by `revive`), by name.
        self.held: set[str] = set()
        self._clients: dict[str, JournalClient] = {}

    @property
    def dir(self) -> Path:
        return self.cluster.dir

    def keep_logs(self) -> None:
        """Keep the cluster's directory (every process's log, the task dumps) after the stack
        stops: a failed soak's findings point into it."""
        self.cluster.keep_dir = True

    # --- Lifecycle ---

    async def start(self) -> None:
        if self.moto is not None:
            await asyncio.to_thread(self.moto.start)
            await asyncio.to_thread(self.moto.create_bucket, BUCKET)
        if self.pg is not None:
            await self.pg.start()
        await self.cluster.start()
        s3 = self.moto.store_url(BUCKET, "fragments/") if self.moto is not None else None
        self.layout = default_layout(
            file_store=self.cluster.store_url, s3_store=s3, postgres=self.pg is not None
        ).with_replication_mode(self.config.replication_mode)
        await self.cluster.apply(self.layout.journal_specs())
        await self.wait_journals(timeout_s=60.0)
        self._admin = EtcdBackend([self.cluster.etcd.endpoint])
        await self.cks.load(self._admin)
        self._watch = asyncio.create_task(self.cks.watch(self._admin), name="consumer mirror")
        env = {**credentials_env()}
        if self.pg is not None:
            env[PG_URL_ENV] = self.pg.url
        for index, (zone, suffix) in enumerate(self.config.consumers):
            broker = self.cluster.brokers[index % len(self.cluster.brokers)]
            self.consumers.append(
                ConsumerProcess(
                    zone,
                    suffix,
                    app=SUMMER_APP,
                    etcd=self.cluster.etcd.endpoint,
                    broker=broker.endpoint,
                    root=CONSUMER_ROOT,
                    data_dir=self.dir / "consumers" / suffix,
                    lease_ttl_s=self.config.consumer_lease_ttl_s,
                    env=env,
                )
            )
        await asyncio.gather(*(c.start() for c in self.consumers))
        async with self.shard_client() as shards:
            await shards.apply([shard_upsert(s) for s in self.layout.shard_specs()])
        await self.wait_shards(timeout_s=90.0)

    async def close(self) -> None:
        try:
            for c in self.consumers:
                await c.kill()
            if self._watch is not None:
                self._watch.cancel()
                await asyncio.gather(self._watch, return_exceptions=True)
            if self._admin is not None:
                await self._admin.close()
            await self.cluster.close()
        finally:
            for c in self.consumers:
                c.kill_now()
            if self.pg is not None:
                await self.pg.close()
            if self.moto is not None:
                await asyncio.to_thread(self.moto.close)
            if not self.cluster.keep_dir:
                shutil.rmtree(self.dir, ignore_errors=True)

    async def __aenter__(self) -> SoakStack:
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- Clients ---

    def client(self, via: BrokerProcess | None = None) -> JournalClient:
        """A JournalClient whose default endpoint is `via` (else a random running broker);
        one per broker, kept (brokers keep their ports across restarts)."""
        running = [b for b in self.cluster.running() if not b.paused and b.endpoint]
        target = via or (random.choice(running) if running else self.cluster.brokers[0])
        client = self._clients.get(target.suffix)
        if client is None:
            client = self._clients[target.suffix] = self.cluster.client(target)
        return client

    def shard_client(self) -> ShardClient:
        live = [c for c in self.consumers if c.running and not c.paused and c.endpoint]
        if not live:
            raise StackError("no consumer process is running")
        return ShardClient(random.choice(live).endpoint, timeout_s=shard_rpc_timeout_s)

    def consumer(self, suffix: str) -> ConsumerProcess:
        for c in self.consumers:
            if c.suffix == suffix:
                return c
        raise KeyError(f"no consumer {suffix!r}")

    # --- Shard state, from the consumer group's etcd keys ---

    def assignments(self, shard: str) -> list[ShardAssignment]:
        return [
            e.decoded
            for e in shard_assignments(self.cks, CONSUMER_ROOT, shard)
            if isinstance(e.decoded, ShardAssignment)
        ]

    def primary_of(self, shard: str) -> ConsumerProcess | None:
        for a in self.assignments(shard):
            if a.slot == 0:
                return self.consumer(a.suffix)
        return None

    def failed_shards(self) -> dict[str, list[str]]:
        """Shards with a FAILED assignment: their errors, per shard."""
        out: dict[str, list[str]] = {}
        for spec in self.layout.shard_specs():
            for a in self.assignments(spec.id):
                if a.status.code == Code.FAILED:
                    errors = list(a.status.errors) or ["(no error given)"]
                    out.setdefault(spec.id, []).extend(f"{a.suffix}: {e}" for e in errors)
        return out

    def shards_problem(self) -> str | None:
        """Why the shards are not all served as specified (a primary at slot 0, the spec's
        standbys, on distinct live members), or None."""
        for spec in self.layout.shard_specs():
            got = self.assignments(spec.id)
            want = {0: Code.PRIMARY, **{s: Code.STANDBY for s in range(1, spec.hot_standbys + 1)}}
            have = {a.slot: a.status.code for a in got}
            members = {a.suffix for a in got}
            gone = [s for s in members if not self._member_alive(s)]
            if have != want or len(members) != len(got) or gone:
                states = ", ".join(f"{a.suffix}/{a.slot}: {status_text(a.status)}" for a in got)
                return f"shard {spec.id}: [{states}]" + (f" (gone: {gone})" if gone else "")
        return None

    def _member_alive(self, suffix: str) -> bool:
        c = self.consumer(suffix)
        return lookup_member(self.cks, CONSUMER_ROOT, c.zone, c.suffix) is not None

    # --- Waits ---

    async def wait_journals(self, timeout_s: float, exclude: Sequence[str] = ()) -> float:
        """Wait until every journal has its replication (minus the brokers excluded) and
        a consistent route; the seconds it took."""
        started = time.monotonic()
        live = len(self.cluster.brokers) - len(exclude)
        by_r: dict[int, list[str]] = {}
        for spec in self.layout.journal_specs():
            by_r.setdefault(min(spec.replication, live), []).append(spec.name)
        for r, names in sorted(by_r.items()):
            remaining = max(0.1, timeout_s - (time.monotonic() - started))
            try:
                await self.cluster.wait_until(
                    self.cluster.journals_ready(names, r, exclude=exclude), remaining
                )
            except TimeoutError as err:
                raise StackError(f"journals not ready: {err}") from None
        return time.monotonic() - started

    async def wait_shards(self, timeout_s: float) -> float:
        """Wait until `shards_problem` finds none; the seconds it took."""
        return await self.wait_consumers(self.shards_problem, timeout_s, "shards not ready")

    async def wait_consumers(self, condition: Condition, timeout_s: float, what: str) -> float:
        """Wait until `condition` holds, re-checked at each revision of the consumer mirror."""
        started = time.monotonic()
        deadline = started + timeout_s
        while (missing := condition()) is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise StackError(f"{what} after {timeout_s:.0f}s: {missing}")
            with contextlib.suppress(TimeoutError):
                await self.cks.wait_for_revision(self.cks.header.revision + 1, remaining)
        return time.monotonic() - started

    # --- Supervision ---

    def exited(self) -> list[str]:
        """Processes that are not running although nobody holds them stopped: ``name (exit
        code)``."""
        out = []
        for b in self.cluster.brokers:
            if not b.running and b.suffix not in self.held and b.process is not None:
                out.append(f"{b.suffix} (exit {b.process.returncode})")
        for c in self.consumers:
            if not c.running and c.suffix not in self.held and c.process is not None:
                out.append(f"{c.suffix} (exit {c.returncode})")
        return out

    async def revive(self) -> list[str]:
        """Start every process that `exited`; returns what was restarted, with exit codes."""
        restarted = self.exited()
        for b in self.cluster.brokers:
            if not b.running and b.suffix not in self.held:
                await self.cluster.start_broker(b)
        for c in self.consumers:
            if not c.running and c.suffix not in self.held:
                await c.start()
        return restarted

    def logs_dir(self) -> Path:
        return self.dir

    def dump_tasks(self) -> list[str]:
        """Ask every running broker and consumer process to write its asyncio tasks and
        their stacks to its log (broker/task_dump.py): what a stuck process waits on. Returns
        who was asked."""
        asked = []
        for name, proc, paused in [
            *((b.suffix, b.process, b.paused) for b in self.cluster.brokers),
            *((c.suffix, c.process, c.paused) for c in self.consumers),
        ]:
            if proc is not None and proc.returncode is None and not paused:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(task_dump.DUMP_SIGNAL)
                    asked.append(name)
        return asked
