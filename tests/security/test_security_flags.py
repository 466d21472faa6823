"""Bad security flags of ``gazette serve``, ``gazette-consumer serve`` and ``gazctl``: each is
refused before anything starts, with exit status 2 and one line naming the flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.cli import gazctl
from broker.serve_cli import _parse_args
from gazette_consumer import runner
from tests.security.tls_testkit import CertAuthority


@pytest.fixture
def ca(tmp_path: Path) -> CertAuthority:
    return CertAuthority.new(tmp_path, "ca")


def test_gazette_serve_refuses_bad_security_flags(
    ca: CertAuthority, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cert = ca.issue("broker")
    root = ("--file-root", str(tmp_path))
    cases = [
        (["--tls-cert", str(tmp_path / "nope.crt"), "--tls-key", cert.key], "--tls-cert: cannot read"),
        (["--tls-cert", cert.cert], "--tls-key: is required with --tls-cert"),
        (["--tls-client-ca", ca.cert], "--tls-client-ca: needs --tls-cert and --tls-key"),
        (["--tls-ca", cert.key], "--tls-ca: "),
        (["--etcd", "http://127.0.0.1:2379", "--etcd-ca", ca.cert], "plain http:// (use https://)"),
        (["--etcd", "127.0.0.1:2379", "--etcd-password", "pw"], "--etcd-password: needs --etcd-user"),
    ]  # fmt: skip
    for flags, text in cases:
        with pytest.raises(SystemExit) as exit_:
            _parse_args(["serve", *root, *flags])
        assert exit_.value.code == 2, flags
        assert text in capsys.readouterr().err, flags
    # Good ones are loaded: the broker serves TLS, and trusts the CA when dialing.
    args = _parse_args(["serve", *root, "--server-cert-file", cert.cert, "--tls-key", cert.key,
                        "--peer-ca-file", ca.cert])  # fmt: skip
    assert args.server_tls is not None and not args.server_tls.mutual
    assert args.peer_tls is not None and args.peer_tls.certificate_chain is not None


def test_gazette_consumer_serve_refuses_bad_security_flags(
    ca: CertAuthority, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    app = ("--app", "examples.counter:Counter")
    cases = [
        (["--auth-keys", "not base64!"], "--auth-keys[0]: not valid base64"),
        (["--broker-auth-keys", "a2V5 not base64!"], "--broker-auth-keys[1]: not valid base64"),
        (["--tls-cert", ca.cert, "--tls-key", str(tmp_path / "nope.key")], "--tls-key: cannot read"),
        (["--etcd", "https://127.0.0.1:2379", "--etcd-cert", ca.cert], "--etcd-key: is required"),
    ]  # fmt: skip
    for flags, text in cases:
        assert runner.main(["serve", *app, *flags]) == runner.EXIT_BAD_INPUT, flags
        err = capsys.readouterr().err
        assert text in err and len(err.strip().splitlines()) == 1, (flags, err)


def test_gazctl_refuses_bad_security_flags(
    ca: CertAuthority, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = [
        (["--auth-keys", "not base64!"], "--auth-keys[0]: not valid base64"),
        (["--tls-ca", str(tmp_path / "nope.pem")], "--tls-ca: cannot read"),
        (["--tls-cert", ca.issue("client").cert], "--tls-key: is required with --tls-cert"),
    ]
    for flags, text in cases:
        for command in (["journals", "list"], ["shards", "list"]):
            assert gazctl.main([*flags, *command]) == gazctl.EXIT_BAD_INPUT, (flags, command)
            err = capsys.readouterr().err
            assert text in err and len(err.strip().splitlines()) == 1, (flags, command, err)
