"""Every headline benchmark in one run (`make bench`; `make bench QUICK=1` for a quick one).

    .venv/bin/python benchmarks/bench_all.py [--quick] [--only STEP,...] [--pg-url URL]
        [--out benchmarks/results.json] [--doc docs/benchmarks.md]
        [--chart docs/benchmarks-headline.png] [--no-doc]

Steps, each its benchmark script run as a process of its own with `--json` (their printed
output passes through):

- messages: bench_messages.py (publish acknowledged and read-committed through a separate
  `gazette serve`, against msgspec encode+decode);
- broker: bench_broker_cluster.py (three `gazette serve` on etcd, durable spools: 1 MiB
  appends at R=1 and R=3, 1 KiB appends from 64 appenders, against raw gRPC);
- recovery: bench_recovery_log.py (playback of a RocksDBStore's state against the disk's
  sequential write);
- consumer: bench_consumer.py (exactly-once against at-least-once for committed input, for a
  chain of two shards and with a derived message per input; derived messages against none),
  on SQLite (WAL, synchronous=FULL) and on a PostgreSQL this run starts itself with fsync and
  synchronous_commit on (scripts/pg_cluster.sh's durable mode; `--pg-url` uses another, whose
  durability the consumer step checks all the same).

Then it writes results.json (`bench_entries.py`: one entry per figure, with its baseline, the
ratio, the target and whether it holds, and its conditions: this run's machine, load average
at the step's start and end, date and commit included; and, under "figures", every script's own
output, every round of it) and regenerates the headline section of docs/benchmarks.md and its
chart (`bench_headline.py`). A step that fails stops nothing else;
the run then exits non-zero, names the failed steps, and leaves the documentation alone.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench_entries import broker_entries, consumer_entries, messages_entries, recovery_entries
from bench_headline import regenerate
from bench_kit import free_port

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PG_CLUSTER = ROOT / "scripts" / "pg_cluster.sh"
OUTPUTS = ("benchmarks/results.json", "docs/benchmarks.md", "docs/benchmarks-headline.png")

# Arguments of each step: (quick, full). Quick keeps every entry with fewer rounds and shorter
# windows; the consumer's input must outlast its steady windows at the fastest mode's rate.
STEP_ARGS: dict[str, tuple[list[str], list[str]]] = {
    "messages": (
        ["--messages", "100000", "--raw-seconds", "1"],
        ["--messages", "500000", "--raw-seconds", "3"],
    ),
    "broker": (
        ["--seconds", "1.5", "--spools", "durable", "--appenders", "1"],
        ["--seconds", "5", "--spools", "durable", "--appenders", "1"],
    ),
    "recovery": (
        ["--state-mib", "128", "--rounds", "1"],
        ["--state-mib", "1024", "--rounds", "2"],
    ),
    "consumer": (
        ["--messages", "1200000", "--steady-txns", "1", "--rounds", "1"],
        ["--messages", "3000000", "--steady-txns", "2", "--rounds", "5"],
    ),
}
# Runs of a step whose figures are medians across runs (the others have rounds of their own).
STEP_RUNS = {"messages": (1, 3)}
SCRIPTS = {
    "messages": "bench_messages.py",
    "broker": "bench_broker_cluster.py",
    "recovery": "bench_recovery_log.py",
    "consumer": "bench_consumer.py",
}
CONSUMER_ARGS = [
    *("--publish", "per-txn,per-message,none", "--chain", "--require-durable"),
    *("--max-txn-s", "1"),
]


class StepError(RuntimeError):
    """A benchmark script failed."""


def machine() -> dict[str, Any]:
    cpu_model = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu_model = line.split(":", 1)[1].strip()
            break
    mem_kib = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kib = int(line.split()[1])
    return {
        "cores": os.cpu_count(),
        "cpu_model": cpu_model,
        "memory_gib": mem_kib / (1 << 20),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "hostname": socket.gethostname(),
    }


def git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def git_state() -> tuple[str, bool | None]:
    """The commit, and whether tracked files other than this run's outputs differ from it
    (outside a git checkout: "unknown", None)."""
    try:
        commit = git("rev-parse", "HEAD")
        excluded = [f":(exclude){p}" for p in OUTPUTS]
        dirty = bool(git("status", "--porcelain", "--untracked-files=no", "--", ".", *excluded))
    except (subprocess.CalledProcessError, OSError):
        return "unknown (not a git checkout)", None
    return commit, dirty


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


@contextlib.contextmanager
def durable_postgres() -> Iterator[str]:
    """A PostgreSQL started for this run in scripts/pg_cluster.sh's durable mode: its URL."""
    port = free_port()
    directory = Path(tempfile.gettempdir()) / f"gazette-bench-pg-{port}"
    subprocess.run([str(PG_CLUSTER), "start", str(directory), str(port), "durable"], check=True)
    try:
        yield f"postgresql+psycopg://gazette@127.0.0.1:{port}/gazette"
    finally:
        subprocess.run([str(PG_CLUSTER), "stop", str(directory), str(port)], check=False)


def run_script(script: str, args: list[str]) -> dict[str, Any]:
    """Run benchmarks/`script` with `args` and `--json`, output passing through: its figures."""
    env = dict(os.environ)
    # The children import this checkout's code, whatever the virtualenv has installed.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "figures.json"
        command = [sys.executable, str(HERE / script), *args, "--json", str(out)]
        print(f"$ {' '.join(command[1:])}", flush=True)
        code = subprocess.run(command, env=env, check=False).returncode
        if code != 0:
            raise StepError(f"{script} exited with status {code}")
        return dict(json.loads(out.read_text()))


def run_step(
    name: str, quick: bool, pg_url: str | None
) -> tuple[list[dict[str, Any]], dict[str, Any], list[dict[str, Any]]]:
    """Run one step: its entries, the conditions it ran under, and its scripts' figures."""
    args = list(STEP_ARGS[name][0 if quick else 1])
    if name == "consumer":
        assert pg_url is not None
        args += [*CONSUMER_ARGS, "--pg-url", pg_url]
    runs = STEP_RUNS.get(name, (1, 1))[0 if quick else 1]
    started, load_start, t0 = now(), os.getloadavg(), time.perf_counter()
    figures = [run_script(SCRIPTS[name], args) for _ in range(runs)]
    builders: dict[str, Callable[..., list[dict[str, Any]]]] = {
        "broker": broker_entries,
        "recovery": recovery_entries,
        "consumer": consumer_entries,
    }
    entries = messages_entries(figures) if name == "messages" else builders[name](figures[0])
    conditions = {
        "step": name,
        "script": f"benchmarks/{SCRIPTS[name]} {' '.join(a for a in args if 'postgresql' not in a)}",
        "date": started,
        "load_average": {"start": list(load_start), "end": list(os.getloadavg())},
        "step_wall_s": time.perf_counter() - t0,
    }
    return entries, conditions, figures


def summary_line(e: dict[str, Any]) -> str:
    verdict = {True: "holds", False: "MISSED", None: "(no target)"}[e["holds"]]
    if e["resolved"] is False:
        low, high = e["interval_90"]
        verdict += f" (unresolved: the rounds' 90% interval is {low:.3f}-{high:.3f})"
    target = f">= {e['target']['ratio_min']:g}" if e["target"] else ""
    ratio = "-" if e["ratio"] is None else f"{e['ratio']:.3f}"
    return f"  {e['name']:<42} {ratio:>7} {target:<8} {verdict}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, shorter windows")
    parser.add_argument("--only", help=f"comma-separated steps, of: {', '.join(STEP_ARGS)}")
    parser.add_argument("--pg-url", help="use this PostgreSQL instead of starting a durable one")
    parser.add_argument("--out", default=str(HERE / "results.json"))
    parser.add_argument("--doc", default=str(ROOT / "docs" / "benchmarks.md"))
    parser.add_argument("--chart", default=str(ROOT / "docs" / "benchmarks-headline.png"))
    parser.add_argument("--no-doc", action="store_true", help="leave docs/ alone")
    args = parser.parse_args()
    steps = list(STEP_ARGS) if not args.only else [s for s in args.only.split(",") if s]
    if not steps or any(s not in STEP_ARGS for s in steps):
        parser.error(f"--only: expected steps of {', '.join(STEP_ARGS)} (got {args.only!r})")

    commit, dirty = git_state()
    run: dict[str, Any] = {
        "date": now(),
        "quick": args.quick,
        "git_commit": commit,
        "git_dirty": dirty,
        "machine": machine(),
        "load_start": list(os.getloadavg()),
        "steps": steps,
    }
    t0 = time.perf_counter()
    entries: list[dict[str, Any]] = []
    figures: dict[str, list[dict[str, Any]]] = {}
    failed: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        pg_url = args.pg_url
        if "consumer" in steps and pg_url is None:
            pg_url = stack.enter_context(durable_postgres())
        for step in steps:
            print(f"\n=== {step} ===", flush=True)
            try:
                step_entries, step_conditions, figures[step] = run_step(step, args.quick, pg_url)
            except (StepError, KeyError, ValueError, OSError) as err:
                failed[step] = f"{type(err).__name__}: {err}"
                print(f"step {step} failed: {failed[step]}", flush=True)
                continue
            for e in step_entries:
                e["conditions"].update(
                    step_conditions,
                    machine=run["machine"],
                    git_commit=commit,
                    git_dirty=dirty,
                    quick=args.quick,
                )
            entries += step_entries
    run.update(load_end=list(os.getloadavg()), wall_s=time.perf_counter() - t0, failed=failed)
    # The scripts' own figures too: every round, from which the entries were built.
    results = {"run": run, "entries": entries, "figures": figures}
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")

    print(f"\n{len(entries)} figures in {run['wall_s']:.0f} s, written to {args.out}")
    print(f"  {'figure':<42} {'ratio':>7} {'target':<8}")
    for e in entries:
        print(summary_line(e))
    if failed:
        raise SystemExit(f"failed steps (documentation left alone): {failed}")
    if not args.no_doc and set(steps) == set(STEP_ARGS):
        regenerate(results, Path(args.doc), Path(args.chart))
        print(f"regenerated the headline section of {args.doc} and {args.chart}")


if __name__ == "__main__":
    main()
