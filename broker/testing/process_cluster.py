"""A cluster of real ``gazette serve`` processes over a real etcd, on loopback, for tests.

In-process clusters (tests/broker/broker_testkit.py) cannot show what only separate processes
do: a broker killed with SIGKILL leaves its lease to expire, a SIGTERM'd one hands its journals
off and exits, brokers talk to each other over real sockets and watch a real etcd. A
``ProcessCluster`` starts an ``EtcdServer`` and one ``gazette serve`` subprocess per requested
broker (zone, suffix), each on a free loopback port, with its own spool directory, a short
lease TTL (so that a crash is noticed within seconds) and a shared ``file://`` fragment store
under the cluster's directory. It keeps its own KeySpace mirror of the cluster's etcd root, so
that tests wait for allocation conditions (``cluster_state``) on etcd revisions, not by sleeping.

Usage::

    brokers = [("zone-a", "broker-a1"), ("zone-a", "broker-a2"), ("zone-b", "broker-b1")]
    async with ProcessCluster(brokers) as c:
        await c.apply([journal_spec("x/y", replication=3, store=c.store_url)])
        await c.wait_until(c.journals_ready(["x/y"], replication=3))
        await append(c.client(), pb.AppendRequest(journal="x/y"), b"hello")
        await c.kill(c.broker("broker-a1"))  # kill -9
        code, elapsed_s = await c.terminate(c.broker("broker-a2"))  # SIGTERM, bounded wait

Readiness is an event, not a sleep: a broker is ready once it prints ``serving on <endpoint>``,
which ``gazette serve`` does after its member key is in etcd and its mirror is loaded (and, with
``http_gateway``, once it also printed ``http gateway on <url>``: ``b.http_endpoint``). Every
broker's stderr (its structured log) goes to ``<dir>/<suffix>.log``. Leaving the context kills
every broker still running (SIGKILL: tests do not need their state), stops etcd and removes the
directory (kept if ``keep_dir``, or ``$GAZETTE_TEST_KEEP_CLUSTER_DIR`` is set); the synchronous
``kill_all_now`` does the first part even from a failing teardown.

Faults beyond kill and SIGTERM, for soak tests: ``pause`` (SIGSTOP: the process keeps its
sockets and state but answers nothing, so its lease expires while it still believes it serves:
a zombie once ``resume``d with SIGCONT). With ``keep_ports``, a broker is given a port of its
own (outside the kernel's ephemeral range, so that no client connection takes it meanwhile)
and keeps it across restarts, as a broker behind a fixed address does: clients whose default
endpoint is that broker reach it again once it is back. ``env`` adds to the brokers'
environment (S3 credentials, say).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Final

from broker.client.list_apply import apply_journals, upsert
from broker.client.route_cache import JournalClient
from broker.keyspace.etcd import EtcdBackend
from broker.keyspace.keyspace import KeySpace
from broker.protocol import protocol_pb2 as pb
from broker.protocol.validate import at
from broker.testing.cluster_state import (
    Condition,
    journals_ready,
    member_gone,
    route_of,
    wait_until,
)
from broker.testing.etcd_server import EtcdServer
from broker.testing.lifecycle import AsyncLifecycle
from broker.testing.ports import reserve_port
from broker.testing.served_process import (
    ServedProcess,
    ServedProcessError,
    exit_timeout_s_default,
)
from broker.topology import DEFAULT_ROOT, Decoded, new_keyspace, validate_process_id

# A broker that has not printed its endpoint this long after being started failed to start.
ready_timeout_s_default: Final = 60.0
# Lease TTL of the brokers (seconds): how long a killed broker's journals stay assigned to it.
lease_ttl_s_default: Final = 3
# Journal specs per Apply RPC (the broker refuses more than 128 changes in one).
apply_batch_max: Final = 100
# Bytes of each broker's log quoted when a wait fails.
diagnose_log_bytes: Final = 1500

# Set (to anything) to keep every cluster's directory after close.
keep_dir_env: Final = "GAZETTE_TEST_KEEP_CLUSTER_DIR"

# What a broker prints once it serves ("serving on <endpoint>", "http gateway on <url>").
_SERVING: Final = "serving"
_HTTP_GATEWAY: Final = "http gateway"

# A broker process that did not start, or did not exit in time (and other misuses of the cluster).
ProcessClusterError = ServedProcessError


class BrokerProcess(ServedProcess):
    """One ``gazette serve`` process (restartable: a restart is a new process, same identity)."""

    def __init__(self, zone: str, suffix: str, data_dir: Path, log_path: Path) -> None:
        super().__init__(f"broker {suffix}", log_path)
        self.zone = zone
        self.suffix = suffix
        self.data_dir = data_dir
        # "http://127.0.0.1:<port>" once ready ("" before; a restart gets a new port unless the
        # cluster keeps ports).
        self.endpoint = ""
        # The HTTP gateway's "http://127.0.0.1:<port>" ("" unless the cluster runs gateways).
        self.http_endpoint = ""
        # Ports to listen on at the next start (0: any free port).
        self.port = 0
        self.http_port = 0

    def __repr__(self) -> str:
        return f"BrokerProcess<{self.zone}#{self.suffix} {self.endpoint}>"

    @property
    def id(self) -> pb.ProcessSpec.ID:
        return pb.ProcessSpec.ID(zone=self.zone, suffix=self.suffix)


class ProcessCluster(AsyncLifecycle):
    """See the module docstring. Drive from one event loop; not safe for concurrent starts."""

    def __init__(
        self,
        brokers: Sequence[tuple[str, str]],
        *,
        root: str = DEFAULT_ROOT,
        lease_ttl_s: int = lease_ttl_s_default,
        extra_args: Sequence[str] = (),
        ready_timeout_s: float = ready_timeout_s_default,
        keep_dir: bool | None = None,
        http_gateway: bool = False,
        keep_ports: bool = False,
        env: Mapping[str, str] | None = None,
        etcd_args: Sequence[str] = (),
        durable_spools: bool = True,
    ) -> None:
        suffixes = [suffix for _, suffix in brokers]
        if len(set(suffixes)) != len(suffixes):
            raise ValueError(f"broker suffixes must be unique (got {suffixes})")
        for index, (zone, suffix) in enumerate(brokers):
            with at(f"brokers[{index}]"):
                validate_process_id(pb.ProcessSpec.ID(zone=zone, suffix=suffix))
        self.dir = Path(tempfile.mkdtemp(prefix="gazette-cluster-"))
        self.root = root
        self.lease_ttl_s = lease_ttl_s
        self.extra_args = list(extra_args)
        self.ready_timeout_s = ready_timeout_s
        # Keep the directory (broker logs, fragments) after close, to look into a failure.
        self.keep_dir = bool(os.environ.get(keep_dir_env)) if keep_dir is None else keep_dir
        self.http_gateway = http_gateway
        self.keep_ports = keep_ports
        self.env = dict(env or {})
        # False: brokers run without --data-dir (spools are unlinked scratch files, the
        # default of `gazette serve`), so a broker's exit loses what it has not persisted.
        self.durable_spools = durable_spools
        self.brokers = [
            BrokerProcess(zone, suffix, self.dir / suffix, self.dir / f"{suffix}.log")
            for zone, suffix in brokers
        ]
        self.etcd = EtcdServer(self.dir / "etcd", extra_args=etcd_args)
        self.ks: KeySpace[Decoded] = new_keyspace(root)
        self._admin: EtcdBackend | None = None
        self._watch: asyncio.Task[None] | None = None
        self._clients: list[JournalClient] = []

    # --- Layout ---

    @property
    def fragments_dir(self) -> Path:
        """Where the shared ``file://`` store keeps fragment files (``store_url`` maps here)."""
        return self.dir / "fragments"

    @property
    def store_url(self) -> str:
        """The fragment store URL for journal specs: brokers run with ``--file-root`` = dir."""
        return "file:///fragments/"

    def broker(self, suffix: str) -> BrokerProcess:
        for b in self.brokers:
            if b.suffix == suffix:
                return b
        raise KeyError(f"no broker {suffix!r} in the cluster")

    def running(self) -> list[BrokerProcess]:
        return [b for b in self.brokers if b.running]

    # --- Lifecycle ---

    async def start(self) -> None:
        """Start etcd, the mirror and every broker; return once all brokers serve."""
        self.fragments_dir.mkdir(parents=True, exist_ok=True)
        await self.etcd.start()
        self._admin = EtcdBackend([self.etcd.endpoint])
        await self.ks.load(self._admin)
        self._watch = asyncio.create_task(self.ks.watch(self._admin), name="cluster mirror")
        await asyncio.gather(*(self.start_broker(b) for b in self.brokers))

    async def start_broker(self, b: BrokerProcess) -> None:
        """(Re)start ``b`` and wait until it serves. Its member key is then in etcd."""
        if b.running:
            raise ProcessClusterError(f"broker {b.suffix}: already running")
        b.data_dir.mkdir(parents=True, exist_ok=True)
        if self.keep_ports and not b.port:
            b.port = reserve_port()
            if self.http_gateway:
                b.http_port = reserve_port()
        args = [
            *("serve", "--zone", b.zone, "--id", b.suffix, "--host", "127.0.0.1"),
            *("--port", str(b.port)),
            *(("--http-port", str(b.http_port)) if self.http_gateway else ()),
            *("--etcd", self.etcd.endpoint, "--root", self.root),
            *("--file-root", str(self.dir)),
            *(("--data-dir", str(b.data_dir)) if self.durable_spools else ()),
            *("--lease-ttl", str(self.lease_ttl_s)),
            *self.extra_args,
        ]
        if not self.keep_ports:
            b.endpoint = b.http_endpoint = ""  # Unknown until it prints them.
        printed = await b.spawn(
            ["-c", "from broker.serve_cli import main; main()", *args],
            expect=(_SERVING, _HTTP_GATEWAY) if self.http_gateway else (_SERVING,),
            ready_timeout_s=self.ready_timeout_s,
            env=self.env,
        )
        b.endpoint = printed[_SERVING]
        b.http_endpoint = printed.get(_HTTP_GATEWAY, "")

    async def kill(self, b: BrokerProcess) -> None:
        """kill -9 ``b`` (no hand-off, no persisting, lease left to expire); wait for it."""
        await b.kill()

    def pause(self, b: BrokerProcess) -> None:
        """SIGSTOP ``b``: it answers nothing (its sockets stay open) and its lease is not
        renewed, but it does not know; ``resume`` wakes it as a zombie."""
        b.pause()

    def resume(self, b: BrokerProcess) -> None:
        """SIGCONT a broker paused with ``pause`` (a no-op if it has exited meanwhile)."""
        b.resume()

    async def terminate(
        self, b: BrokerProcess, timeout_s: float = exit_timeout_s_default
    ) -> tuple[int, float]:
        """SIGTERM ``b`` and wait for it to exit: (exit code, seconds it took). Kills it and
        raises ProcessClusterError if it is still running after ``timeout_s``."""
        started = time.monotonic()
        code = await b.terminate(timeout_s)
        return code, time.monotonic() - started

    async def restart(self, b: BrokerProcess) -> None:
        """Kill ``b`` if it runs, then start it again (same identity and data dir)."""
        await self.kill(b)
        await self.start_broker(b)

    def kill_all_now(self) -> None:
        """SIGKILL every broker still running, synchronously (for teardown paths)."""
        for b in self.brokers:
            b.kill_now()

    async def close(self) -> None:
        """Kill every broker, close clients, stop etcd and remove the cluster's directory."""
        try:
            for b in self.brokers:
                await self.kill(b)
            for client in self._clients:
                await client.close()
            if self._watch is not None:
                self._watch.cancel()
                await asyncio.gather(self._watch, return_exceptions=True)
            if self._admin is not None:
                await self._admin.close()
            await self.etcd.close()
        finally:
            self.kill_all_now()
            if not self.keep_dir:
                shutil.rmtree(self.dir, ignore_errors=True)

    # --- Clients and journals ---

    def client(self, via: BrokerProcess | None = None, *, zone: str = "") -> JournalClient:
        """A JournalClient whose default broker is ``via`` (else the first running broker).
        Closed with the cluster."""
        running = self.running()
        if via is None and not running:
            raise ProcessClusterError("no broker is running")
        target = via if via is not None else running[0]
        client = JournalClient(target.endpoint, zone=zone)
        self._clients.append(client)
        return client

    async def apply(self, specs: Iterable[pb.JournalSpec]) -> None:
        """Create (or update) journals through the Apply RPC, in batches."""
        changes = [upsert(spec, expect_mod_revision=-1) for spec in specs]
        client = self.client()
        for start in range(0, len(changes), apply_batch_max):
            await apply_journals(client, changes[start : start + apply_batch_max])

    # --- Waiting on the mirror ---

    async def wait_until(self, condition: Condition, timeout_s: float = 30.0) -> float:
        """``cluster_state.wait_until`` over the cluster's mirror; a timeout reports each
        broker's state and last log lines."""
        return await wait_until(self.ks, condition, timeout_s, diagnose=self.diagnose)

    async def diagnose(self) -> str:
        """What a failed wait should report: the mirror's revision against etcd's, and each
        broker's state and last log lines."""
        lines = [f"cluster mirror at revision {self.ks.header.revision}"]
        if self._admin is not None:
            with contextlib.suppress(Exception):
                resp = await self._admin.range(self.root.encode())
                lines[0] += f"; etcd at revision {resp.header.revision}"
        for b in self.brokers:
            state = "running" if b.running else f"exited ({b.process and b.process.returncode})"
            lines.append(f"--- {b.zone}#{b.suffix} {b.endpoint} {state}; log tail:")
            lines.append(b.log_tail()[-diagnose_log_bytes:])
        return "\n".join(lines)

    def route(self, journal: str) -> pb.Route:
        """The journal's current route (members sorted, primary index, endpoints attached)."""
        return route_of(self.ks, self.root, journal)

    def primary(self, journal: str) -> BrokerProcess | None:
        route = self.route(journal)
        if route.primary < 0:
            return None
        return self.broker(route.members[route.primary].suffix)

    def journals_ready(
        self,
        journals: Sequence[str],
        replication: int,
        *,
        zones_min: int = 1,
        exclude: Sequence[str] = (),
    ) -> Condition:
        """``cluster_state.journals_ready`` over the cluster's mirror."""
        return journals_ready(
            self.ks, self.root, journals, replication, zones_min=zones_min, exclude=exclude
        )

    def member_gone(self, b: BrokerProcess) -> Condition:
        """A condition: ``b``'s member key is no longer in etcd (lease expired or revoked)."""
        return member_gone(self.ks, self.root, b.zone, b.suffix)
