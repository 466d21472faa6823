"""bench_consumer.py's report: medians, the pairs of each round, a distribution-free interval of
their median, the printed table, and the figures written with `--json`."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from bench_messages import Rate
from bench_stats import CONFIDENCE, median_interval

OVERHEAD_TARGET = 0.03
SHARD_TARGET = 100_000


@dataclass
class Result:
    rate: Rate
    transactions: int
    loop_cpu_s: float  # CPU time of the event loop's thread (the rest: worker threads).
    # With --steady-txns: CPU seconds over the window by thread group (thread_cpu_s).
    threads: dict[str, float] | None = None


def median_rate(rates: list[Rate], cpu: bool = False) -> float:
    return statistics.median(r.per_cpu_s if cpu else r.per_wall_s for r in rates)


def spread(rates: list[Rate]) -> str:
    walls = [r.per_wall_s for r in rates]
    return f"{min(walls) / 1e3:,.0f}-{max(walls) / 1e3:,.0f}k"


def report_row(name: str, rates: list[Rate], runs: list[Result] | None = None) -> None:
    gc_share = sum(r.gc_s for r in rates) / sum(r.wall_s for r in rates)
    line = (
        f"  {name:<30} {median_rate(rates):>9,.0f} msg/s ({spread(rates):>11})"
        f" {median_rate(rates, cpu=True):>9,.0f} msg/cpu-s  gc {gc_share:3.0%}"
    )
    if runs:
        loop_share = sum(r.loop_cpu_s for r in runs) / sum(r.rate.cpu_s for r in runs)
        txns = statistics.median(r.transactions for r in runs)
        line += f"  txns {txns:,.0f}  loop thread {loop_share:4.0%} of cpu"
    print(line)


def overhead(eo_rates: list[Rate], alo_rates: list[Rate]) -> dict[str, Any]:
    """Exactly-once against at-least-once: 1 - eo/alo of the medians, and of each round's pair
    (its median and interval), on the wall and the CPU."""
    pairs = list(zip(eo_rates, alo_rates, strict=True))
    walls = [1 - e.per_wall_s / a.per_wall_s for e, a in pairs]
    cpus = [1 - e.per_cpu_s / a.per_cpu_s for e, a in pairs]
    return {
        "wall": 1 - median_rate(eo_rates) / median_rate(alo_rates),
        "cpu": 1 - median_rate(eo_rates, cpu=True) / median_rate(alo_rates, cpu=True),
        "paired_wall": statistics.median(walls),
        "paired_cpu": statistics.median(cpus),
        "paired_wall_interval": median_interval(walls),
        "paired_cpu_interval": median_interval(cpus),
        "rounds_wall": walls,
        "rounds_cpu": cpus,
        "rounds_us_per_msg": [1e6 / e.per_cpu_s - 1e6 / a.per_cpu_s for e, a in pairs],
    }


def print_overhead(db: str, o: dict[str, Any]) -> None:
    verdict = "holds" if o["wall"] <= OVERHEAD_TARGET else "MISSED"
    print(
        f"  {db:<10} wall {o['wall']:6.1%} (paired {o['paired_wall']:6.1%})  cpu {o['cpu']:6.1%} "
        f"(paired {o['paired_cpu']:6.1%})   target <= {OVERHEAD_TARGET:.0%} wall: {verdict}"
    )
    wall_ci, cpu_ci = o["paired_wall_interval"], o["paired_cpu_interval"]
    if wall_ci is not None and cpu_ci is not None:
        print(
            f"  {'':<10} paired median's {CONFIDENCE:.0%} interval: wall {wall_ci[0]:.1%} to "
            f"{wall_ci[1]:.1%}, cpu {cpu_ci[0]:.1%} to {cpu_ci[1]:.1%}"
        )
    # Each round's pair, to pool rounds across runs (CPU us per message: eo - alo).
    per_round = "  ".join(
        f"{w:+.3f}/{c:+.3f}/{us:+.3f}"
        for w, c, us in zip(o["rounds_wall"], o["rounds_cpu"], o["rounds_us_per_msg"], strict=True)
    )
    print(f"  {'':<10} rounds (wall/cpu overhead, +us/msg): {per_round}")


def print_report(
    args: Any,
    engines: list[str],
    limits: dict[str, list[Rate]],
    configs: dict[str, dict[str, list[Result]]],
) -> None:
    print(f"limits (this process, this run; median of {args.rounds}, min-max):")
    for name, rates in limits.items():
        report_row(f"{name}{', no shard' if name.startswith('read') else ''}", rates)
    for config, results in configs.items():
        print(f"one shard, trivial count ({config}: input/publish):")
        for name, runs in results.items():
            report_row(name, [r.rate for r in runs], runs)
        print(
            "exactly-once overhead, 1 - eo/alo: of the medians, and the median of each round's "
            "pair (run side by side: steadier under other users' load)"
        )
        for db in engines:
            eo_rates = [r.rate for r in results[f"eo-{db}"]]
            o = overhead(eo_rates, [r.rate for r in results[f"alo-{db}"]])
            print_overhead(db, o)
            best = max(r.per_wall_s for r in eo_rates)
            print(
                f"  {'':<10} eo {median_rate(eo_rates):,.0f} msg/s (best {best:,.0f}), "
                f"target >= {SHARD_TARGET:,}"
            )
    rc = median_rate(limits["read-committed"], cpu=True)
    ru = median_rate(limits["read-uncommitted"], cpu=True)
    rc_us = 1e6 / rc - 1e6 / ru
    print(
        f"  (read-committed alone, no shard: {1 - rc / ru:.1%} fewer msg/cpu-s than "
        f"read-uncommitted, {rc_us:.2f} us more CPU per message)"
    )
    print("CPU per message (us, medians), and what exactly-once adds:")
    for config, results in configs.items():
        for db in engines:
            eo_us = 1e6 / median_rate([r.rate for r in results[f"eo-{db}"]], cpu=True)
            alo_us = 1e6 / median_rate([r.rate for r in results[f"alo-{db}"]], cpu=True)
            print(
                f"  {config:<20} {db:<10} eo {eo_us:.2f}  alo {alo_us:.2f}  +{eo_us - alo_us:.2f}"
                f": read-committed {rc_us:.2f} (its limit above), the rest "
                f"{eo_us - alo_us - rc_us:+.2f} (checkpoints, commits, ACKs, publishing)"
            )
    if args.steady_txns:
        print("CPU by thread over the steady windows (us per message, medians; /proc ticks):")
        for config, results in configs.items():
            for name, runs in results.items():
                groups = sorted({g for r in runs for g in (r.threads or {})})
                shares = {
                    g: statistics.median(
                        1e6 * (r.threads or {}).get(g, 0.0) / r.rate.count for r in runs
                    )
                    for g in groups
                }
                line = "  ".join(f"{g} {v:.3f}" for g, v in sorted(shares.items()) if v >= 0.0005)
                print(f"  {config:<20} {name:<14} {line}")


def rate_figures(rate: Rate) -> dict[str, float]:
    return {"per_wall_s": rate.per_wall_s, "per_cpu_s": rate.per_cpu_s, "count": rate.count}


def figures(
    engines: list[str],
    limits: dict[str, list[Rate]],
    configs: dict[str, dict[str, list[Result]]],
) -> dict[str, Any]:
    """The `--json` figures: every round's rates, and the overheads computed above."""
    out: dict[str, Any] = {
        "limits": {name: [rate_figures(r) for r in rates] for name, rates in limits.items()},
        "configs": {},
    }
    for config, results in configs.items():
        out["configs"][config] = {
            "runs": {
                name: [dict(rate_figures(r.rate), transactions=r.transactions) for r in runs]
                for name, runs in results.items()
            },
            "overhead": {
                db: overhead(
                    [r.rate for r in results[f"eo-{db}"]], [r.rate for r in results[f"alo-{db}"]]
                )
                for db in engines
            },
        }
    return out
