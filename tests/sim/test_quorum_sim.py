"""The quorum protocol under the deterministic simulation: 1,000 seeds, every invariant after
every step (broker/quorum/sim/checker.py), liveness once the faults stop. `make sim` runs more.

A failure prints the seed's violation, the end of its trace and the command that replays it.
"""

from __future__ import annotations

import pytest

from broker.quorum.sim import SimResult, run_seed
from broker.quorum.sim.__main__ import main

SEEDS = 1000
CHUNKS = 4


def failure_report(result: SimResult) -> str:
    replay = run_seed(result.seed, trace=True)  # a seed replays exactly
    tail = "\n".join((replay.trace or [])[-80:])
    return (
        f"{result.summary()}\n--- last steps ---\n{tail}\n"
        f"replay: python -m broker.quorum.sim --seed {result.seed} --trace"
    )


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_invariants_hold_and_progress_resumes(chunk: int) -> None:
    per_chunk = SEEDS // CHUNKS
    delivered: dict[str, int] = {}
    acked = crashes = disk_losses = checks = mismatches = deposed_wipes = late = 0
    ensemble_changes = removed_first = 0
    for seed in range(chunk * per_chunk, (chunk + 1) * per_chunk):
        result = run_seed(seed)
        if not result.ok:
            pytest.fail(failure_report(result))
        acked += result.acked
        crashes += result.crashes
        disk_losses += result.disk_losses
        deposed_wipes += result.deposed_wipes
        late += result.late_deliveries
        checks += result.registers_verified
        mismatches += result.mismatches_verified
        ensemble_changes += result.ensemble_changes
        removed_first += result.removed_first
        for kind, count in result.delivered.items():
            delivered[kind] = delivered.get(kind, 0) + count
    # The seeds took every path of the protocol, not just the happy one.
    for kind in (
        "NewTerm",
        "BecomeLeader",
        "AddFollower",
        "Truncate",
        "Snapshot",
        "Replicate",
        "ReplicaResponse.ok",
        "ReplicaResponse.gap",
        "ReplicaResponse.stale",
        "ReplicaResponse.lost",
        "Heartbeat",
    ):
        assert delivered.get(kind, 0) > 0, f"no {kind} in {per_chunk} seeds: {delivered}"
    assert acked > 10 * per_chunk and crashes > per_chunk
    assert disk_losses > per_chunk // 10, disk_losses  # members came back with empty logs
    # Disks wiped beside a deposed leader (a lost member's fence), old messages re-delivered
    # after restarts (a lost member's alignment).
    assert deposed_wipes > per_chunk // 50 and late > per_chunk, (deposed_wipes, late)
    # Compare-and-set appends passed and failed their register checks, and were verified.
    assert checks > per_chunk // 4 and mismatches > per_chunk // 4, (checks, mismatches)
    # The register's ensemble moved (members added and removed, one per term).
    assert ensemble_changes > per_chunk // 2, ensemble_changes
    # Some replacements of a crashed member removed it first (ensemble_step).
    assert removed_first > 0, removed_first


def test_a_seed_replays_exactly() -> None:
    first = run_seed(17, trace=True)
    second = run_seed(17, trace=True)
    untraced = run_seed(17)
    assert first.trace == second.trace and first.trace
    assert (first.steps, first.acked, first.reads, first.terms) == (
        untraced.steps,
        untraced.acked,
        untraced.reads,
        untraced.terms,
    )


def test_the_command_line_replays_a_failing_seed_with_its_trace(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rules = "tests.sim.quorum_mutations:CommitWithoutMajority"
    assert main(["--seed", "0", "--rules", rules, "--trace"]) == 1
    out = capsys.readouterr().out
    assert " CHAOS " in out and "VIOLATION" in out and "seed 0: VIOLATION" in out
    assert main(["--seeds", "3", "--first", "0"]) == 0
    assert "3 seeds from 0: 0 failed" in capsys.readouterr().out
