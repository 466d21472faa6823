"""The bound of a stopping `gazette serve`: past it the process says where it is stuck and exits.

Every step of a broker's stop has a bound of its own (the RPC drain's grace, a replica's waits
for its pipeline and spool, the pipeline's teardown, the persister's drain, etcd's request
timeout), but what follows them is not bounded by anyone: the quorum nodes' stop, tasks that
outlive their cancellation, and, once the event loop ends, asyncio's wait for every worker
thread (a store write or a disk that hangs holds it forever). A process still running long
after SIGTERM is then killed by whoever waits for it, with nothing in its log that says why.

`StopWatchdog` is a daemon thread started when the stop begins (after the hand-off). If the
process has not exited ``stop_wait_s`` later, it writes an error, every thread's stack
(faulthandler: works even if the event loop itself is blocked) and, if the loop still runs,
every asyncio task's (task_dump), then ends the process at once with ``EXIT_STOP_TIMEOUT``:
an unclean exit, as a kill -9 is, which a broker must survive anyway (acknowledged appends are
on every replica; durable spools are recovered at the next start; its lease expires).
"""

from __future__ import annotations

import asyncio
import faulthandler
import os
import sys
import threading
from typing import Final

from broker import task_dump
from broker.logging import get_logger

log = get_logger(__name__)

# How long a broker may take from the end of its hand-off to its exit. Far more than its
# stop's own bounds take together in practice (a stop takes well under a second normally).
stop_wait_s_default: Final = 60.0
# How long the watchdog waits for the event loop to write its task dump (a blocked loop never
# does; the thread stacks are written regardless).
task_dump_wait_s: Final = 2.0
# The exit status of a stop that overran its bound (sysexits' EX_SOFTWARE: an internal error).
EXIT_STOP_TIMEOUT: Final = 70


class StopWatchdog:
    """See the module docstring. ``start`` once the stop begins; nothing needs stopping it:
    the thread is a daemon and ends with the process."""

    def __init__(self, stop_wait_s: float, loop: asyncio.AbstractEventLoop) -> None:
        if stop_wait_s <= 0:
            raise ValueError(f"stop_wait_s: must be > 0 (got {stop_wait_s})")
        self.stop_wait_s = stop_wait_s
        self._loop = loop
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="stop watchdog", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # Never set: the process exiting ends this thread (a daemon) while it waits.
        threading.Event().wait(self.stop_wait_s)
        log.error(
            "broker stop overran its bound: exiting now, unclean (thread stacks and asyncio"
            " tasks follow)",
            stop_wait_s=self.stop_wait_s,
            exit_code=EXIT_STOP_TIMEOUT,
        )
        self._dump()
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(EXIT_STOP_TIMEOUT)

    def _dump(self) -> None:
        sys.stderr.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        dumped = threading.Event()

        def dump_tasks() -> None:
            try:
                task_dump.dump_tasks()
            finally:
                dumped.set()

        try:
            self._loop.call_soon_threadsafe(dump_tasks)
        except RuntimeError:  # The loop is closed: asyncio's own teardown is what hangs.
            return
        if not dumped.wait(task_dump_wait_s):
            log.error("asyncio tasks not dumped: the event loop is blocked")
