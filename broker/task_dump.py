"""On SIGUSR1, write every asyncio task of the process, with its stack, to stderr (the log).

A process that stops making progress without failing (an RPC waiting on a peer, a lock held by
a stuck task) says nothing in its log; the dump shows what each task is waiting on, without
stopping the process. ``gazette serve`` and ``gazette-consumer serve`` install it; the soak
signals every process when a fault does not recover, so that its logs say why.
"""

from __future__ import annotations

import asyncio
import io
import signal
import sys
from typing import Final, TextIO

# Frames printed per task (its innermost ones): enough to see what it waits on.
frames_max: Final = 12

DUMP_SIGNAL: Final = signal.SIGUSR1


def install(loop: asyncio.AbstractEventLoop | None = None) -> None:
    """Dump the loop's tasks whenever the process gets SIGUSR1."""
    (loop or asyncio.get_running_loop()).add_signal_handler(DUMP_SIGNAL, dump_tasks)


def dump_tasks(out: TextIO | None = None) -> int:
    """Write every task of the running loop and its stack to ``out`` (stderr); how many."""
    tasks = sorted(asyncio.all_tasks(), key=lambda t: t.get_name())
    buf = io.StringIO()
    buf.write(f"--- task dump: {len(tasks)} task(s) ---\n")
    for task in tasks:
        buf.write(f"- {task.get_name()}: {task!r:.300}\n")
        task.print_stack(limit=frames_max, file=buf)
    buf.write("--- end of task dump ---\n")
    stream = out if out is not None else sys.stderr
    stream.write(buf.getvalue())
    stream.flush()
    return len(tasks)
