"""A ``gazette-consumer serve`` process, for tests and soaks that kill and restart consumers.

``ConsumerProcess`` runs one consumer process of an Application against a real etcd and broker
cluster (``ProcessCluster``), restartable under the same identity (zone, ID) and, with
``keep_port``, on the same port: a restart is a new process with the same arguments, as a
supervisor would make. Readiness is an event: the process is ready once it printed ``serving
on <endpoint>`` (its member key is then in etcd). Its log (stderr, then its stdout once ready)
goes to ``log_path``, appended across restarts.

Usage::

    consumer = ConsumerProcess(
        "zone-a", "consumer-1", app="examples.counter:Counter", etcd=cluster.etcd.endpoint,
        broker=cluster.brokers[0].endpoint, root="/gazette/consumers/x", data_dir=tmp / "c1",
    )
    await consumer.start()
    await consumer.kill()          # kill -9
    await consumer.start()         # same identity (and port, with keep_port)
    code = await consumer.terminate()  # SIGTERM: shards handed off, exit 0
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from broker.testing.process_cluster import (
    PACKAGE_PARENT,
    ProcessClusterError,
    reserve_port,
)

# A consumer process that has not printed its endpoint this long after starting failed to start.
ready_timeout_s_default: Final = 60.0
# A SIGTERM'd consumer still running after this long is killed, and terminate() raises.
exit_timeout_s_default: Final = 60.0
# Bytes of a consumer's log quoted in errors.
log_tail_bytes: Final = 4000

_SERVING: Final = "serving on "


class ConsumerProcess:
    """One ``gazette-consumer serve`` process (see the module docstring). Drive it from one
    event loop, one call at a time."""

    def __init__(
        self,
        zone: str,
        suffix: str,
        *,
        app: str,
        etcd: str,
        broker: str,
        root: str,
        data_dir: Path,
        lease_ttl_s: int = 3,
        drain_timeout_s: float = 10.0,
        keep_port: bool = True,
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
        ready_timeout_s: float = ready_timeout_s_default,
    ) -> None:
        self.zone = zone
        self.suffix = suffix
        self.app = app
        self.etcd = etcd
        self.broker = broker.removeprefix("http://")
        self.root = root
        self.data_dir = data_dir
        self.log_path = data_dir.parent / f"{suffix}.log"
        self.lease_ttl_s = lease_ttl_s
        self.drain_timeout_s = drain_timeout_s
        self.keep_port = keep_port
        self.env = dict(env or {})
        self.extra_args = list(extra_args)
        self.ready_timeout_s = ready_timeout_s
        # "http://127.0.0.1:<port>" once ready.
        self.endpoint = ""
        self.port = 0
        self.process: asyncio.subprocess.Process | None = None
        self.starts = 0
        self.paused = False
        self._drain: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.returncode

    def args(self) -> list[str]:
        return [
            *("serve", "--app", self.app, "--etcd", self.etcd, "--root", self.root),
            *("--zone", self.zone, "--id", self.suffix, "--host", "127.0.0.1"),
            *("--port", str(self.port), "--broker", self.broker),
            *("--lease-ttl", str(self.lease_ttl_s), "--drain-timeout", str(self.drain_timeout_s)),
            *("--data-dir", str(self.data_dir)),
            *self.extra_args,
        ]

    async def start(self) -> None:
        """Start the process and wait until it serves (its member key is in etcd)."""
        if self.running:
            raise ProcessClusterError(f"consumer {self.suffix}: already running")
        if self.keep_port and not self.port:
            self.port = reserve_port()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.env}
        # The child imports the same code as this process (and the `examples` package beside it).
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [PACKAGE_PARENT, env.get("PYTHONPATH")]))
        with self.log_path.open("ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "gazette_consumer.runner",
                *self.args(),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,  # A file: an unread pipe would fill with logs and stall it.
                env=env,
                cwd=PACKAGE_PARENT,
            )
        self.starts += 1
        self.paused = False
        self.endpoint = ""
        stdout = self.process.stdout
        assert stdout is not None
        try:
            async with asyncio.timeout(self.ready_timeout_s):
                while True:
                    raw = await stdout.readline()
                    if raw:
                        with self.log_path.open("ab") as log:
                            log.write(b"[stdout] " + raw)
                    line = raw.decode(errors="replace").strip()
                    if not raw:
                        code = await self.process.wait()
                        raise ProcessClusterError(f"exited with status {code} before serving")
                    if line.startswith(_SERVING):
                        self.endpoint = line[len(_SERVING) :]
                        break
        except (TimeoutError, ProcessClusterError) as err:
            await self.kill()
            raise ProcessClusterError(
                f"consumer {self.suffix} did not start ({err or 'timed out'}):\n{self.log_tail()}"
            ) from err
        except BaseException:
            await self.kill()
            raise
        self._drain = asyncio.create_task(self._drain_stdout(), name=f"{self.suffix} stdout")

    async def kill(self) -> None:
        """kill -9 (no hand-off, nothing flushed); wait for it to exit."""
        proc = self.process
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()
        self.paused = False
        await self._reap()

    async def terminate(self, timeout_s: float = exit_timeout_s_default) -> int:
        """SIGTERM and wait for the exit code; killed, and ProcessClusterError raised, if it is
        still running after ``timeout_s``."""
        proc = self.process
        if proc is None or proc.returncode is not None:
            raise ProcessClusterError(f"consumer {self.suffix}: not running")
        proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(timeout_s):
                code = await proc.wait()
        except TimeoutError:
            await self.kill()
            raise ProcessClusterError(
                f"consumer {self.suffix} still running {timeout_s}s after SIGTERM:\n"
                + self.log_tail()
            ) from None
        await self._reap()
        return code

    def kill_now(self) -> None:
        """SIGKILL synchronously (for teardown paths)."""
        proc = self.process
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()

    def log_tail(self, size: int = log_tail_bytes) -> str:
        try:
            return self.log_path.read_bytes()[-size:].decode(errors="replace")
        except OSError as err:
            return f"(no log: {err})"

    async def _drain_stdout(self) -> None:
        proc = self.process
        assert proc is not None and proc.stdout is not None
        with self.log_path.open("ab") as log:
            while line := await proc.stdout.readline():
                log.write(b"[stdout] " + line)
                log.flush()

    async def _reap(self) -> None:
        task, self._drain = self._drain, None
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
