"""A child process of ours that prints where it serves, for tests: started, killed, stopped.

``gazette serve`` and ``gazette-consumer serve`` print one line per address once they serve it
(``serving on <endpoint>``, ``http gateway on <url>``, ``metrics on <url>``, ``embedded broker
on <endpoint>``). A ``ServedProcess`` runs such a process from this repository's code (its
``PYTHONPATH`` leads with the directory holding the ``broker`` package), and its readiness is an
event: ``spawn`` returns once every expected ``<what> on <where>`` line was printed, with
``printed`` mapping each ``what`` to its ``where``. stderr (the structured log) goes to
``log_path``, never a pipe (nobody drains a pipe while tests run); stdout is read for those
lines and then copied into the same log, ``[stdout]``-prefixed, until the process exits. A
restart is a new process (``starts`` counts them), appending to the same log.

Faults: ``kill`` (SIGKILL, as a crash), ``terminate`` (SIGTERM, then a bounded wait for the exit
code), ``pause``/``resume`` (SIGSTOP/SIGCONT: the process keeps its sockets but answers nothing,
a zombie once resumed), and the synchronous ``kill_now`` for teardown paths.

Built on by ``process_cluster.BrokerProcess`` and ``consumer_process.ConsumerProcess``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import IO, Final

import broker
from broker import task_dump

# Bytes of a process's log quoted in errors.
log_tail_bytes: Final = 4000
# A SIGTERM'd process still running after this long is killed, and terminate() raises.
exit_timeout_s_default: Final = 60.0
# Before that kill, the process is asked for a dump of its asyncio tasks (SIGUSR1,
# broker/task_dump.py), so that its log says what its stop was waiting on; the dump's end is
# awaited at most this long, polling the log this often (a file's growth has no event).
task_dump_wait_s_max: Final = 5.0
task_dump_poll_s: Final = 0.05
# Put on the children's PYTHONPATH: the directory holding the ``broker`` package (and the
# ``examples`` package beside it).
PACKAGE_PARENT: Final = str(Path(broker.__file__).resolve().parent.parent)


class ServedProcessError(RuntimeError):
    """A served process did not start, is not running, or did not exit in time."""


class ServedProcess:
    """One restartable child process (see the module docstring). ``name`` names it in errors
    ("broker b1"). Drive it from one event loop, one call at a time. Equal only to itself."""

    def __init__(self, name: str, log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self.process: asyncio.subprocess.Process | None = None
        # What the process printed "<what> on <where>" about, at its last start.
        self.printed: dict[str, str] = {}
        self.starts = 0
        # True between pause() (SIGSTOP) and resume() (SIGCONT).
        self.paused = False
        self._stdout_task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.returncode

    @property
    def pid(self) -> int:
        if self.process is None:
            raise ServedProcessError(f"{self.name}: never started")
        return self.process.pid

    async def spawn(
        self,
        python_args: Sequence[str],
        *,
        expect: Collection[str],
        ready_timeout_s: float,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> dict[str, str]:
        """Run ``python <python_args>`` and wait until it printed a ``<what> on <where>`` line
        for every ``what`` in ``expect``: returns ``printed``. If it exits first or
        ``ready_timeout_s`` passes, it is killed and ServedProcessError raised with its log's
        tail."""
        if self.running:
            raise ServedProcessError(f"{self.name}: already running")
        child_env = {**os.environ, **(env or {})}
        # The child imports the same code as this process, installed or not.
        child_env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [PACKAGE_PARENT, child_env.get("PYTHONPATH")])
        )
        with _open_log(self.log_path) as log:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable,
                *python_args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,  # A file: an unread pipe would fill with logs and stall it.
                env=child_env,
                cwd=cwd,
            )
        self.starts += 1
        self.paused = False
        self.printed = {}
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._stdout_task = asyncio.create_task(
            self._read_stdout(ready, frozenset(expect)), name=f"{self.name} stdout"
        )
        try:
            async with asyncio.timeout(ready_timeout_s):
                await ready
        except (TimeoutError, ServedProcessError) as err:
            await self.kill()
            if ready.done() and not ready.cancelled():
                ready.exception()  # Retrieved: its exit is reported below.
            raise ServedProcessError(
                f"{self.name} did not start ({err or 'timed out'}):\n{self.log_tail()}"
            ) from err
        except BaseException:
            await self.kill()
            raise
        return self.printed

    async def kill(self) -> None:
        """kill -9 (nothing handed off or flushed); wait for it to exit."""
        proc = self.process
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()
        self.paused = False
        await self._reap()

    async def terminate(self, timeout_s: float = exit_timeout_s_default) -> int:
        """SIGTERM and wait for the exit code; killed, and ServedProcessError raised, if it is
        still running after ``timeout_s``."""
        proc = self.process
        if proc is None or proc.returncode is not None:
            raise ServedProcessError(f"{self.name}: not running")
        if self.paused:
            self.resume()  # A stopped process would not act on SIGTERM.
        proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(timeout_s):
                code = await proc.wait()
        except TimeoutError:
            dump = await self._dump_tasks()
            await self.kill()
            # The dump's head holds the main task (what the exit waits on): it goes into the
            # error whole, up to log_tail_bytes, as the log may not outlive the run.
            where = f"its tasks dumped in {self.log_path}" if dump else "no task dump"
            shown = dump[:log_tail_bytes] if dump else self.log_tail()
            raise ServedProcessError(
                f"{self.name} still running {timeout_s}s after SIGTERM ({where}):\n{shown}"
            ) from None
        await self._reap()
        return code

    async def _dump_tasks(self) -> str:
        """Ask the running process for its task dump and wait (bounded) until its log holds
        the dump's end; the dump ("" if none came). A process without the handler dies of
        SIGUSR1: it is being killed anyway."""
        proc = self.process
        if proc is None or proc.returncode is not None:
            return ""
        start = self.log_path.stat().st_size if self.log_path.exists() else 0
        proc.send_signal(task_dump.DUMP_SIGNAL)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + task_dump_wait_s_max
        while proc.returncode is None and loop.time() < deadline:
            with self.log_path.open("rb") as log:
                log.seek(start)
                written = log.read().decode(errors="replace")
            begin = written.find(task_dump.BEGIN_MARKER)
            end = written.find(task_dump.END_MARKER, max(begin, 0))
            if begin >= 0 and end >= 0:
                return written[begin : end + len(task_dump.END_MARKER)]
            await asyncio.sleep(task_dump_poll_s)
        return ""

    def pause(self) -> None:
        """SIGSTOP: it answers nothing (its sockets stay open), and does not know."""
        proc = self.process
        if proc is None or proc.returncode is not None:
            raise ServedProcessError(f"{self.name}: not running")
        proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """SIGCONT a paused process (a no-op if it has exited meanwhile)."""
        proc = self.process
        if proc is not None and proc.returncode is None:
            proc.send_signal(signal.SIGCONT)
        self.paused = False

    def kill_now(self) -> None:
        """SIGKILL synchronously, without waiting (for teardown paths)."""
        proc = self.process
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        self.paused = False

    def log_tail(self, size: int = log_tail_bytes) -> str:
        try:
            return self.log_path.read_bytes()[-size:].decode(errors="replace")
        except OSError as err:
            return f"(no log: {err})"

    async def _read_stdout(self, ready: asyncio.Future[None], expect: frozenset[str]) -> None:
        """Record the ``<what> on <where>`` lines until every expected one was printed
        (resolving ``ready``), copying stdout into the log until the process exits. Fails
        ``ready`` if it exits first."""
        proc = self.process
        assert proc is not None and proc.stdout is not None
        with _open_log(self.log_path) as log:
            while line := await proc.stdout.readline():
                if not ready.done():
                    what, sep, where = line.decode(errors="replace").strip().partition(" on ")
                    if sep:
                        self.printed.setdefault(what, where)
                    if expect <= self.printed.keys():
                        ready.set_result(None)
                log.write(b"[stdout] " + line)
                log.flush()
        code = await proc.wait()
        if not ready.done():
            ready.set_exception(ServedProcessError(f"exited with status {code} before serving"))

    async def _reap(self) -> None:
        task, self._stdout_task = self._stdout_task, None
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)


def _open_log(path: Path) -> IO[bytes]:
    # Appends of a line or two, from tests: not worth a thread.
    return open(path, "ab")
