"""A deterministic, seeded simulation of the quorum protocol (no sockets, no clocks).

`run_seed(seed)` builds a world of members, coordinators, a term register, a snapshot store and
clients on a simulated network that drops, delays, duplicates, reorders and partitions; crashes
and restarts members and coordinators at random points; checks the protocol's invariants after
every step (checker.py); then heals everything and requires progress within a bound. The same
seed replays the same run exactly: `python -m broker.quorum.sim --seed N --trace`.
"""

from broker.quorum.sim.checker import Violation
from broker.quorum.sim.world import SimConfig, SimResult, run_seed

__all__ = ["SimConfig", "SimResult", "Violation", "run_seed"]
