"""A `gazette serve` whose stop overruns `--stop-timeout` says where it is stuck and exits.

Here etcd hangs (SIGSTOP) while the broker stops: its lease revoke waits for etcd's request
timeout (10 s), longer than the stop may take; and the hand-off's announcement to etcd is cut at
the hand-off's bound rather than waiting that long too. The broker is not left running until
someone kills it with nothing in its log: the watchdog (broker/serve_watchdog.py) writes an
error, every thread's stack and every asyncio task's, and exits with EXIT_STOP_TIMEOUT.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator

import pytest

from broker import task_dump
from broker.serve_watchdog import EXIT_STOP_TIMEOUT
from broker.testing.process_cluster import ProcessCluster

pytestmark = [
    pytest.mark.etcd,
    pytest.mark.skipif(shutil.which("etcd") is None, reason="etcd not installed"),
]

STOP_TIMEOUT_S = 2.0
HANDOFF_TIMEOUT_S = 1.0
# From SIGTERM to exit: the hand-off's bound (its announcement to etcd included), then the
# stop's, with room for loaded cores: below etcd's request timeout (10 s), so that neither
# may wait a hung etcd out.
EXIT_BOUND_S = 8.0
# How long terminate() waits before it kills the broker (and fails the test).
TERMINATE_WAIT_S = 30.0


@pytest.fixture
async def cluster() -> AsyncIterator[ProcessCluster]:
    args = ["--stop-timeout", str(STOP_TIMEOUT_S), "--handoff-timeout", str(HANDOFF_TIMEOUT_S)]
    async with ProcessCluster([("zone-a", "brk-solo")], extra_args=args) as c:
        yield c


async def test_a_stop_stuck_on_a_hung_etcd_dumps_and_exits_at_its_bound(
    cluster: ProcessCluster,
) -> None:
    b = cluster.broker("brk-solo")
    cluster.etcd.pause()
    try:
        code, elapsed_s = await cluster.terminate(b, timeout_s=TERMINATE_WAIT_S)
    finally:
        cluster.etcd.resume()
    log = b.log_path.read_text()
    assert code == EXIT_STOP_TIMEOUT, log[-3000:]
    assert elapsed_s < EXIT_BOUND_S
    assert "broker stop overran its bound" in log
    # Thread stacks (faulthandler) and asyncio tasks (task_dump): where it was stuck.
    assert "Current thread" in log or "Thread 0x" in log, log[-3000:]
    assert task_dump.END_MARKER in log, log[-3000:]


async def test_a_stop_within_its_bound_exits_0(cluster: ProcessCluster) -> None:
    b = cluster.broker("brk-solo")
    code, _ = await cluster.terminate(b, timeout_s=TERMINATE_WAIT_S)
    assert code == 0, b.log_tail()
    assert "broker stop overran its bound" not in b.log_path.read_text()
