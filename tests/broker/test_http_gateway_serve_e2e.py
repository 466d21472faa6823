"""`gazette serve --http-port 0` as a real process on the embedded keyspace, driven by a real
HTTP client (curl where installed, else urllib): PUT a file, GET it back byte for byte, the
debug endpoints; and with --auth-keys, the same with tokens (and gazctl signing its own)."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from broker.auth import APPEND, READ, Claims, KeyedAuth
from broker.testing.ports import free_port

# Upper bound on any one step; each takes well under a second.
step_timeout_s = 30
# A new journal is assigned by the broker's allocator within moments of being applied; until
# then a PUT is answered 503 (and appends nothing), so the first PUT is retried this long.
assignment_wait_s = 20.0

CURL = shutil.which("curl")


def _http(
    method: str, url: str, body_file: Path | None = None, token: str = ""
) -> tuple[int, bytes]:
    """(status, body) of one request, through curl if there is one."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if CURL is not None:
        args = [CURL, "-sS", "-X", method, "-o", "-", "-w", "\n%{http_code}", url]
        if body_file is not None:
            args += ["--data-binary", f"@{body_file}"]
        for name, value in headers.items():
            args += ["-H", f"{name}: {value}"]
        done = subprocess.run(args, capture_output=True, timeout=step_timeout_s, check=True)
        body, _, code = done.stdout.rpartition(b"\n")
        return int(code), body
    data = body_file.read_bytes() if body_file is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=step_timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


@contextlib.contextmanager
def _served(tmp_path: Path, env: dict[str, str]) -> Iterator[tuple[str, str]]:
    """A `gazette serve` process: yields its gRPC endpoint and HTTP gateway URL."""
    log = (tmp_path / "broker.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from broker.serve_cli import main; main()",
            "serve",
            "--port",
            str(free_port()),
            "--http-port",
            "0",
            "--data-dir",
            str(tmp_path),
            "--file-root",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=log,  # A file: a pipe nobody reads would fill up and stall the broker.
        env=dict(os.environ, **env),
    )
    assert proc.stdout is not None
    try:
        grpc_line = proc.stdout.readline().decode()
        http_line = proc.stdout.readline().decode()
        assert grpc_line.startswith("serving on http://"), (tmp_path / "broker.log").read_text()
        assert http_line.startswith("http gateway on http://"), http_line
        yield grpc_line.split()[-1], http_line.split()[-1]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=step_timeout_s) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=step_timeout_s)
        proc.stdout.close()
        log.close()


def _gazctl(grpc_endpoint: str, *args: str, env: dict[str, str] | None = None) -> bytes:
    done = subprocess.run(
        [sys.executable, "-m", "broker.cli.gazctl", *args],
        env=dict(os.environ, BROKER_ADDRESS=grpc_endpoint, **(env or {})),
        capture_output=True,
        timeout=step_timeout_s,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout


def _apply(tmp_path: Path, grpc_endpoint: str, env: dict[str, str] | None = None) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(
        "name: http/\nreplication: 1\n"
        "fragment: {length: 1048576, compression_codec: NONE, refresh_interval: 30s}\n"
        "children: [{name: http/events}]\n"
    )
    _gazctl(grpc_endpoint, "journals", "apply", "-f", str(space), env=env)


def _put_once_assigned(url: str, upload: Path, token: str = "") -> tuple[int, bytes]:
    deadline = time.monotonic() + assignment_wait_s
    while True:
        status, body = _http("PUT", url, upload, token)
        if status != 503 or time.monotonic() > deadline:
            return status, body
        time.sleep(0.1)  # No event to await across processes: the allocator's assignment.


def test_put_a_file_and_get_it_back(tmp_path: Path) -> None:
    with _served(tmp_path, {}) as (grpc_endpoint, http):
        _put_and_get(tmp_path, grpc_endpoint, http)


def _put_and_get(tmp_path: Path, grpc_endpoint: str, http: str) -> None:
    status, body = _http("GET", f"{http}/debug/ready")
    assert (status, body) == (200, b"ready\n")
    _apply(tmp_path, grpc_endpoint)

    content = b"".join(b"%06d some event\n" % i for i in range(20_000)) + bytes(range(256))
    upload = tmp_path / "upload.bin"
    upload.write_bytes(content)
    status, body = _put_once_assigned(f"{http}/http/events", upload)
    assert status == 200, body
    commit = json.loads(body)
    assert (commit["begin"], commit["end"]) == (0, len(content))

    status, body = _http("GET", f"{http}/http/events?offset=0&block=false")
    assert status == 206 and body == content
    status, body = _http("GET", f"{http}/http/events?offset=-1&block=false")
    assert (status, body) == (416, b"OFFSET_NOT_YET_AVAILABLE\n")
    status, body = _http("GET", f"{http}/http/nope?block=false")
    assert (status, body) == (404, b"JOURNAL_NOT_FOUND\n")
    status, body = _http("GET", f"{http}/http/events?offset=x")
    assert status == 400 and b"offset: must be an integer" in body

    status, body = _http("GET", f"{http}/debug/metrics")
    assert status == 200
    assert b'gazette_appends_total{status="OK"} 1.0' in body


def test_with_auth_keys_every_request_needs_a_token(tmp_path: Path) -> None:
    key = b"e2e key for the gateway test, 32B"
    keys = {"GAZETTE_AUTH_KEYS": base64.b64encode(key).decode()}
    signer = KeyedAuth([key])
    with _served(tmp_path, keys) as (grpc_endpoint, http):
        _apply(tmp_path, grpc_endpoint, env=keys)  # gazctl signs with the keys it is given.
        upload = tmp_path / "upload.bin"
        upload.write_bytes(b"authorized\n")
        reader = signer.sign(Claims(READ), 600)
        writer = signer.sign(Claims(APPEND), 600)

        status, body = _put_once_assigned(f"{http}/http/events", upload)
        assert status == 401 and b"UNAUTHENTICATED" in body
        status, body = _put_once_assigned(f"{http}/http/events", upload, reader)
        assert status == 403 and b"missing required APPEND capability" in body
        status, body = _put_once_assigned(f"{http}/http/events", upload, writer)
        assert status == 200, body
        status, body = _http("GET", f"{http}/http/events?block=false", token=reader)
        assert (status, body) == (206, b"authorized\n")

        read = _gazctl(grpc_endpoint, "journals", "read", "-j", "http/events", env=keys)
        assert read == b"authorized\n"
        # The debug endpoints are the operator's, and need no token.
        assert _http("GET", f"{http}/debug/ready")[0] == 200
