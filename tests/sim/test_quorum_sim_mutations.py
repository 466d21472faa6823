"""The checker catches a broken protocol: each mutation (tests/sim/quorum_mutations.py)
breaks one safety rule, and some seed among those `make test` runs must expose it."""

from __future__ import annotations

import pytest

from broker.quorum.rules import Rules
from broker.quorum.sim import run_seed
from tests.sim.quorum_mutations import MUTATIONS
from tests.sim.test_quorum_sim import SEEDS


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.__name__)
def test_the_simulation_catches_the_mutation(mutation: type[Rules]) -> None:
    for seed in range(SEEDS):
        result = run_seed(seed, rules=mutation())
        if result.violation is not None:
            break
    else:
        pytest.fail(f"{mutation.__name__}: no violation in {SEEDS} seeds")
    # Caught by an invariant or a core's own protocol check, never by a crash of the sim.
    assert result.violation.invariant in (
        "agreement",
        "leader completeness",
        "acknowledged append lost",
        "protocol",
        "monotonic commit",
        "one leader",
        "registers",
    ), result.violation
