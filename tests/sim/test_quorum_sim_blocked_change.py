"""An unsettled ensemble change that can no longer elect falls back to the ensemble it left
(Rules.next_ensemble, `blocked`; docs/design/quorum.md, "Built (branch f16-live)").

On the seeds of main a replacement removed a member first ({A,B,C} -> {A,B}) while one of the two
remaining members had just lost its disk (the leader's knowledge of it lagged, or the claim
reached the register long after it was decided): {A,B} has one voter, the change never
settles, and every later claim kept {A,B}, so no leader was elected again. Found on main
with 3 failures in 20,000 seeds. The simulation now also provokes it on purpose
(double_faults.wipe_after_remove_first), so that keeping a blocked change fails within the seeds
`make test` runs.
"""

from __future__ import annotations

import pytest

from broker.quorum.sim import run_seed
from tests.sim.quorum_mutations import KeepABlockedChange
from tests.sim.test_quorum_sim import SEEDS

REMOVED_FIRST_THEN_LOST_SEEDS = (5533, 7949, 9439)


@pytest.mark.parametrize("seed", REMOVED_FIRST_THEN_LOST_SEEDS)
def test_a_blocked_remove_first_step_falls_back_and_elects(seed: int) -> None:
    result = run_seed(seed)
    assert result.ok, result.summary()
    assert result.fallbacks > 0, result.summary()  # the register went back to `previous`


def test_keeping_a_blocked_change_never_elects_again() -> None:
    """The rule before the fix, as a mutation: the same seeds end without a leader."""
    for seed in REMOVED_FIRST_THEN_LOST_SEEDS:
        result = run_seed(seed, rules=KeepABlockedChange())
        assert result.violation is not None, result.summary()
        assert result.violation.invariant == "liveness", result.violation


def test_keeping_a_blocked_change_fails_within_the_seeds_make_test_runs() -> None:
    for seed in range(SEEDS):
        broken = run_seed(seed, rules=KeepABlockedChange())
        if broken.violation is not None:
            break
    else:
        pytest.fail(f"KeepABlockedChange: no violation in {SEEDS} seeds")
    assert broken.violation.invariant == "liveness", broken.violation
    assert broken.removed_then_lost > 0, broken.summary()  # the path that provokes it
    fixed = run_seed(seed)
    assert fixed.ok and fixed.fallbacks > 0, fixed.summary()
