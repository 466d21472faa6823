"""A server told to listen on a port another process listens on fails to start, naming it.

gRPC's core sets SO_REUSEPORT on its listening sockets by default, so a second `gazette serve`
(or `gazette-consumer serve`) given a port in use shared it with the first, and clients landed
on either process at random: a broker of another cluster, say (found by the bad-input audit of
2026-11-30). The occupant here is a plain socket that allows sharing, as another gRPC server
does: sharing takes both sockets' consent, and ours no longer gives it
(grpc_transport.EXCLUSIVE_PORT_SERVER_OPTIONS).
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Seconds a refused start may take (the interpreter's imports, the embedded keyspace).
start_timeout_s = 60.0


@pytest.fixture
def occupied_port() -> Iterator[int]:
    """A loopback port a listening socket holds, with SO_REUSEPORT set."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def _refused(command: list[str]) -> str:
    """Run `command` (which must fail to start); its stderr."""
    done = subprocess.run(
        command, cwd=REPO, capture_output=True, timeout=start_timeout_s, check=False
    )
    err = done.stderr.decode()
    assert done.returncode != 0, err
    assert "serving on" not in done.stdout.decode()
    assert "Traceback" not in err, err
    return err


def test_gazette_serve_refuses_a_port_in_use(occupied_port: int, tmp_path: Path) -> None:
    err = _refused(
        [
            *(sys.executable, "-c", "from broker.serve_cli import main; main()", "serve"),
            *("--port", str(occupied_port), "--data-dir", str(tmp_path)),
        ]
    )
    assert err.rstrip().splitlines()[-1] == (
        f"gazette serve: cannot listen on 127.0.0.1:{occupied_port}: it is in use by another"
        " process, or not an address of this host (pick another --port or --host, or stop"
        " the other process)"
    )


def test_gazette_consumer_serve_refuses_a_port_in_use(occupied_port: int, tmp_path: Path) -> None:
    err = _refused(
        [
            *(
                sys.executable,
                "-c",
                "import sys; from gazette_consumer.runner import main; sys.exit(main())",
                "serve",
            ),
            *("--app", "examples.counter:Counter", "--id", "consumer-1"),
            *("--port", str(occupied_port), "--data-dir", str(tmp_path)),
        ]
    )
    assert (
        err.rstrip()
        .splitlines()[-1]
        .startswith(f"gazette-consumer: cannot listen on 127.0.0.1:{occupied_port}: it is in use")
    )
