"""The persisted embedded keyspace under real processes: `gazette serve` and `gazette-consumer
serve` without --etcd, killed (-9) or stopped (SIGTERM) and restarted on the same --data-dir;
a second process on a directory in use; a process whose log write fails (RLIMIT_FSIZE).

Spool content surviving a kill -9 is not claimed here (durable spools are a separate piece of
work): after a kill, appends are checked to work again, not that earlier content was kept."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from broker import client
from broker.cli import gazctl
from broker.keyspace.embedded import EmbeddedStore
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import OffsetNotYetAvailableError
from tests.broker.serve_testkit import REPO, free_port, gazette_serve

T = TypeVar("T")

# Upper bound on one CLI step, and on a restarted process assigning its work to itself.
step_timeout_s = 30
# How often the tests poll another process's state (no event crosses the process boundary).
poll_interval_s = 0.1

SPACE = """\
name: ks/
replication: 1
fragment: {length: 1048576, compression_codec: GZIP, refresh_interval: 30s,
           stores: ['file:///fragments/']}
children: [{name: ks/a}]
"""


class Gazctl:
    """gazctl's commands, run in this process (its servers are real processes; starting a
    Python process per command would cost more than the test)."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self._capsys = capsys

    async def __call__(self, *argv: str) -> tuple[int, str, str]:
        code = await gazctl.run(gazctl.parse_args(list(argv)))
        out, err = self._capsys.readouterr()
        return code, out, err

    async def journals(self, port: int) -> dict[str, dict[str, Any]]:
        code, out, err = await self("--broker", f"127.0.0.1:{port}", "journals", "list",
                                    "--format", "json")  # fmt: skip
        assert code == 0, err
        return {j["name"]: j for j in json.loads(out)}

    async def apply(self, port: int, space: Path) -> None:
        code, _, err = await self("--broker", f"127.0.0.1:{port}", "journals", "apply",
                                  "-f", str(space))  # fmt: skip
        assert code == 0, err

    async def append(self, port: int, journal: str, data: Path) -> str:
        broker = ("--broker", f"127.0.0.1:{port}", "journals")
        code, out, err = await self(*broker, "append", "-j", journal, "-f", str(data))
        # Never INDEX_HAS_GREATER_OFFSET: a restarted broker continues from its durable spools.
        assert code == 0, err
        return out

    async def shards(self, port: int) -> list[dict[str, Any]]:
        code, out, err = await self("shards", "--consumer", f"127.0.0.1:{port}", "list",
                                    "--format", "json")  # fmt: skip
        assert code == 0, err
        records: list[dict[str, Any]] = json.loads(out)
        return records


async def poll(what: str, probe: Callable[[], Awaitable[T | None]]) -> T:
    """``probe()``'s first result that is not None, polled for at most step_timeout_s."""
    deadline = time.monotonic() + step_timeout_s
    while (result := await probe()) is None:
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(poll_interval_s)
    return result


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
async def test_gazette_serve_keeps_its_journals_across_a_restart(
    tmp_path: Path, sig: int, capsys: pytest.CaptureFixture[str]
) -> None:
    run = Gazctl(capsys)
    (tmp_path / "fragments").mkdir()
    (tmp_path / "space.yaml").write_text(SPACE)
    (tmp_path / "hello").write_bytes(b"hello\n")
    (tmp_path / "world").write_bytes(b"world\n")
    with gazette_serve(tmp_path) as (port, proc):
        await run.apply(port, tmp_path / "space.yaml")
        assert "[0, 6)" in await run.append(port, "ks/a", tmp_path / "hello")
        before = (await run.journals(port))["ks/a"]
        assert before["route"] == "local#broker*"
        proc.send_signal(sig)
        assert proc.wait(timeout=step_timeout_s) == (0 if sig == signal.SIGTERM else -sig)
    assert (tmp_path / "keyspace" / "LOCK").exists()

    async def assigned() -> dict[str, Any] | None:
        record = (await run.journals(port)).get("ks/a")
        return record if record is not None and record["route"] == "local#broker*" else None

    with gazette_serve(tmp_path) as (port, proc):
        # Its old member key and assignments went with its lease, revoked at open: it announces
        # itself at once and the allocator gives the journal back to it.
        after = await poll("ks/a to be assigned", assigned)
        assert after["spec"] == before["spec"]
        assert after["mod_revision"] == before["mod_revision"]
        # Revisions continue: a new spec's revision is past everything before the restart.
        (tmp_path / "space.yaml").write_text(SPACE.replace("ks/a", "ks/b"))
        await run.apply(port, tmp_path / "space.yaml")
        assert (await run.journals(port))["ks/b"]["mod_revision"] > before["mod_revision"] + 1

        # Killed or stopped, the journal goes on at its end (durable spools: nothing
        # acknowledged is lost, no offset is written twice) with no operator's reset-head.
        assert "[6, 12)" in await run.append(port, "ks/a", tmp_path / "world")
        content = await read_all(f"127.0.0.1:{port}", "ks/a")
        assert content == b"hello\nworld\n"


async def read_all(endpoint: str, journal: str) -> bytes:
    c = client.JournalClient(endpoint)
    reader = client.RetryReader(c, pb.ReadRequest(journal=journal, offset=0, block=False))
    out = b""
    try:
        with contextlib.suppress(OffsetNotYetAvailableError):
            while chunk := await reader.read():
                out += chunk
    finally:
        await c.close()
    return out


async def test_a_second_process_on_a_data_dir_in_use_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with gazette_serve(tmp_path) as (port, proc):
        second = await asyncio.create_subprocess_exec(
            *(sys.executable, "-c", "from broker.serve_cli import main; main()", "serve"),
            *("--port", str(free_port()), "--data-dir", str(tmp_path)),
            *("--file-root", str(tmp_path)),
            stderr=asyncio.subprocess.PIPE,
            cwd=REPO,
        )
        _, stderr = await asyncio.wait_for(second.communicate(), step_timeout_s)
        assert second.returncode != 0
        message = stderr.decode().strip().splitlines()[-1]
        assert message.startswith("gazette serve: --data-dir: embedded keyspace directory")
        assert f"held by process {proc.pid}" in message
        assert await Gazctl(capsys).journals(port) == {}  # The first one is undisturbed.


CONSUMER_SPACE = """\
common:
  max_txn_duration: 1s
shards:
- id: counter-000
  sources: [{journal: words/part-000}]
- id: counter-001
  sources: [{journal: words/part-001}]
"""


@contextlib.contextmanager
def consumer_serve(data_dir: Path, port: int) -> Iterator[subprocess.Popen[bytes]]:
    """`gazette-consumer serve` embedded (keyspace, broker and consumer in one process)."""
    with (data_dir / "consumer.log").open("ab") as log:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "gazette_consumer.runner", "serve"),
                *("--app", "tests.gazette_consumer.consumer_testkit:CounterApp"),
                *("--port", str(port), "--id", "consumer-1", "--data-dir", str(data_dir)),
                *("--drain-timeout", "5"),
            ],
            stdout=subprocess.PIPE,
            stderr=log,  # A file: an unread pipe would fill with logs and stall the process.
            cwd=REPO,
        )
        assert proc.stdout is not None
        try:
            line = proc.stdout.readline().decode()
            assert line.startswith("serving on"), line + (data_dir / "consumer.log").read_text()
            yield proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=step_timeout_s)
            proc.stdout.close()


async def test_consumer_shard_specs_survive_a_kill(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = Gazctl(capsys)
    port = free_port()
    (tmp_path / "shards.yaml").write_text(CONSUMER_SPACE)

    async def all_assigned() -> list[dict[str, Any]] | None:
        records = await run.shards(port)
        assigned = records and all(r["primary"].startswith("consumer-1:") for r in records)
        return records if assigned else None

    with consumer_serve(tmp_path, port) as proc:
        code, _, err = await run("shards", "--consumer", f"127.0.0.1:{port}", "apply",
                                 "-f", str(tmp_path / "shards.yaml"))  # fmt: skip
        assert code == 0, err
        before = await poll("shards to be assigned", all_assigned)
        proc.kill()
        proc.wait(timeout=step_timeout_s)
    with consumer_serve(tmp_path, port):
        after = await poll("shards to be assigned again", all_assigned)
        assert [r["id"] for r in after] == ["counter-000", "counter-001"]
        assert [r["revision"] for r in after] == [r["revision"] for r in before]


FAILING_WRITER = textwrap.dedent(
    """
    import asyncio, json, resource, sys
    from broker.keyspace.embedded import EmbeddedStore, KeySpaceStorageError

    async def main(path):
        store = EmbeddedStore.open(path)
        backend = store.connect()
        watch = backend.watch(b"/k/", b"/k0")
        watcher = asyncio.ensure_future(drain(watch))
        # From now on the log (the only file written) cannot grow past ~6 records.
        limit = store.directory.wal_bytes + 2000
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
        acked, failure = [], None
        for i in range(100):
            try:
                await backend.put(b"/k/%03d" % i, b"v" * 300)
            except KeySpaceStorageError as exc:
                failure = str(exc)
                break
            acked.append(i)
        try:
            await backend.range(b"/k/000")
            later = "served"
        except KeySpaceStorageError:
            later = "refused"
        try:
            await anext(backend.watch(b"/k/", b"/k0", start_revision=1))
            later += ", watch served"
        except KeySpaceStorageError:
            later += ", watch refused"
        seen, watch_error = await watcher
        print(json.dumps({"acked": acked, "failure": failure, "later": later,
                          "seen": seen, "watch_error": watch_error}))

    async def drain(watch):
        seen = []
        try:
            async for resp in watch:
                seen.extend(int(e.kv.key[3:]) for e in resp.events)
        except KeySpaceStorageError as exc:
            return seen, type(exc).__name__
        return seen, None

    asyncio.run(main(sys.argv[1]))
    """
)


async def test_a_failed_log_write_fails_the_store_and_loses_nothing_acknowledged(
    tmp_path: Path,
) -> None:
    writer = await asyncio.create_subprocess_exec(
        *(sys.executable, "-c", FAILING_WRITER, str(tmp_path)),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    stdout, stderr = await asyncio.wait_for(writer.communicate(), step_timeout_s)
    assert writer.returncode == 0, stderr.decode()
    result = json.loads(stdout)
    acked: list[int] = result["acked"]
    assert 0 < len(acked) < 100 and acked == list(range(len(acked)))
    assert "appending to the write-ahead log failed" in result["failure"]
    assert "File too large" in result["failure"]
    assert result["later"] == "refused, watch refused"
    # Watchers saw nothing unacknowledged, then the error (not a silent end): what they had
    # not read yet is dropped with the watch, as with any watch error.
    assert result["seen"] == acked[: len(result["seen"])]
    assert result["watch_error"] == "KeySpaceStorageError"

    store = EmbeddedStore.open(tmp_path)  # The torn record the failed write left is dropped.
    try:
        kvs = (await store.connect().range(b"/k/", b"/k0")).kvs
        assert [int(kv.key[3:]) for kv in kvs] == acked
    finally:
        await store.close()
