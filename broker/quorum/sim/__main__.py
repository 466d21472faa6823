"""`python -m broker.quorum.sim`: run seeds of the quorum simulation.

  --seed N [--trace]      one seed; --trace prints every step (a failing seed replays exactly)
  --seeds COUNT [--first N]   COUNT seeds from N; prints failing seeds and a summary
  --rules module:Class    run with another Rules class (e.g. a mutation from tests/sim)

Exit status 1 if any seed failed.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time

from broker.quorum.rules import CORRECT_RULES, Rules
from broker.quorum.sim.world import run_seed


def _load_rules(spec: str) -> Rules:
    module, _, name = spec.partition(":")
    cls = getattr(importlib.import_module(module), name)
    rules = cls()
    if not isinstance(rules, Rules):
        raise SystemExit(f"--rules {spec}: not a broker.quorum.rules.Rules")
    return rules


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m broker.quorum.sim", description=__doc__)
    parser.add_argument("--seed", type=int, help="run this one seed")
    parser.add_argument("--seeds", type=int, default=1000, help="how many seeds to run")
    parser.add_argument("--first", type=int, default=0, help="the first seed of --seeds")
    parser.add_argument("--trace", action="store_true", help="print every step of --seed")
    parser.add_argument("--rules", help="module:Class of the Rules to run with")
    args = parser.parse_args(argv)
    rules = _load_rules(args.rules) if args.rules else CORRECT_RULES
    if args.seed is not None:
        result = run_seed(args.seed, rules=rules, trace=args.trace)
        if result.trace is not None:
            print("\n".join(result.trace))
        print(result.summary())
        return 0 if result.ok else 1
    failed = 0
    started = time.monotonic()
    steps = 0
    for seed in range(args.first, args.first + args.seeds):
        result = run_seed(seed, rules=rules)
        steps += result.steps
        if not result.ok:
            failed += 1
            print(result.summary(), flush=True)
            print(f"  replay: python -m broker.quorum.sim --seed {seed} --trace", flush=True)
    elapsed = time.monotonic() - started
    print(
        f"{args.seeds} seeds from {args.first}: {failed} failed; "
        f"{steps} steps in {elapsed:.1f} s ({steps / max(elapsed, 1e-9):.0f} steps/s)"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
