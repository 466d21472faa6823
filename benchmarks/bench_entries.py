"""The entries of benchmarks/results.json, built from each benchmark script's `--json` figures.

One entry per figure:

    {"name": "messages.publish", "label": "publish / msgspec", "title": ...,
     "value": 148130.0, "unit": "msg/s",
     "baseline": {"title": "msgspec encode+decode ...", "value": ..., "unit": "msg/s"},
     "ratio": value / baseline (wall clock: the headline),
     "cpu": {"value": ..., "baseline": ..., "unit": ..., "ratio": ...} (CPU-normalised),
     "target": {"ratio_min": 0.4, "text": ...} or null, "holds": bool or null,
     "interval_90": [low, high] or null (a distribution-free 90% interval of the median of
         each round's ratio, where the figure has rounds; its "ratio" stays value / baseline),
     "resolved": whether that interval lies wholly on one side of the target (null: no interval),
     "conditions": {"summary": "...", ... what the figure was measured under ...},
     "details": {...}}

Every ratio is of figures measured in the same run (the baseline beside the figure); `holds`
compares the wall-clock ratio with the target of issue #17; where the rounds' interval still
straddles the target, `resolved` is false: the run cannot tell (a loaded machine's rounds differ
by far more than 3%). Pure functions: bench_all.py adds the machine's and the run's conditions
to every entry's.
"""

from __future__ import annotations

import statistics
from typing import Any

from bench_stats import median_interval

Entry = dict[str, Any]
MIB = 1 << 20

# Issue #17's targets, as the least ratio of the figure to its baseline.
OVERHEAD_MAX = 0.03  # Exactly-once vs at-least-once: eo/alo >= 1 - 3%.
DERIVED_VS_NONE_MIN = 0.6


def entry(
    name: str,
    label: str,
    title: str,
    value: float,
    unit: str,
    baseline_title: str,
    baseline: float,
    target: tuple[float, str] | None,
    conditions: dict[str, Any],
    cpu: tuple[float, float | None, str] | None = None,
    details: dict[str, Any] | None = None,
    rounds: list[float] | None = None,
) -> Entry:
    """An entry (see the module docstring); `rounds`: each round's ratio, paired in time."""
    ratio = value / baseline if baseline else None
    out: Entry = {
        "name": name,
        "label": label,
        "title": title,
        "value": value,
        "unit": unit,
        "baseline": {"title": baseline_title, "value": baseline, "unit": unit},
        "ratio": ratio,
        "cpu": None,
        "target": None,
        "holds": None,
        "interval_90": None,
        "resolved": None,
        "conditions": dict(conditions, clock="wall (the headline ratio); CPU beside it"),
        "details": details or {},
    }
    if cpu is not None:
        cpu_value, cpu_baseline, cpu_unit = cpu
        out["cpu"] = {
            "value": cpu_value,
            "baseline": cpu_baseline,
            "unit": cpu_unit,
            "ratio": cpu_value / cpu_baseline if cpu_baseline else None,
        }
    if target is not None:
        out["target"] = {"ratio_min": target[0], "text": target[1]}
        out["holds"] = ratio is not None and ratio >= target[0]
    if rounds:
        out["details"]["rounds_ratio"] = rounds
    interval = median_interval(rounds) if rounds else None
    if interval is not None:
        out["interval_90"] = list(interval)
        if target is not None:
            out["resolved"] = interval[0] >= target[0] or interval[1] < target[0]
    return out


DB_SUMMARY = {
    "sqlite": "SQLite WAL, synchronous=FULL",
    "postgres": "PostgreSQL fsync, synchronous_commit on",
}


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


# --- bench_messages.py --------------------------------------------------------------------------


# The phases of a round of bench_messages.py, in order: the script measures the baseline
# (msgspec) before a round's first phase and after every phase (`msgspec_each`: 4 x rounds + 1).
MESSAGE_PHASES = ("publish", "read_committed", "txn_publish", "txn_read_committed")


def message_pairs(run: dict[str, Any], figure: str) -> list[dict[str, float]]:
    """Each round's `figure` of one bench_messages.py run, with its baseline: the mean of the
    msgspec measurements just before and just after the phase. A run of an older script (no
    "rounds") is one round."""
    each = run["msgspec_each"]
    rounds = run.get("rounds") or [{phase: run[phase] for phase in MESSAGE_PHASES}]
    index = MESSAGE_PHASES.index(figure)
    out = []
    for n, phases in enumerate(rounds):
        before, after = (
            each[n * len(MESSAGE_PHASES) + index],
            each[n * len(MESSAGE_PHASES) + index + 1],
        )
        rate = phases[figure]
        wall = (before["per_wall_s"] + after["per_wall_s"]) / 2
        cpu = (before["per_cpu_s"] + after["per_cpu_s"]) / 2
        out.append(
            {
                "per_wall_s": rate["per_wall_s"],
                "per_cpu_s": rate["per_cpu_s"],
                "baseline_wall": wall,
                "baseline_cpu": cpu,
                "ratio": rate["per_wall_s"] / wall,
                "cpu_ratio": rate["per_cpu_s"] / cpu,
            }
        )
    return out


def messages_entries(runs: list[dict[str, Any]]) -> list[Entry]:
    """From one or more runs of bench_messages.py. Every phase of every round is a pair: its
    rate over its baseline (the msgspec measurements just before and after it; a shared CPU's
    speed moves within seconds). The entry is the pair of the median ratio (of all runs'
    rounds; of an even number, the lower middle), its interval that of all the pairs."""
    first = runs[0]
    rounds = len(first.get("rounds") or [first])
    where = (
        "a separate `gazette serve`"
        if "broker_args" in first["conditions"]
        else "broker in process"
    )
    conditions = dict(
        first["conditions"],
        messages=f"{first['messages']:,} JSON messages of ~{first['message_bytes']:.0f} bytes",
        runs=f"{len(runs)} of {plural(rounds, 'round')}, the baseline measured between every "
        "two phases; each figure is the pair (phase, its baseline) of the median ratio",
        cpu="CPU seconds of the client process and the broker's",
        summary=f"{where}, durable spools; client process; {first['messages']:,} "
        f"messages a run; {plural(len(runs), 'run')} x {plural(rounds, 'round')}, "
        "baseline between phases",
    )
    msgspec_title = (
        "msgspec encode+decode of the same message in the client process (the mean of one "
        "measurement just before the phase and one just after; the pair of the median ratio)"
    )
    out = []
    targets = first["targets"]
    for name, label, title, figure, target in (
        ("messages.publish", "publish", "publish, acknowledged", "publish", targets["publish"]),
        (
            "messages.read_committed",
            "read-committed",
            "read-committed",
            "read_committed",
            targets["read_committed"],
        ),
        (
            "messages.txn_publish",
            "txn publish",
            "transactions of 100 per ACK, acknowledged",
            "txn_publish",
            None,
        ),
        (
            "messages.txn_read_committed",
            "txn read-committed",
            "read-committed of those",
            "txn_read_committed",
            None,
        ),
    ):
        pairs = [pair for run in runs for pair in message_pairs(run, figure)]
        ratios = [pair["ratio"] for pair in pairs]
        pair = pairs[sorted(range(len(pairs)), key=ratios.__getitem__)[(len(pairs) - 1) // 2]]
        cpu_ratios = sorted(p["cpu_ratio"] for p in pairs)
        out.append(
            entry(
                name,
                f"{label} / msgspec",
                title,
                pair["per_wall_s"],
                "msg/s",
                msgspec_title,
                pair["baseline_wall"],
                None if target is None else (target, f">= {target} x msgspec encode+decode"),
                conditions,
                cpu=(pair["per_cpu_s"], pair["baseline_cpu"], "msg/cpu-s"),
                details={
                    "runs_per_wall_s": [r[figure]["per_wall_s"] for r in runs],
                    "pairs": len(pairs),
                    "cpu_ratio_median": statistics.median(cpu_ratios),
                    "rounds_cpu_ratio": [p["cpu_ratio"] for p in pairs],
                    "rounds_load_1min": [x for r in runs for x in r.get("rounds_load_1min", [])],
                },
                rounds=ratios,
            )
        )
    return out


# --- bench_broker_cluster.py --------------------------------------------------------------------


def broker_entries(figures: dict[str, Any]) -> list[Entry]:
    limits, durable = figures["limits"], figures["spools"]["durable"]
    conditions = dict(
        figures["conditions"],
        spools="durable files under each broker's --data-dir (no --fsync)",
        broker_args=" ".join(durable["broker_args"]),
        summary="3 `gazette serve` on etcd, durable spools, fragment store; client process; "
        f"{figures['conditions']['seconds']:g} s each",
    )
    when = " (the mean of measurements before and after the workloads)"
    raw_stream = "raw grpc.aio stream of 1 MiB messages to a sink in another process" + when
    raw_rpcs = "raw Append-shaped RPCs from 64 callers to a sink in another process" + when
    out = []
    for large in durable["large"]:
        if large["appenders"] != 1:
            continue
        r = large["replication"]
        target = {1: 0.4, 3: 0.25}.get(r)
        cpu_ms = sum(large["brokers_cpu_ms_per_mib"]) + large["client_cpu_ms_per_mib"]
        out.append(
            entry(
                f"broker.append_1mib_r{r}",
                f"append 1 MiB R={r} / raw stream",
                f"1 MiB appends, R={r}, one appender",
                large["mib_s"],
                "MiB/s",
                raw_stream,
                limits["mb_s"],
                None if target is None else (target, f">= {target} x the raw stream"),
                dict(conditions, cpu="brokers' and client's CPU per MiB (no CPU limit measured)"),
                cpu=(1000 / cpu_ms, None, "MiB/cpu-s (brokers + client)"),
                details={
                    "brokers_cpu_ms_per_mib": large["brokers_cpu_ms_per_mib"],
                    "client_cpu_ms_per_mib": large["client_cpu_ms_per_mib"],
                },
            )
        )
    for small in durable["small"]:
        r = small["replication"]
        target = 0.5 if r == 1 else None
        out.append(
            entry(
                f"broker.append_1kib_x64_r{r}",
                f"append 1 KiB x64 R={r} / raw RPCs",
                f"1 KiB appends from 64 appenders, R={r}",
                small["appends_s"],
                "appends/s",
                raw_rpcs,
                limits["rpcs_s"],
                None if target is None else (target, f">= {target} x raw Append-shaped RPCs"),
                conditions,
            )
        )
    return out


# --- bench_recovery_log.py ----------------------------------------------------------------------


def recovery_entries(figures: dict[str, Any]) -> list[Entry]:
    rounds = figures["rounds"]

    def med(f: Any) -> float:
        return statistics.median(f(r) for r in rounds)

    state_mib = med(lambda r: r["bytes"] / MIB)
    return [
        entry(
            "recovery_log.playback",
            "recovery-log playback / disk write",
            f"recovery-log playback of a RocksDBStore's state (~{state_mib:,.0f} MiB), then fsync",
            med(lambda r: r["bytes"] / MIB / r["wall_s"]),
            "MiB/s",
            "sequential write of as many bytes in 1 MiB writes, then fdatasync (the disk)",
            med(lambda r: r["bytes"] / MIB / r["disk_s"]),
            (figures["target"], f">= {figures['target']} x the disk's sequential write"),
            dict(
                figures["conditions"],
                state=f"{state_mib:,.0f} MiB in {med(lambda r: r['files']):.0f} files, "
                f"{figures['keys']:,} keys of {figures['value_kib']} KiB",
                rounds=f"{len(rounds)} (medians)",
                cpu="player's and broker's CPU seconds; the limit's writer thread's",
                summary="separate `gazette serve`, durable spools, fragment store; "
                f"{state_mib:,.0f} MiB of state; {plural(len(rounds), 'round')}; "
                f"{figures['conditions']['file_system'].split(' (')[0]}",
            ),
            cpu=(
                med(lambda r: r["bytes"] / MIB / (r["client_cpu_s"] + r["broker_cpu_s"])),
                med(lambda r: r["bytes"] / MIB / max(r["disk_cpu_s"], 1e-9)),
                "MiB/cpu-s",
            ),
            details={
                "playback_before_fsync_mib_s": med(lambda r: r["bytes"] / MIB / r["played_s"]),
                "page_cache_write_mib_s": med(lambda r: r["bytes"] / MIB / r["cache_s"]),
                "log_mib": figures["log_bytes"] / MIB,
                "log_mib_read": med(lambda r: r["log_bytes_read"] / MIB),
            },
        )
    ]


# --- bench_consumer.py --------------------------------------------------------------------------


def consumer_entries(figures: dict[str, Any]) -> list[Entry]:
    configs = figures["configs"]
    steady = figures["steady_txns"]
    window = (
        f"{figures['rounds']} rounds; each run's rate over {steady} whole transaction(s) of "
        f"{figures['txn_s'][1]:g} s after a first one"
        if steady
        else f"{figures['rounds']} rounds; each run from its first transaction to the head"
    )
    rounds_summary = plural(figures["rounds"], "round") + (
        f" of {plural(steady, 'transaction')}" if steady else ""
    )
    base = dict(
        figures["conditions"],
        input=f"{figures['messages']:,} JSON messages of ~{figures['message_bytes']:.0f} bytes",
        transactions=f"{figures['txn_s'][0]:g}-{figures['txn_s'][1]:g} s",
        window=window,
        cpu="CPU seconds of the whole process (broker, shard, stores' threads)",
    )

    def med(config: str, mode: str, field: str) -> float:
        return statistics.median(r[field] for r in configs[config]["runs"][mode])

    out = []
    for db, settings in figures["databases"].items():
        conditions = dict(
            base,
            database=f"{db}: " + ", ".join(f"{k}={v}" for k, v in settings.items()),
            summary=f"{DB_SUMMARY.get(db, db)}; broker in process, durable spools; "
            f"{figures['txn_s'][1]:g} s transactions; {rounds_summary}",
        )
        for kind, config, what, label in (
            (
                "committed",
                "committed/per-txn",
                "committed input, a summary per transaction",
                "committed input",
            ),
            (
                "chain",
                "chain/per-txn",
                "input from another exactly-once shard (a chain of two)",
                "chain of two shards",
            ),
            (
                "derived",
                "committed/per-message",
                "one derived message published per input",
                "derived message per input",
            ),
        ):
            if config not in configs:
                continue
            o = configs[config]["overhead"][db]
            details = {
                "paired_overhead_wall": o["paired_wall"],
                "paired_overhead_wall_interval_90": o["paired_wall_interval"],
                "paired_overhead_cpu": o["paired_cpu"],
                "rounds_overhead_wall": o["rounds_wall"],
            }
            if kind == "chain" and figures.get("chain"):
                details["upstream"] = figures["chain"]
            out.append(
                entry(
                    f"consumer.eo_overhead.{kind}.{db}",
                    f"EO / ALO, {label}, {db}",
                    f"exactly-once shard vs at-least-once, {what}, {db}",
                    med(config, f"eo-{db}", "per_wall_s"),
                    "msg/s",
                    "the same shard at-least-once, alternated in the same run",
                    med(config, f"alo-{db}", "per_wall_s"),
                    (1 - OVERHEAD_MAX, f"overhead <= {OVERHEAD_MAX:.0%} (eo/alo >= 0.97)"),
                    conditions,
                    cpu=(
                        med(config, f"eo-{db}", "per_cpu_s"),
                        med(config, f"alo-{db}", "per_cpu_s"),
                        "msg/cpu-s",
                    ),
                    details=details,
                    rounds=[1 - overhead for overhead in o["rounds_wall"]],
                )
            )
        if "committed/per-message" in configs and "committed/none" in configs:
            derived = configs["committed/per-message"]["runs"][f"eo-{db}"]
            none = configs["committed/none"]["runs"][f"eo-{db}"]
            out.append(
                entry(
                    f"consumer.derived_vs_none.{db}",
                    f"EO derived per input / none, {db}",
                    f"exactly-once shard publishing one derived message per input vs none, {db}",
                    med("committed/per-message", f"eo-{db}", "per_wall_s"),
                    "msg/s",
                    "the same exactly-once shard publishing nothing, alternated in the same run",
                    med("committed/none", f"eo-{db}", "per_wall_s"),
                    (DERIVED_VS_NONE_MIN, f">= {DERIVED_VS_NONE_MIN} x publishing none"),
                    conditions,
                    cpu=(
                        med("committed/per-message", f"eo-{db}", "per_cpu_s"),
                        med("committed/none", f"eo-{db}", "per_cpu_s"),
                        "msg/cpu-s",
                    ),
                    rounds=[
                        d["per_wall_s"] / n["per_wall_s"]
                        for d, n in zip(derived, none, strict=True)
                    ],
                )
            )
    return out
