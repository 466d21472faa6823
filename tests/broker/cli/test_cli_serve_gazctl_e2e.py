"""One `gazette serve` process on the embedded keyspace, driven by `gazctl` processes: apply a
journal space, append from stdin, read back, list fragments, and see the fragment file written
under the file:// root when the broker stops."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.broker.serve_testkit import free_port, persisted_gzip_content

# Upper bound on any one CLI step; they take well under a second.
step_timeout_s = 30


def _gazctl(*args: str, stdin: bytes = b"", broker: str) -> subprocess.CompletedProcess[bytes]:
    env = dict(os.environ, BROKER_ADDRESS=broker)
    return subprocess.run(
        [sys.executable, "-m", "broker.cli.gazctl", *args],
        input=stdin,
        capture_output=True,
        env=env,
        timeout=step_timeout_s,
        check=False,
    )


@pytest.fixture
def served(tmp_path: Path):  # type: ignore[no-untyped-def]
    port = free_port()
    log = (tmp_path / "broker.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from broker.serve_cli import main; main()",
            "serve",
            "--port",
            str(port),
            "--data-dir",
            str(tmp_path),
            "--file-root",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        # A file, not a pipe: a pipe nobody reads would fill with logs and stall the broker.
        stderr=log,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()  # Printed once the broker serves.
    assert line.startswith("serving on"), line + (tmp_path / "broker.log").read_text()
    try:
        yield f"127.0.0.1:{port}", proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=step_timeout_s)
        proc.stdout.close()
        log.close()


def test_serve_and_gazctl_round_trip(served, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    broker, proc = served
    # The file store refuses to create its base directory (it may be an unmounted volume).
    (tmp_path / "fragments").mkdir()
    space = tmp_path / "space.yaml"
    space.write_text(
        "name: cli/\nreplication: 1\n"
        "fragment: {length: 1048576, compression_codec: GZIP, refresh_interval: 30s,"
        " stores: ['file:///fragments/']}\n"
        "children: [{name: cli/words}]\n"
    )
    applied = _gazctl("journals", "apply", "-f", str(space), broker=broker)
    assert applied.returncode == 0, applied.stderr.decode()

    first = _gazctl("journals", "append", "-j", "cli/words", stdin=b"hello\n", broker=broker)
    assert first.returncode == 0, first.stderr.decode()
    assert b"[0, 6)" in first.stdout
    second = _gazctl("journals", "append", "-j", "cli/words", stdin=b"world\n", broker=broker)
    assert b"[6, 12)" in second.stdout

    read = _gazctl("journals", "read", "-j", "cli/words", broker=broker)
    assert read.returncode == 0, read.stderr.decode()
    assert read.stdout == b"hello\nworld\n"
    tail = _gazctl("journals", "read", "-j", "cli/words", "--offset", "6", broker=broker)
    assert tail.stdout == b"world\n"

    listed = _gazctl("journals", "list", "--format", "json", broker=broker)
    [journal] = json.loads(listed.stdout)
    assert journal["name"] == "cli/words" and journal["route"] == "local#broker*"

    frags = _gazctl("journals", "fragments", "-j", "cli/words", "--format", "json", broker=broker)
    assert frags.returncode == 0, frags.stderr.decode()
    assert [(f["begin"], f["end"]) for f in json.loads(frags.stdout)][-1][1] == 12

    missing = _gazctl("journals", "append", "-j", "cli/nope", stdin=b"x", broker=broker)
    assert missing.returncode == 1
    assert missing.stderr.startswith(b"gazctl: JOURNAL_NOT_FOUND")

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=step_timeout_s) == 0
    # Gazette's names: begin, end and the SHA1 of the uncompressed content, which the gzip'd
    # files must decompress to; together they hold every appended byte, once.
    assert persisted_gzip_content(tmp_path / "fragments" / "cli" / "words") == b"hello\nworld\n"
