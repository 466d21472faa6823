"""A `gazette serve` process for benchmarks, run as a user runs it: the embedded keyspace, spools
durable under `--data-dir`, its own process. Message and recovery-log figures measured through
it are those of a client talking to a separate broker, not of a broker sharing the client's
process (and GIL).

    async with gazette_serve(data_dir) as broker:
        c = client.JournalClient(broker.endpoint)
        await assign_journals(c, specs)
        ...
        broker.cpu_s()  # The broker process's CPU seconds so far (user + system).

Readiness is the line `serving on <endpoint>` the broker prints once it serves; its stdout and
stderr go to its log, `<data_dir>/broker.log` (broker/testing/served_process.py, as the tests'
broker processes). Leaving the context SIGTERMs it (a clean hand-off and exit), and SIGKILLs it
if it has not exited within `STOP_TIMEOUT_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from broker import client
from broker.protocol import protocol_pb2 as pb
from broker.testing.served_process import ServedProcess, ServedProcessError

READY_TIMEOUT_S: Final = 60.0
STOP_TIMEOUT_S: Final = 30.0
ASSIGN_TIMEOUT_S: Final = 30.0

_SERVING: Final = "serving"
_TICKS_S: Final = os.sysconf("SC_CLK_TCK")

# The broker process did not start, or exited before it was asked to.
ServeError = ServedProcessError


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
    data_dir: Path, extra_args: Sequence[str] = (), *, tree: str | None = None
) -> AsyncIterator[ServeProcess]:
    """`gazette serve --port 0 --data-dir data_dir --file-root data_dir *extra_args` (see the
    module docstring). `file:///` fragment stores of its journals live under `data_dir`.
    `tree`: run the broker of another source tree (a worktree of another commit, for an A/B),
    from that directory (first on its import path)."""
    _make_dir(data_dir)
    args = [
        *("serve", "--port", "0", "--data-dir", str(data_dir)),
        *("--file-root", str(data_dir)),
        *extra_args,
    ]
    proc = ServedProcess("gazette serve", data_dir / "broker.log")
    printed = await proc.spawn(
        ["-c", "from broker.serve_cli import main; main()", *args],
        expect=(_SERVING,),
        ready_timeout_s=READY_TIMEOUT_S,
        cwd=tree,
    )
    try:
        yield ServeProcess(printed[_SERVING], proc.pid, data_dir, args)
        if not proc.running:
            raise ServeError(f"gazette serve exited ({proc.returncode}):\n{proc.log_tail()}")
    finally:
        if proc.running:
            with contextlib.suppress(ServedProcessError):  # Killed if it did not exit in time.
                await proc.terminate(STOP_TIMEOUT_S)
        await proc.kill()  # Reaps its log copying, whichever way it ended.


def _make_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)


async def assign_journals(c: client.JournalClient, specs: Sequence[pb.JournalSpec]) -> None:
    """Create `specs` (all named under bench/) and wait until each has a primary."""
    await client.apply_journals(c, [client.upsert(spec) for spec in specs])
    names = {spec.name for spec in specs}
    async with asyncio.timeout(ASSIGN_TIMEOUT_S):
        async for snapshot in client.watch_journals(c, "prefix=bench/"):
            routed = {j.spec.name for j in snapshot.journals if j.route.primary >= 0}
            if names <= routed:
                return
