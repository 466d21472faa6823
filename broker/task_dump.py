"""On SIGUSR1, write every asyncio task of the process, with its stack, to stderr (the log).

A process that stops making progress without failing (an RPC waiting on a peer, a lock held by
a stuck task) says nothing in its log; the dump shows what each task is waiting on, without
stopping the process. ``gazette serve`` and ``gazette-consumer serve`` install it; the soak
signals every process when a fault does not recover, so that its logs say why.
"""

from __future__ import annotations

import asyncio
import io
import linecache
import signal
import sys
from types import FrameType
from typing import Final, TextIO

# Frames printed per task (its innermost ones): enough to see what it waits on.
frames_max: Final = 12
# Coroutines followed down a task's await chain (a bound on a malformed, cyclic chain).
chain_depth_max: Final = 256

DUMP_SIGNAL: Final = signal.SIGUSR1
# The start of the dump's first line, and its last line (what a reader of the log looks for).
BEGIN_MARKER: Final = "--- task dump: "
END_MARKER: Final = "--- end of task dump ---"


def install(loop: asyncio.AbstractEventLoop | None = None) -> None:
    """Dump the loop's tasks whenever the process gets SIGUSR1."""
    (loop or asyncio.get_running_loop()).add_signal_handler(DUMP_SIGNAL, dump_tasks)


def dump_tasks(out: TextIO | None = None) -> int:
    """Write every task of the running loop and its stack to ``out`` (stderr); how many."""
    tasks = sorted(asyncio.all_tasks(), key=lambda t: t.get_name())
    buf = io.StringIO()
    buf.write(f"{BEGIN_MARKER}{len(tasks)} task(s) ---\n")
    for task in tasks:
        buf.write(f"- {task.get_name()}: {task!r:.300}\n")
        for line in _stack_lines(task):
            buf.write(f"    {line}\n")
    buf.write(f"{END_MARKER}\n")
    stream = out if out is not None else sys.stderr
    stream.write(buf.getvalue())
    stream.flush()
    return len(tasks)


def _stack_lines(task: asyncio.Task[object]) -> list[str]:
    """Where ``task`` is, outermost frame first: down the chain of coroutines it awaits (a
    suspended task's own stack is its outermost coroutine's frame alone, which says only that
    it awaits something). (Not Task.print_stack: it fails on frames without a line number,
    which compiled coroutines, grpc's among them, have.)"""
    frames, innermost = _await_chain(task)
    if not frames:
        frames = task.get_stack(limit=frames_max)
    lines = []
    for frame in frames[-frames_max:]:
        code, lineno = frame.f_code, frame.f_lineno
        where = f"{code.co_filename}:{lineno if lineno is not None else '?'} in {code.co_name}"
        if lineno is not None:
            source = linecache.getline(code.co_filename, lineno, frame.f_globals).strip()
            if source:
                where += f": {source}"
        lines.append(where)
    if lines and innermost:
        lines.append(f"awaiting {innermost}")
    return lines or ["(no frames: not started, or done)"]


def _await_chain(task: asyncio.Task[object]) -> tuple[list[FrameType], str]:
    """The frames of the coroutines (generators, async generators) ``task`` is suspended in,
    outermost first, and what the innermost one awaits if that has no frame (a future, a
    compiled coroutine), by its type's name ("" if nothing)."""
    frames: list[FrameType] = []
    obj: object = task.get_coro()
    for _ in range(chain_depth_max):
        frame = _first_attr(obj, ("cr_frame", "gi_frame", "ag_frame"))
        if not isinstance(frame, FrameType):
            return frames, type(obj).__qualname__ if frames and obj is not None else ""
        frames.append(frame)
        obj = _first_attr(obj, ("cr_await", "gi_yieldfrom", "ag_await"))
        if obj is None:
            break
    return frames, ""


def _first_attr(obj: object, names: tuple[str, ...]) -> object:
    for name in names:
        value = getattr(obj, name, None)
        if value is not None:
            return value
    return None
