"""A `gazette serve` process for benchmarks, run as a user runs it: the embedded keyspace, spools
durable under `--data-dir`, its own process. Message and recovery-log figures measured through
it are those of a client talking to a separate broker, not of a broker sharing the client's
process (and GIL).

    async with gazette_serve(data_dir) as broker:
        c = client.JournalClient(broker.endpoint)
        await assign_journals(c, specs)
        ...
        broker.cpu_s()  # The broker process's CPU seconds so far (user + system).

Readiness is the line `serving on <endpoint>` the broker prints once it serves (as
broker/testing/process_cluster.py waits for it); afterwards its stdout is drained into its log,
`<data_dir>/broker.log`, which also takes its stderr. Leaving the context SIGTERMs it (a
clean hand-off and exit), and SIGKILLs it if it has not exited within `STOP_TIMEOUT_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final

from broker import client
from broker.protocol import protocol_pb2 as pb

READY_TIMEOUT_S: Final = 60.0
STOP_TIMEOUT_S: Final = 30.0
ASSIGN_TIMEOUT_S: Final = 30.0
LOG_TAIL_BYTES: Final = 3000

_SERVING: Final = "serving on "
_REPO: Final = str(Path(__file__).resolve().parent.parent)
_TICKS_S: Final = os.sysconf("SC_CLK_TCK")


class ServeError(RuntimeError):
    """The broker process did not start, or exited before it was asked to."""


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS_S  # utime, stime.


@dataclass
class ServeProcess:
    endpoint: str
    pid: int
    data_dir: Path
    args: list[str]  # The `gazette serve` arguments it runs with (for results' conditions).

    def cpu_s(self) -> float:
        return process_cpu_s(self.pid)


@contextlib.asynccontextmanager
async def gazette_serve(
    data_dir: Path, extra_args: Sequence[str] = ()
) -> AsyncIterator[ServeProcess]:
    """`gazette serve --port 0 --data-dir data_dir --file-root data_dir *extra_args` (see the
    module docstring). `file:///` fragment stores of its journals live under `data_dir`."""
    _make_dir(data_dir)
    args = [
        *("serve", "--port", "0", "--data-dir", str(data_dir)),
        *("--file-root", str(data_dir)),
        *extra_args,
    ]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_REPO, env.get("PYTHONPATH")]))
    log_path = data_dir / "broker.log"
    with _open_log(log_path) as log:
        proc = await asyncio.create_subprocess_exec(
            *(sys.executable, "-c", "from broker.serve_cli import main; main()", *args),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=log,  # A file: a pipe nobody reads would fill up and stall the broker.
            env=env,
        )
    drain: asyncio.Task[None] | None = None
    try:
        endpoint = await _wait_serving(proc, log_path)
        drain = asyncio.create_task(_drain(proc, log_path))
        yield ServeProcess(endpoint, proc.pid, data_dir, args)
        if proc.returncode is not None:
            raise ServeError(f"gazette serve exited ({proc.returncode}):\n{_tail(log_path)}")
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(STOP_TIMEOUT_S):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if drain is not None:
            await asyncio.gather(drain, return_exceptions=True)


async def _wait_serving(proc: asyncio.subprocess.Process, log_path: Path) -> str:
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(READY_TIMEOUT_S):
            while line := await proc.stdout.readline():
                text = line.decode(errors="replace").strip()
                if text.startswith(_SERVING):
                    return text[len(_SERVING) :]
    except TimeoutError:
        raise ServeError(f"gazette serve not serving after {READY_TIMEOUT_S:g} s") from None
    await proc.wait()
    raise ServeError(f"gazette serve exited ({proc.returncode}) before serving:\n{_tail(log_path)}")


async def _drain(proc: asyncio.subprocess.Process, log_path: Path) -> None:
    assert proc.stdout is not None
    with _open_log(log_path) as log:
        while line := await proc.stdout.readline():
            log.write(b"[stdout] " + line)


def _make_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)


def _open_log(path: Path) -> IO[bytes]:
    # A line or two written now and then: not worth a thread.
    return open(path, "ab")


def _tail(log_path: Path) -> str:
    try:
        return log_path.read_bytes()[-LOG_TAIL_BYTES:].decode(errors="replace")
    except OSError as err:
        return f"(no log: {err})"


async def assign_journals(c: client.JournalClient, specs: Sequence[pb.JournalSpec]) -> None:
    """Create `specs` (all named under bench/) and wait until each has a primary."""
    await client.apply_journals(c, [client.upsert(spec) for spec in specs])
    names = {spec.name for spec in specs}
    async with asyncio.timeout(ASSIGN_TIMEOUT_S):
        async for snapshot in client.watch_journals(c, "prefix=bench/"):
            routed = {j.spec.name for j in snapshot.journals if j.route.primary >= 0}
            if names <= routed:
                return
