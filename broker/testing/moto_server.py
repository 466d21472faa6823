"""A real S3 endpoint for tests: moto's server mode, run as a child process on loopback.

The S3 store is tested against a real HTTP server rather than patched clients, so that request
signing, path-style addressing, presigned URLs, pagination and multipart uploads all run for
real. moto keeps objects in memory; each test makes its own bucket.

Usage (synchronous, so that a session-scoped fixture can share one server)::

    with MotoServer() as moto:
        moto.create_bucket("my-bucket")
        store_url = f"s3://my-bucket/prefix/?endpoint={moto.endpoint}&region={moto.region}"

Clients need credentials; any will do. `credentials_env()` returns an environment to apply
(e.g. with pytest's monkeypatch) that also hides the host's ~/.aws configuration.

An outage of the store, for soak tests: `pause()` stops the server with SIGSTOP (connections
are still accepted by the kernel, but no request is answered: clients time out, as against a
hung endpoint) and `resume()` continues it with its objects. `stop()` then `start()` would
lose every object (moto keeps them in memory) and move the server to another port, so it is no
way to simulate an outage of a store that keeps its data.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

import boto3

# How long moto may take to import and start serving.
ready_timeout_s_default = 30.0
ready_poll_interval_s = 0.05
# Per-probe HTTP timeout while waiting for readiness.
probe_timeout_s = 1.0
stop_timeout_s = 10.0
# A free port may be taken by another process before moto binds it; retry with a new port.
start_attempts_max = 3
log_tail_bytes = 4000

REGION = "us-east-1"


class MotoServerError(RuntimeError):
    """The moto test server could not be started or did not become ready."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def credentials_env() -> dict[str, str]:
    """Environment for S3 clients of the moto server: dummy credentials, the test region, and
    no shared config files (a developer's real profiles must never be picked up)."""
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }


class MotoServer:
    """One moto server process on 127.0.0.1."""

    def __init__(self, *, ready_timeout_s: float = ready_timeout_s_default) -> None:
        self._ready_timeout_s = ready_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._port = 0
        self._paused = False
        self._log_dir = Path(tempfile.mkdtemp(prefix="gazette-moto-"))

    @property
    def log_path(self) -> Path:
        return self._log_dir / "moto.log"

    @property
    def region(self) -> str:
        return REGION

    @property
    def endpoint(self) -> str:
        """`http://127.0.0.1:<port>` (valid once started)."""
        if self._port == 0:
            raise MotoServerError("moto server: endpoint is unknown until start()")
        return f"http://127.0.0.1:{self._port}"

    def start(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            raise MotoServerError("moto server: already running")
        for attempt in range(1, start_attempts_max + 1):
            self._port = _free_port()
            try:
                self._start_once()
                return
            except MotoServerError:
                if attempt == start_attempts_max:
                    raise

    def _start_once(self) -> None:
        env = {**os.environ, **credentials_env()}
        # Output to a file, not a pipe: nobody drains a pipe while tests run.
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self._port)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        proc = self._proc
        if proc is None:
            raise MotoServerError("moto server: not started")
        deadline = time.monotonic() + self._ready_timeout_s
        while True:
            if proc.poll() is not None:
                raise MotoServerError(
                    f"moto server exited with status {proc.returncode} during startup:\n"
                    + self._log_tail()
                )
            if time.monotonic() > deadline:
                raise MotoServerError(
                    f"moto server did not become ready within {self._ready_timeout_s}s:\n"
                    + self._log_tail()
                )
            try:
                # moto's own API endpoint answers once the server is serving requests.
                with urllib.request.urlopen(
                    self.endpoint + "/moto-api/", timeout=probe_timeout_s
                ) as resp:
                    resp.read()
                return
            except (urllib.error.URLError, OSError):
                time.sleep(ready_poll_interval_s)

    @property
    def paused(self) -> bool:
        return self._paused

    def pause(self) -> None:
        """SIGSTOP the server: requests hang until `resume()` (see the module docstring)."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            raise MotoServerError("moto server: not running")
        proc.send_signal(signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        """SIGCONT a paused server; it answers again, with every object it held."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
        self._paused = False

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if moto has not exited in time."""
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
        shutil.rmtree(self._log_dir, ignore_errors=True)

    def client(self) -> Any:
        """A boto3 S3 client of this server (for test setup: buckets, raw objects)."""
        return boto3.session.Session(
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name=REGION,
        ).client("s3", endpoint_url=self.endpoint)

    def create_bucket(self, name: str) -> None:
        client = self.client()
        client.create_bucket(Bucket=name)
        client.close()

    def store_url(self, bucket: str, prefix: str = "") -> str:
        """An s3:// fragment store URL of `bucket` on this server."""
        return f"s3://{bucket}/{prefix}?endpoint={self.endpoint}&region={REGION}"

    def __enter__(self) -> MotoServer:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _log_tail(self) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError as err:
            return f"(no moto log: {err})"
        return data[-log_tail_bytes:].decode(errors="replace")
