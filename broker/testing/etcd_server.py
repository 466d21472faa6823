"""A real, single-node etcd server for tests: started on loopback with a throwaway data dir.

Tests of the etcd backend (and anything built over it) must run against the real thing, because
the point is to match etcd's behaviour, not our idea of it. ``EtcdServer`` runs ``etcd`` as a
child process, waits until it serves linearizable reads, and can stop, restart (same data dir and
ports, so clients reconnect to the same address and find their data) or kill -9 it, to break
clients' connections on purpose.

Usage::

    async with EtcdServer() as etcd:
        backend = EtcdBackend([etcd.endpoint])

With ``tls`` (``EtcdServerTls``), etcd serves TLS (``url`` is ``https://...``), and with a client
CA it requires client certificates (``--client-cert-auth``). ``enable_auth`` turns etcd's user
and password authentication on, for its root user.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import grpc
import grpc.aio

from broker.keyspace.etcdpb import rpc_pb2, rpc_pb2_grpc
from broker.testing.lifecycle import AsyncLifecycle
from broker.testing.ports import free_port
from broker.tls import ClientTls

# How long a fresh or restarted etcd may take to elect itself leader and serve reads.
ready_timeout_s_default = 30.0
# Interval between readiness probes; readiness has no push notification to wait on.
ready_poll_interval_s = 0.05
# How long etcd may take to exit on SIGTERM before it is killed.
stop_timeout_s_default = 10.0
# A fresh start picks free ports that another process may grab before etcd binds them; retry
# with new ports this many times.
start_attempts_max = 3
# Bytes of etcd's log quoted in errors.
log_tail_bytes = 4000


# gRPC's default reconnect backoff starts at 1 s; probing a starting server wants it short.
_probe_options = [
    ("grpc.initial_reconnect_backoff_ms", 20),
    ("grpc.min_reconnect_backoff_ms", 20),
    ("grpc.max_reconnect_backoff_ms", 200),
]


@dataclass(frozen=True)
class EtcdServerTls:
    """etcd's server certificate and key (PEM files); with ``client_ca_file``, client
    certificates signed by it are required. ``probe`` is what this harness dials etcd with."""

    cert_file: str
    key_file: str
    probe: ClientTls
    client_ca_file: str | None = None


class EtcdServerError(RuntimeError):
    """The etcd test server could not be started or did not become ready."""


class EtcdNotInstalledError(EtcdServerError):
    """No ``etcd`` binary on PATH."""

    def __init__(self) -> None:
        super().__init__(
            "etcd binary not found on PATH: run `make system-deps` (installs Debian's etcd-server)"
        )


class EtcdServer(AsyncLifecycle):
    """One etcd process on 127.0.0.1. Not safe to drive from several tasks at once."""

    def __init__(
        self,
        data_dir: Path | None = None,
        *,
        ready_timeout_s: float = ready_timeout_s_default,
        stop_timeout_s: float = stop_timeout_s_default,
        tls: EtcdServerTls | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        binary = shutil.which("etcd")
        if binary is None:
            raise EtcdNotInstalledError()
        self._binary = binary
        self._owns_dir = data_dir is None
        self._root = (
            Path(tempfile.mkdtemp(prefix="gazette-etcd-")) if data_dir is None else data_dir
        )
        self._ready_timeout_s = ready_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._proc: asyncio.subprocess.Process | None = None
        self._client_port = 0
        self._peer_port = 0
        self._tls = tls
        # More etcd flags (e.g. ``--quota-backend-bytes``), after the harness's own.
        self._extra_args = list(extra_args)
        # The root user's password once enable_auth() ran (the readiness probe then signs in).
        self._root_password = ""
        # True between pause() (SIGSTOP) and resume() (SIGCONT).
        self._paused = False

    @property
    def data_dir(self) -> Path:
        return self._root / "data"

    @property
    def log_path(self) -> Path:
        return self._root / "etcd.log"

    @property
    def endpoint(self) -> str:
        """``host:port`` of the client listener (valid once started; kept across restarts)."""
        if self._client_port == 0:
            raise EtcdServerError("etcd server: endpoint is unknown until start()")
        return f"127.0.0.1:{self._client_port}"

    @property
    def url(self) -> str:
        """The client endpoint with its scheme: ``https://host:port`` when serving TLS."""
        return f"{'https' if self._tls else 'http'}://{self.endpoint}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def start(self) -> None:
        """Start etcd and wait until it serves reads. A first start picks free ports; later
        starts (after stop() or kill()) reuse them, with the same data dir."""
        if self.running:
            raise EtcdServerError("etcd server: already running")
        fresh = self._client_port == 0
        attempts = start_attempts_max if fresh else 1
        for attempt in range(1, attempts + 1):
            if fresh:
                self._client_port, self._peer_port = free_port(), free_port()
                if attempt > 1:
                    # The failed attempt may have recorded its peer URL in the data dir.
                    shutil.rmtree(self.data_dir, ignore_errors=True)
            try:
                await self._start_once()
                return
            except EtcdServerError:
                if attempt == attempts:
                    raise

    def pause(self) -> None:
        """SIGSTOP etcd: the kernel still accepts connections, but no request is answered
        (clients time out, as against a hung etcd) until `resume()`."""
        proc = self._proc
        if proc is None or proc.returncode is not None:
            raise EtcdServerError("etcd server: not running")
        proc.send_signal(signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        """SIGCONT a paused etcd (a no-op if it is not running)."""
        proc = self._proc
        if proc is not None and proc.returncode is None:
            proc.send_signal(signal.SIGCONT)
        self._paused = False

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL if etcd has not exited within the stop timeout."""
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        if self._paused:
            self.resume()  # A stopped process would not act on SIGTERM.
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), self._stop_timeout_s)
        except TimeoutError:
            await self.kill()

    async def kill(self) -> None:
        """kill -9: no graceful shutdown, as in a machine crash (minus unsynced writes)."""
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        proc.kill()
        await proc.wait()

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    async def close(self) -> None:
        """Stop etcd and remove the temporary directory, if this server created it."""
        await self.stop()
        if self._owns_dir:
            shutil.rmtree(self._root, ignore_errors=True)

    async def enable_auth(self, root_password: str) -> None:
        """Turn on user and password authentication, with user root (etcd's admin)."""
        async with self._channel() as channel:
            auth = rpc_pb2_grpc.AuthStub(channel)
            await auth.UserAdd(rpc_pb2.AuthUserAddRequest(name="root", password=root_password))
            await auth.RoleAdd(rpc_pb2.AuthRoleAddRequest(name="root"))
            await auth.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="root", role="root"))
            await auth.AuthEnable(rpc_pb2.AuthEnableRequest())
        self._root_password = root_password

    def _channel(self) -> grpc.aio.Channel:
        if self._tls is None:
            return grpc.aio.insecure_channel(self.endpoint, options=_probe_options)
        credentials = self._tls.probe.credentials()
        return grpc.aio.secure_channel(self.endpoint, credentials, options=_probe_options)

    def _tls_args(self) -> list[str]:
        tls = self._tls
        if tls is None:
            return []
        args = [f"--cert-file={tls.cert_file}", f"--key-file={tls.key_file}"]
        if tls.client_ca_file:
            args += ["--client-cert-auth", f"--trusted-ca-file={tls.client_ca_file}"]
        return args

    def _args(self) -> list[str]:
        client = self.url
        peer = f"http://127.0.0.1:{self._peer_port}"
        name = "gazette-test"
        return [
            self._binary,
            f"--name={name}",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster={name}={peer}",
            # A single node elects itself; short timers make that (and restarts) fast.
            "--heartbeat-interval=10",
            "--election-timeout=100",
            "--logger=zap",
            "--log-outputs=stderr",
            *self._tls_args(),
            *self._extra_args,
        ]

    async def _start_once(self) -> None:
        # etcd's output goes to a file, not a pipe: nobody drains a pipe while tests run, and a
        # full pipe would block etcd.
        with self._open_log() as log:
            self._proc = await asyncio.create_subprocess_exec(
                *self._args(),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        try:
            await self._wait_ready()
        except BaseException:
            await self.kill()
            raise

    async def _wait_ready(self) -> None:
        proc = self._proc
        assert proc is not None
        deadline = time.monotonic() + self._ready_timeout_s
        async with self._channel() as channel:
            kv = rpc_pb2_grpc.KVStub(channel)
            auth = rpc_pb2_grpc.AuthStub(channel)
            while True:
                if proc.returncode is not None:
                    raise EtcdServerError(
                        f"etcd exited with status {proc.returncode} during startup:\n"
                        + self._log_tail()
                    )
                remaining_s = deadline - time.monotonic()
                if remaining_s <= 0:
                    raise EtcdServerError(
                        f"etcd did not become ready within {self._ready_timeout_s}s:\n"
                        + self._log_tail()
                    )
                try:
                    metadata: list[tuple[str, str]] = []
                    if self._root_password:
                        signed_in = await auth.Authenticate(
                            rpc_pb2.AuthenticateRequest(name="root", password=self._root_password),
                            timeout=min(1.0, remaining_s),
                            wait_for_ready=True,
                        )
                        metadata.append(("token", signed_in.token))
                    # A linearizable read succeeds only once there is a leader and the server
                    # applies requests: exactly "ready" for tests.
                    await kv.Range(
                        rpc_pb2.RangeRequest(key=b"\x00"),
                        timeout=min(1.0, remaining_s),
                        wait_for_ready=True,
                        metadata=metadata,
                    )
                    return
                except grpc.aio.AioRpcError:
                    pass
                await asyncio.sleep(ready_poll_interval_s)

    def _open_log(self) -> BinaryIO:
        self._root.mkdir(parents=True, exist_ok=True)
        # The caller closes it (`with`); etcd keeps its own descriptor.
        return open(self.log_path, "ab")

    def _log_tail(self) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError as err:
            return f"(no etcd log: {err})"
        return data[-log_tail_bytes:].decode(errors="replace")
