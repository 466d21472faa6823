"""A served process that does not exit after SIGTERM is asked for its task dump before it is
killed, so that the error (and the process's log) says what its stop was waiting on.

The soak found a broker still running 60 s after SIGTERM in a rolling restart, killed with
nothing in its log after "stopping local journal replica": the hang could not be diagnosed.
Here a real child process ignores SIGTERM while a named task waits forever. (A soak failure
reported the dump's tail, without the task that held the exit: the error carries its head.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.testing.served_process import ServedProcess, ServedProcessError

STUCK = """
import asyncio, signal, sys
from broker import task_dump

async def main():
    loop = asyncio.get_running_loop()
    task_dump.install(loop)
    loop.add_signal_handler(signal.SIGTERM, lambda: None)  # The stop that never ends.
    stuck = asyncio.create_task(asyncio.Event().wait(), name="a-waiting-for-godot")
    # Many more tasks, whose stacks fill far more of the dump than the error shows: the dump
    # sorts tasks by name, so the stuck one comes first (as a process's main task does).
    fillers = [asyncio.create_task(asyncio.Event().wait(), name=f"z-filler-{i:03d}")
               for i in range(200)]
    print("serving on nowhere", flush=True)
    await stuck

asyncio.run(main())
"""


async def test_a_process_stuck_after_sigterm_dumps_its_tasks_then_is_killed(
    tmp_path: Path,
) -> None:
    log = tmp_path / "stuck.log"
    proc = ServedProcess("stuck process", log)
    await proc.spawn(["-c", STUCK], expect={"serving"}, ready_timeout_s=30.0)
    with pytest.raises(ServedProcessError) as err:
        await proc.terminate(timeout_s=0.5)
    assert f"its tasks dumped in {log}" in str(err.value)
    # The error carries the dump's head (the log may not outlive the run): the stuck task.
    assert "--- task dump: 202 task(s) ---" in str(err.value)
    assert "a-waiting-for-godot" in str(err.value)
    assert not proc.running
    text = log.read_text()
    assert "--- end of task dump ---" in text
    assert "a-waiting-for-godot" in text


async def test_a_process_without_the_dump_handler_is_still_killed(tmp_path: Path) -> None:
    script = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('serving on nowhere', flush=True)\n"
        "time.sleep(3600)\n"
    )
    proc = ServedProcess("plain process", tmp_path / "plain.log")
    await proc.spawn(["-c", script], expect={"serving"}, ready_timeout_s=30.0)
    with pytest.raises(ServedProcessError, match="no task dump"):
        await proc.terminate(timeout_s=0.5)
    assert not proc.running and proc.returncode is not None
