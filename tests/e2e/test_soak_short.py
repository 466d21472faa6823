"""A short soak inside the suite: the stream-sum workload on real processes (etcd, three brokers
in two zones, three consumer processes, a durable PostgreSQL of its own, an S3 server), through
every fault kind of the soak once but three quorum ones (eleven faults), with the soak's checks
after each: no sequence violation in any shard, every final sum verified once with the right
value, every journal readable whole and identical through every broker over gRPC and HTTP,
persisted fragments holding the journal's bytes, appends and consumers recovering within
bounds.

It runs in `mixed` replication mode: a chunk journal and a recovery log of replication 3 are
quorum journals (their committed range is also read from each member itself after every
fault), the other journals all-replicas, so that every broker fault hits both modes. Of the
quorum faults, the leader zombie (a new leader within the lease TTL + 3 s; the resumed zombie
commits nothing below it) and a follower stopped under appends (no append stalls 2 s) run here;
the leader kill and the members restarted in turn only in the long soak.

The store outages are short (8 s instead of the long soak's 30 s) and every recovery bound is
tighter, so that the test stays within its budget; everything else is the soak's own code
(`python -m examples.stream_sum.soak`). On failure the message lists every finding (fault,
kind, what exactly), and each fault's progress line is printed.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from e2e_workload import requires_etcd

from examples.stream_sum.soak.context import Timeouts
from examples.stream_sum.soak.faults import FAULTS, FaultConfig
from examples.stream_sum.soak.run import SoakConfig, run_soak
from examples.stream_sum.soak.stack import StackConfig

pytestmark = [
    pytest.mark.serial,
    pytest.mark.etcd,
    pytest.mark.postgres,
    requires_etcd,
    pytest.mark.skipif(
        not Path("/usr/lib/postgresql/15/bin/initdb").exists(),
        reason="PostgreSQL 15 server binaries not installed: run `make system-deps`",
    ),
    pytest.mark.skipif(shutil.which("runuser") is None and os.getuid() == 0, reason="no runuser"),
]

SEED = int(os.environ.get("GAZETTE_TEST_SEED", "12"))
# Every kind once; the broker restarts, which take the longest to settle, come last.
FAULT_ORDER = (
    "shard-kill-standby",
    "shard-kill-no-standby",
    "etcd-restart",
    "s3-outage",
    "file-store-outage",
    "postgres-restart",
    "broker-zombie",
    "broker-primary-kill",
    "broker-pair-kill",
    "broker-rolling-restart",
    "quorum-leader-zombie",
)
# The quorum faults only the long soak runs (time: each adds 20-30 s): leader kill -9 (the
# zombie's leader check is the same bound), a follower stopped under appends, members
# restarted in turn (the rolling restart's).
NOT_HERE = ("quorum-leader-kill", "quorum-follower-stop", "quorum-member-restarts")


@pytest.mark.timeout(295)
async def test_a_short_soak_of_every_fault_kind_finds_nothing() -> None:
    assert sorted((*FAULT_ORDER, *NOT_HERE)) == sorted(FAULTS) and len(FAULT_ORDER) >= 11
    lines: list[str] = []

    def out(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    config = SoakConfig(
        faults=FAULT_ORDER,
        seed=SEED,
        chunks_per_s=30.0,
        sum_deadline_s=25.0,
        # Healthy, the eleven faults take about two minutes; failing ones wait out their
        # bounds, and no fault starts after this, so that the report is printed within the
        # budget.
        faults_budget_s=180.0,
        faults_config=FaultConfig(store_outage_s=8.0, restart_delay_s=4.0),
        timeouts=Timeouts(append_s=25.0, progress_s=30.0, restore_s=35.0, exit_s=25.0),
        # A broker's own bounds (hand-off, then its stop watchdog) end within exit_s: a stop
        # that hangs is reported by the broker itself (thread stacks, tasks; exit 70), not cut
        # short by the harness's kill. A healthy stop takes well under a second.
        stack=StackConfig(handoff_timeout_s=15.0, stop_timeout_s=8.0, replication_mode="mixed"),
    )
    result = await run_soak(config, out=out)
    faults = [r for r in result.records if r.kind not in ("baseline", "final")]
    findings = "\n".join(f"[fault {where}] {finding}" for where, finding in result.findings)
    assert result.ok, f"{len(result.findings)} finding(s):\n{findings}"
    assert len(faults) == len(FAULT_ORDER)
    assert result.verified_sums > 0 and result.chunks > 0
