"""`gazette serve` as a real process for end-to-end tests, and a check of the fragment files
a broker persisted to a `file://` store."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from broker.testing.ports import free_port as free_port

REPO = Path(__file__).resolve().parents[2]
stop_timeout_s = 30


@contextlib.contextmanager
def gazette_serve(root: Path, *args: str) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """`gazette serve --port P --data-dir root --file-root root *args` on the embedded
    keyspace: yields (P, the process) once it serves; SIGTERM (then SIGKILL) afterwards, unless
    the test ended it itself. Its log is root/broker.log."""
    port = free_port()
    log = (root / "broker.log").open("wb")
    proc = subprocess.Popen(
        [
            *(sys.executable, "-c", "from broker.serve_cli import main; main()", "serve"),
            *("--port", str(port), "--data-dir", str(root), "--file-root", str(root)),
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=log,  # A file: a pipe nobody reads would fill up and stall the broker.
        cwd=REPO,
    )
    assert proc.stdout is not None
    try:
        line = proc.stdout.readline().decode()  # Printed once the broker serves.
        assert line.startswith("serving on"), line + (root / "broker.log").read_text()
        yield port, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=stop_timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        proc.stdout.close()
        log.close()


def persisted_gzip_content(directory: Path) -> bytes:
    """The content of a journal's gzip fragment files in `directory`, checked against
    Gazette's names (begin and end offsets, SHA1 of the uncompressed content) and for
    contiguity from offset 0."""
    content = b""
    for path in sorted(directory.iterdir()):
        begin, end, digest = path.stem.split("-")
        assert path.suffix == ".gz" and int(begin, 16) == len(content), path
        data = gzip.decompress(path.read_bytes())
        assert int(end, 16) - int(begin, 16) == len(data), path
        assert hashlib.sha1(data).hexdigest() == digest, path
        content += data
    return content
