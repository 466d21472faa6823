"""Benchmark: the allocator solver and planner on clusters of various sizes.

For each size, prints the time to solve a fresh cluster (no current assignments), to solve
from scattered current assignments (every item's replicas on random members: the worst case for
the solver's aggregation of interchangeable items), also with the dense network alone, to
re-solve from the solution (the fixed point), and to plan the transactions of a fresh
cluster's first round.

    .venv/bin/python benchmarks/bench_allocator.py [--sizes 100x3,1000x10,1000x30]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from typing import TypeVar

from broker.allocator import MemberId, Solution, build_state, plan, solve
from broker.allocator.state import Item, Member, item_key, member_key
from broker.keyspace.backend import KeyValue

ROOT = "/bench"
T = TypeVar("T")


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    started = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - started


def bench(n_items: int, n_members: int, replication: int, zones: int, seed: int) -> None:
    rng = random.Random(seed)
    members = {MemberId(f"zone-{i % zones}", f"member-{i:04d}"): n_items for i in range(n_members)}
    items = {f"journal/{i:05d}": replication for i in range(n_items)}
    ids = sorted(members)
    scattered = {i: rng.sample(ids, min(replication, n_members)) for i in items}

    fresh, t_fresh = timed(lambda: solve(items, members, {}))
    from_scattered, t_scattered = timed(lambda: solve(items, members, scattered))
    _, t_dense = timed(lambda: solve(items, members, scattered, dense=True))
    again, t_again = timed(lambda: solve(items, members, fresh.desired))
    assert again == fresh, "the solution must be a fixed point"

    state = build_state(
        ROOT,
        1,
        [Item(i, r, KeyValue(item_key(ROOT, i), b"", 1, 1, 1)) for i, r in items.items()],
        [
            Member(m, limit, KeyValue(member_key(ROOT, m), b"", n + 1, n + 1, 1))
            for n, (m, limit) in enumerate(members.items())
        ],
        [],
    )
    leader = state.leader
    assert leader is not None
    p, t_plan = timed(lambda: plan(state, fresh.desired, leader, is_consistent=lambda *_: True))
    print(
        f"{n_items:>6} items x {n_members:>3} members (R={replication}, {zones} zones): "
        f"solve fresh {t_fresh * 1e3:7.1f} ms | scattered {t_scattered * 1e3:7.1f} ms "
        f"({'pooled' if from_scattered.pooled else 'dense fallback'}; dense only "
        f"{t_dense * 1e3:.0f} ms) | "
        f"re-solve {t_again * 1e3:8.1f} ms | plan {t_plan * 1e3:7.1f} ms "
        f"({len(p.txns)} txns, {p.added} adds) | placed {_placed(fresh)}"
    )


def _placed(solution: Solution) -> str:
    return f"{solution.replicas_placed}/{solution.replicas_wanted}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="100x3,1000x10,1000x30,1000x100,3000x100")
    parser.add_argument("--replication", type=int, default=3)
    parser.add_argument("--zones", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    for size in args.sizes.split(","):
        n_items, n_members = (int(x) for x in size.split("x"))
        bench(n_items, n_members, args.replication, args.zones, args.seed)


if __name__ == "__main__":
    main()
