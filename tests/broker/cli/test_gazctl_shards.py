"""``gazctl shards list/apply/unassign`` against consumer members: in-process over the embedded
keyspace (every path, bad input included), and as real processes (a ``gazette-consumer serve``
in embedded mode driven by ``gazctl`` subprocesses)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import yaml

from broker.cli import gazctl
from broker.protocol import consumer_pb2 as cpb
from broker.testing.ports import free_port
from tests.gazette_consumer.consumer_testkit import Group, Node, primary_and_standbys

SPACE = """\
common:
  max_txn_duration: 1s
  labels:
  - name: app.gazette.dev/managed-by
    value: counter
shards:
- id: counter-000
  sources:
  - journal: words/part-000
- id: counter-001
  hot_standbys: 1
  sources:
  - journal: words/part-001
"""


@pytest.fixture
async def member() -> AsyncIterator[tuple[Group, Node]]:
    group = await Group.open()
    try:
        yield group, await group.join("zone-a", "consumer-a")
    finally:
        await group.close()


async def gazctl_run(node: Node, *argv: str) -> int:
    args = gazctl.parse_args(["shards", "--consumer", node.member.endpoint, *argv])
    return await gazctl.run(args)


async def listed(node: Node, capsys: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    capsys.readouterr()
    assert await gazctl_run(node, "list", "--format", "json") == 0
    records: list[dict[str, object]] = json.loads(capsys.readouterr().out)
    return records


async def test_apply_list_unassign_in_process(
    member: tuple[Group, Node], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    group, node = member
    space = tmp_path / "shards.yaml"
    space.write_text(SPACE)

    # A dry run validates and prints, and changes nothing.
    assert await gazctl_run(node, "apply", "-f", str(space), "--dry-run") == 0
    out = capsys.readouterr().out
    assert "counter-000" in out and "upsert" in out
    assert await listed(node, capsys) == []

    assert await gazctl_run(node, "apply", "-f", str(space)) == 0
    await group.until(primary_and_standbys(group, ["counter-000", "counter-001"], standbys=0))
    records = await listed(node, capsys)
    assert [r["id"] for r in records] == ["counter-000", "counter-001"]
    assert records[0]["primary"] == "consumer-a:PRIMARY" and records[0]["status"] == "PRIMARY"
    assert records[0]["spec"] == {  # type: ignore[comparison-overlap]
        "id": "counter-000",
        "sources": [{"journal": "words/part-000"}],
        "max_txn_duration": "1s",
        "labels": [{"name": "app.gazette.dev/managed-by", "value": "counter"}],
    }

    # The YAML listing is the shard space again, with revisions: list, edit, apply.
    assert await gazctl_run(node, "list", "--format", "yaml") == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    assert doc["common"]["max_txn_duration"] == "1s"
    revisions = {s["id"]: s["revision"] for s in doc["shards"]}
    assert revisions["counter-000"] == records[0]["revision"]
    doc["shards"][0]["hot_standbys"] = 2
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump(doc))
    assert await gazctl_run(node, "apply", "-f", str(edited)) == 0
    [after] = [r for r in await listed(node, capsys) if r["id"] == "counter-000"]
    assert after["spec"]["hot_standbys"] == 2  # type: ignore[index]

    # Applying the same (now stale) document again fails, and changes nothing.
    before = await listed(node, capsys)
    assert await gazctl_run(node, "apply", "-f", str(edited)) == 1
    assert "ETCD_TRANSACTION_FAILED" in capsys.readouterr().err
    assert await listed(node, capsys) == before

    # Unassign: --failed matches nothing healthy; a plain unassign moves the primary.
    assert await gazctl_run(node, "unassign", "-l", "id=counter-000", "--failed") == 0
    assert "nothing changed" in capsys.readouterr().err
    assert await gazctl_run(node, "unassign", "-l", "id=counter-000", "--format", "json") == 0
    assert json.loads(capsys.readouterr().out) == [{"id": "counter-000", "action": "unassigned"}]
    await group.until(primary_and_standbys(group, ["counter-000", "counter-001"], standbys=0))
    assert [f.spec.id for f in node.shards.started].count("counter-000") == 2


@pytest.mark.parametrize(
    ("space", "message"),
    [
        ("shards: [{id: counter-000}]", "max_txn_duration: must be > 0s"),
        ("shards: [{id: 'a#b', max_txn_duration: 1s}]", "(a#b): id"),
        ("common: {max_txn_duration: 1s}\nshards: [{id: c-000, ring: 3}]", "unknown field 'ring'"),
    ],
)
async def test_bad_shard_spaces_change_nothing(
    member: tuple[Group, Node],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    space: str,
    message: str,
) -> None:
    _, node = member
    path = tmp_path / "bad.yaml"
    path.write_text(space)
    assert await gazctl_run(node, "apply", "-f", str(path)) == 2
    err = capsys.readouterr().err
    # One line: the file and line, then the shard's path.
    assert err.startswith(f"gazctl: {path}:") and ": shards[0]" in err and message in err
    assert err.count("\n") == 1
    assert await listed(node, capsys) == []


async def test_bad_selectors_and_unreachable_consumers(
    member: tuple[Group, Node], capsys: pytest.CaptureFixture[str]
) -> None:
    _, node = member
    assert await gazctl_run(node, "list", "-l", "id in (") == 2
    assert "gazctl: " in capsys.readouterr().err
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        nobody = f"127.0.0.1:{s.getsockname()[1]}"
    args = gazctl.parse_args(["shards", "--consumer", nobody, "list"])
    assert await gazctl.run(args) == 1
    assert capsys.readouterr().err.startswith(f"gazctl: consumer {nobody}: UNAVAILABLE")


# --- Real processes --------------------------------------------------------------------------------

# Upper bound on one CLI step, and on waiting for the consumer to assign a shard.
step_timeout_s = 30


def _gazctl(consumer: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, CONSUMER_ADDRESS=consumer)
    return subprocess.run(
        [sys.executable, "-m", "broker.cli.gazctl", "shards", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=step_timeout_s,
        check=False,
    )


@pytest.fixture
def consumer_process(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    log = (tmp_path / "consumer.log").open("wb")
    # Embedded mode (no --etcd): keyspace, broker and consumer in one process.
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gazette_consumer.runner",
            "serve",
            "--app",
            "tests.gazette_consumer.consumer_testkit:CounterApp",
            "--port",
            str(port),
            "--id",
            "consumer-1",
            "--data-dir",
            str(tmp_path),
            "--drain-timeout",
            "5",
        ],
        stdout=subprocess.PIPE,
        stderr=log,  # A file: an unread pipe would fill with logs and stall the process.
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    assert line.startswith("serving on"), line + (tmp_path / "consumer.log").read_text()
    try:
        yield f"127.0.0.1:{port}", proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=step_timeout_s)
        proc.stdout.close()
        log.close()


def test_gazctl_shards_against_a_consumer_process(
    consumer_process: tuple[str, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    consumer, proc = consumer_process
    space = tmp_path / "shards.yaml"
    space.write_text(SPACE)
    applied = _gazctl(consumer, "apply", "-f", str(space))
    assert applied.returncode == 0, applied.stderr
    assert "counter-001" in applied.stdout

    # Polled, with a bound: there is no event to wait on across processes.
    deadline = time.monotonic() + step_timeout_s
    while True:
        listed = _gazctl(consumer, "list", "--format", "json")
        assert listed.returncode == 0, listed.stderr
        records = json.loads(listed.stdout)
        if all(r["primary"] != "<none>" for r in records):
            break
        assert time.monotonic() < deadline, records
        time.sleep(0.1)
    assert [r["id"] for r in records] == ["counter-000", "counter-001"]
    assert all(r["primary"].startswith("consumer-1:") for r in records)
    known = set(cpb.ReplicaStatus.Code.keys())
    assert all(r["status"] in known for r in records)

    unassigned = _gazctl(consumer, "unassign", "-l", "id=counter-001", "--dry-run")
    assert unassigned.returncode == 0, unassigned.stderr
    assert "would unassign" in unassigned.stdout

    missing = _gazctl(consumer, "apply", "-f", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "nope.yaml" in missing.stderr

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=step_timeout_s) == 0
