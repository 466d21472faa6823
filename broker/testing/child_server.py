"""A test server run as a child process on a loopback port: started, probed until it answers
HTTP, stopped with SIGTERM then SIGKILL, paused with SIGSTOP. The storage emulators of
`moto_server`, `gcs_emulator` and `azurite` are built on it.

Output goes to a log file, not a pipe (nobody drains a pipe while tests run); its tail is part
of every startup error.
"""

from __future__ import annotations

import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from broker.testing.lifecycle import Lifecycle
from broker.testing.ports import free_port

# How long a server may take to start serving.
ready_timeout_s_default = 30.0
ready_poll_interval_s = 0.05
# Per-probe HTTP timeout while waiting for readiness.
probe_timeout_s = 1.0
stop_timeout_s = 10.0
# A free port may be taken by another process before the server binds it; retry with another.
start_attempts_max = 3
log_tail_bytes = 4000


class ChildServerError(RuntimeError):
    """A test server could not be started or did not become ready."""


class ChildServer(Lifecycle):
    """Subclasses say how to run the server on a port (`command`) and what answers once it
    serves (`probe_path`: any HTTP status counts, even an error, as long as it answers), and
    may raise their own subclass of ChildServerError (`error`)."""

    name = "server"
    probe_path = "/"
    error: type[ChildServerError] = ChildServerError

    def __init__(self, *, ready_timeout_s: float = ready_timeout_s_default) -> None:
        self._ready_timeout_s = ready_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._port = 0
        self._paused = False
        self._dir = Path(tempfile.mkdtemp(prefix=f"gazette-{self.name}-"))

    # --- To override ------------------------------------------------------------------------

    def command(self, port: int) -> Sequence[str]:
        raise NotImplementedError

    def env(self) -> Mapping[str, str]:
        return os.environ

    def probe_ssl_context(self) -> ssl.SSLContext | None:
        """For an HTTPS server: the context that trusts its certificate."""
        return None

    # --- Lifecycle --------------------------------------------------------------------------

    @property
    def work_dir(self) -> Path:
        """A private directory of the server (its log, any data), removed at close()."""
        return self._dir

    @property
    def log_path(self) -> Path:
        return self._dir / f"{self.name}.log"

    @property
    def port(self) -> int:
        if self._port == 0:
            raise self.error(f"{self.name}: port is unknown until start()")
        return self._port

    @property
    def endpoint(self) -> str:
        """`http://127.0.0.1:<port>` (valid once started)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            raise self.error(f"{self.name}: already running")
        for attempt in range(1, start_attempts_max + 1):
            self._port = free_port()
            try:
                self._start_once()
                return
            except self.error:
                if attempt == start_attempts_max:
                    raise

    def _start_once(self) -> None:
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                list(self.command(self._port)),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=dict(self.env()),
                cwd=self._dir,
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        proc = self._proc
        if proc is None:
            raise self.error(f"{self.name}: not started")
        deadline = time.monotonic() + self._ready_timeout_s
        while True:
            if proc.poll() is not None:
                raise self.error(
                    f"{self.name} exited with status {proc.returncode} during startup:\n"
                    + self._log_tail()
                )
            if time.monotonic() > deadline:
                raise self.error(
                    f"{self.name} did not become ready within {self._ready_timeout_s}s:\n"
                    + self._log_tail()
                )
            try:
                with urllib.request.urlopen(
                    self.endpoint + self.probe_path,
                    timeout=probe_timeout_s,
                    context=self.probe_ssl_context(),
                ) as resp:
                    resp.read()
                return
            except urllib.error.HTTPError as err:
                err.close()
                return  # It answers: it serves.
            except (urllib.error.URLError, OSError):
                # Not listening yet; polled, as a child's readiness has no event to wait on.
                time.sleep(ready_poll_interval_s)

    @property
    def paused(self) -> bool:
        return self._paused

    def pause(self) -> None:
        """SIGSTOP the server: connections are still accepted by the kernel, but no request is
        answered (clients time out, as against a hung endpoint) until `resume()`."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            raise self.error(f"{self.name}: not running")
        proc.send_signal(signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        """SIGCONT a paused server; it answers again, with whatever it held."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
        self._paused = False

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if the server has not exited in time."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        if self._paused:
            self.resume()  # A stopped process would not act on SIGTERM.
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(stop_timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _log_tail(self) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError as err:
            return f"(no {self.name} log: {err})"
        return data[-log_tail_bytes:].decode(errors="replace")
