"""``gazctl attach-uuids`` (lines of text framed with Gazette message UUIDs) and ``gazctl
print-config``, run as the gazctl program: stdin and files in, stdout out, one-line errors."""

from __future__ import annotations

import configparser
import io
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from broker.cli.attach_uuids import attach, parse_template
from gazette_consumer.message.uuid import Flag, parse_uuid

_REPO_ROOT = Path(__file__).resolve().parents[3]


def gazctl(
    *argv: str, stdin: bytes = b"", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("BROKER_", "CONSUMER_"))}
    for var in ("GAZ_EDITOR", "EDITOR", "GAZCTL_DEBUG"):
        base.pop(var, None)
    return subprocess.run(
        [sys.executable, "-m", "broker.cli.gazctl", *argv],
        input=stdin,
        capture_output=True,
        env={**base, "PYTHONPATH": str(_REPO_ROOT), **(env or {})},
        timeout=60,
        check=False,
    )


def test_attach_uuids_frames_each_line_of_stdin() -> None:
    done = gazctl("attach-uuids", stdin=b"a,1\nb,2\r\n\nlast without newline")
    assert done.returncode == 0, done.stderr
    rows = done.stdout.decode().split("\n")
    assert rows[-1] == ""  # Every output line ends with the template's newline.
    parsed = [row.split(",", 1) for row in rows[:-1]]
    assert [line for _, line in parsed] == ["a,1", "b,2", "", "last without newline"]
    parts = [parse_uuid(uuid.UUID(u)) for u, _ in parsed]
    assert len({p.producer for p in parts}) == 1  # One producer for the run...
    clocks = [p.clock for p in parts]
    assert clocks == sorted(set(clocks))  # ...and a strictly increasing clock.
    assert all(p.flags == Flag.OUTSIDE_TXN for p in parts)  # Committed on their own.


def test_attach_uuids_reads_files_with_template_and_skipped_headers(tmp_path: Path) -> None:
    one, two = tmp_path / "one.csv", tmp_path / "two.csv"
    one.write_bytes(b"h1\nx\n")
    two.write_bytes(b"h2\ny\nz\n")
    template = '{"uuid": "{{ .UUID }}", "record": {{.Line}}}\n'
    done = gazctl("attach-uuids", "--skip-header", "--template", template, str(one), str(two))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.decode().splitlines()
    assert [line.split('"record": ')[1] for line in lines] == ["x}", "y}", "z}"]
    assert all(line.startswith('{"uuid": "') for line in lines)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--template", "{{.UUID}} {{.Other}}"], "--template: only {{.UUID}} and {{.Line}}"),
        (["--template", "{{.UUID"], "--template: unclosed action"),
        (["--max-length", "0"], "--max-length: must be > 0"),
        (["/does/not/exist"], "No such file"),
    ],
)
def test_attach_uuids_bad_input_is_one_line(argv: list[str], message: str) -> None:
    done = gazctl("attach-uuids", *argv, stdin=b"x\n")
    assert done.returncode == 2
    assert done.stdout == b""  # Refused before any output.
    err = done.stderr.decode()
    assert err.startswith("gazctl: ") and message in err and err.count("\n") == 1


def test_attach_uuids_refuses_a_line_past_max_length() -> None:
    out = io.BytesIO()
    source = io.BytesIO(b"ok\n" + b"x" * 11 + b"\nnever\n")
    with pytest.raises(ValueError, match="in: line 2 is longer than 10 bytes"):
        attach([("in", source)], out, parse_template("{{.Line}}\n"), line_bytes_max=10)
    assert out.getvalue() == b"ok\n"  # The lines before it were written.
    exact = io.BytesIO(b"x" * 10 + b"\r\n" + b"y" * 10)
    out = io.BytesIO()
    assert attach([("in", exact)], out, parse_template("{{.Line}}|"), line_bytes_max=10) == 2
    assert out.getvalue() == b"x" * 10 + b"|" + b"y" * 10 + b"|"


def test_print_config_tells_values_and_their_sources() -> None:
    done = gazctl(
        "--broker",
        "broker.example:8080",
        "print-config",
        env={"CONSUMER_ADDRESS": "consumer.example:9000", "EDITOR": "nano"},
    )
    assert done.returncode == 0, done.stderr
    text = done.stdout.decode()
    config = configparser.ConfigParser(comment_prefixes=(";",))
    config.read_string(text)
    assert config["broker"]["address"] == "broker.example:8080"
    assert config["consumer"]["address"] == "consumer.example:9000"
    assert config["log"]["level"] == "warning"
    assert config["gazctl"]["editor"] == "nano"
    assert "; from flag --broker\naddress = broker.example:8080" in text
    assert "; from $CONSUMER_ADDRESS\naddress = consumer.example:9000" in text
    assert "; from default\nlevel = warning" in text
    assert "; from $EDITOR\neditor = nano" in text

    from_env = gazctl("print-config", env={"BROKER_ADDRESS": "env.example:1"})
    assert "; from $BROKER_ADDRESS\naddress = env.example:1" in from_env.stdout.decode()
