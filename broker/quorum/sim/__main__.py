"""`python -m broker.quorum.sim`: run seeds of the quorum simulation.

  --seed N [--trace]      one seed; --trace prints every step (a failing seed replays exactly)
  --seeds COUNT [--first N] [--jobs J]   COUNT seeds from N (in J processes); prints failing
                          seeds, how to replay them, and a summary
  --rules module:Class    run with another Rules class (e.g. a mutation from tests/sim)

Exit status 1 if any seed failed.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from broker.quorum.rules import CORRECT_RULES, Rules
from broker.quorum.sim.world import run_seed


def _load_rules(spec: str) -> Rules:
    module, _, name = spec.partition(":")
    cls = getattr(importlib.import_module(module), name)
    rules = cls()
    if not isinstance(rules, Rules):
        raise SystemExit(f"--rules {spec}: not a broker.quorum.rules.Rules")
    return rules


def _run_part(part: tuple[range, str | None]) -> list[tuple[int, int, str]]:
    """(seed, steps, failure summary or "") for each seed of `part`."""
    seeds, rules_spec = part
    rules = _load_rules(rules_spec) if rules_spec else CORRECT_RULES
    out = []
    for seed in seeds:
        result = run_seed(seed, rules=rules)
        out.append((seed, result.steps, "" if result.ok else result.summary()))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m broker.quorum.sim", description=__doc__)
    parser.add_argument("--seed", type=int, help="run this one seed")
    parser.add_argument("--seeds", type=int, default=1000, help="how many seeds to run")
    parser.add_argument("--first", type=int, default=0, help="the first seed of --seeds")
    parser.add_argument("--trace", action="store_true", help="print every step of --seed")
    parser.add_argument("--rules", help="module:Class of the Rules to run with")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes for --seeds")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.seeds < 0:
        parser.error("--jobs must be at least 1 and --seeds not negative")
    rules_arg = f" --rules {args.rules}" if args.rules else ""
    rules = _load_rules(args.rules) if args.rules else CORRECT_RULES
    if args.seed is not None:
        result = run_seed(args.seed, rules=rules, trace=args.trace)
        if result.trace is not None:
            print("\n".join(result.trace))
        print(result.summary())
        return 0 if result.ok else 1
    started = time.monotonic()
    seeds = range(args.first, args.first + args.seeds)
    if args.jobs > 1:
        # Seeds are independent and deterministic: chunks run in worker processes.
        chunk = max(1, min(1000, args.seeds // (args.jobs * 4)))
        parts = [(seeds[i : i + chunk], args.rules) for i in range(0, len(seeds), chunk)]
        with ProcessPoolExecutor(args.jobs) as pool:
            outcomes = [o for part in pool.map(_run_part, parts) for o in part]
    else:
        outcomes = _run_part((seeds, args.rules))
    failed = 0
    steps = 0
    for seed, seed_steps, failure in outcomes:
        steps += seed_steps
        if failure:
            failed += 1
            print(failure, flush=True)
            print(
                f"  replay: python -m broker.quorum.sim --seed {seed} --trace{rules_arg}",
                flush=True,
            )
    elapsed = time.monotonic() - started
    print(
        f"{args.seeds} seeds from {args.first}: {failed} failed; "
        f"{steps} steps in {elapsed:.1f} s ({steps / max(elapsed, 1e-9):.0f} steps/s)"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
