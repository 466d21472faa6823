"""Start-up errors of ``gazette serve``, ``gazette-consumer serve`` and ``gazctl``, run as the
processes users run: a bad flag is a usage error (exit status 2) and an unreachable etcd one
line naming the endpoint (exit status 1); never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

GAZETTE = ("-c", "from broker.serve_cli import main; main()")
CONSUMER = ("-m", "gazette_consumer.runner")
GAZCTL = ("-m", "broker.cli.gazctl")
APP = ("--app", "examples.counter.app:Counter")
# Nothing listens on port 1 (binding it takes root): a connection is refused at once.
UNREACHABLE = "127.0.0.1:1"


def _run(*argv: str) -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(
        [sys.executable, *argv], capture_output=True, env=env, timeout=60, check=False
    )
    return done.returncode, done.stderr.decode()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            (*GAZCTL, "--log-level", "loud", "journals", "list"),
            "gazctl: error: argument --log-level: must be one of debug, info, warning, error,"
            " critical (got 'loud')",
        ),
        (
            (*CONSUMER, "serve", *APP, "--log-level", "loud"),
            "gazette-consumer serve: error: argument --log-level: must be one of debug, info,"
            " warning, error, critical (got 'loud')",
        ),
        (
            (*GAZCTL, "--broker", "http://[::1", "journals", "list"),
            "gazctl: error: argument --broker: must be http://host:port, https://host:port or"
            " unix:///path (got 'http://[::1': Invalid IPv6 URL)",
        ),
        (
            (*GAZCTL, "shards", "--consumer", "http://[::1", "list"),
            "gazctl: error: argument --consumer: must be http://host:port, https://host:port or"
            " unix:///path (got 'http://[::1': Invalid IPv6 URL)",
        ),
        (
            (*GAZETTE, "serve", "--port", "99999"),
            "gazette serve: error: argument --port: must be in [0, 65535] (got 99999)",
        ),
        (
            (*CONSUMER, "serve", *APP, "--broker-port", "65536"),
            "gazette-consumer serve: error: argument --broker-port: must be in [0, 65535]"
            " (got 65536)",
        ),
    ],
    ids=["gazctl log level", "consumer log level", "broker", "consumer", "port", "broker port"],
)
def test_bad_flags_are_usage_errors(argv: tuple[str, ...], message: str) -> None:
    status, err = _run(*argv)
    assert status == 2, err
    assert "Traceback" not in err, err
    assert err.startswith("usage: "), err
    assert err.splitlines()[-1] == message, err


@pytest.mark.parametrize(
    ("argv", "prefix"),
    [
        ((*GAZETTE, "serve", "--port", "0"), "gazette serve: "),
        ((*CONSUMER, "serve", *APP, "--port", "0"), "gazette-consumer: "),
    ],
    ids=["gazette", "gazette-consumer"],
)
def test_an_unreachable_etcd_is_one_line_naming_it(argv: tuple[str, ...], prefix: str) -> None:
    status, err = _run(*argv, "--etcd", UNREACHABLE)
    assert status == 1, err
    assert "Traceback" not in err, err
    [line] = err.splitlines()
    assert line.startswith(f"{prefix}cannot reach etcd at --etcd {UNREACHABLE}: "), line
    assert "Connection refused" in line, line
    assert line.endswith(
        "(is etcd running there? check --etcd and any --etcd-ca/--etcd-cert/--etcd-user)"
    )


@pytest.mark.parametrize(
    "argv",
    [(*GAZETTE, "serve", "--port", "0"), (*CONSUMER, "serve", *APP, "--port", "0")],
    ids=["gazette", "gazette-consumer"],
)
def test_a_malformed_etcd_endpoint_is_named_before_anything_dials(argv: tuple[str, ...]) -> None:
    """An unclosed IPv6 bracket passed the endpoint check and ended, seconds later, as "cannot
    reach etcd" (found by the bad-input audit)."""
    status, err = _run(*argv, "--etcd", "http://[::1")
    assert status != 0, err
    assert "Traceback" not in err, err
    last = err.splitlines()[-1]
    assert "etcd endpoint 'http://[::1': expected host:port (an IPv6 address in brackets" in last
    assert "cannot reach" not in err, err
