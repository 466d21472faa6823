"""Where a 1 MiB append spends a broker's time: cProfile of three `gazette serve` processes on
etcd (bench_broker_cluster.py's set-up) while one appender appends to an R=1, then an R=3
journal, from this process.

    .venv/bin/python benchmarks/profile_broker_append.py [--seconds 5] [--append-mib 1]
        [--top 30] [--sort tottime] [--dump DIR] [--client] [--small]

Each broker runs with benchmarks/profile_hook/ first on its PYTHONPATH (its sitecustomize.py
profiles the event loop thread; one real-time signal starts a window, another writes it out). Printed per
workload: MB/s and the appends' count, then the top entries of the primary's profile (and of one
replica's at R=3), by `--sort`. `--small`: 1 KiB appends from 64 appenders instead. cProfile slows the profiled thread (roughly 1.5-2x here), so
compare shares within a profile, not MB/s with the benchmark's. `--client` profiles this
process's appends too. `--dump DIR` keeps the .prof files (for pstats or snakeviz).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import shutil
import signal
import tempfile
from pathlib import Path

from bench_broker_append import CONCURRENCY, journal_spec, large_appends, small_appends
from bench_broker_cluster import BROKERS, R1, R3, route_order

from broker import logging as gazette_logging
from broker.malloc_tuning import tune_malloc
from broker.testing.process_cluster import ProcessCluster

HOOK_DIR = Path(__file__).with_name("profile_hook")
# The hook's signals (profile_hook/sitecustomize.py).
START_SIGNAL = signal.SIGRTMIN + 3
DUMP_SIGNAL = signal.SIGRTMIN + 4
WRITTEN_SIGNAL = signal.SIGRTMIN + 5
DUMP_WAIT_S = 30.0


async def _dump(pids: list[int]) -> None:
    """Have each broker write its profile, and wait until all have (each signals back)."""
    written = asyncio.Event()
    left = set(pids)

    def on_written() -> None:
        # Real-time signals queue: one per broker that wrote its profile.
        left.pop()
        if not left:
            written.set()

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(WRITTEN_SIGNAL, on_written)
    try:
        for pid in pids:
            os.kill(pid, DUMP_SIGNAL)
        async with asyncio.timeout(DUMP_WAIT_S):
            await written.wait()
    finally:
        loop.remove_signal_handler(WRITTEN_SIGNAL)


def _print(path: Path, title: str, sort: str, top: int) -> None:
    print(f"\n--- {title} ({path.name}), top {top} by {sort}")
    stats = pstats.Stats(str(path))
    stats.sort_stats(sort).print_stats(top)


async def run(args: argparse.Namespace, out_dir: Path) -> None:
    env = {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(HOOK_DIR), os.environ.get("PYTHONPATH")])),
        "GAZETTE_PROFILE_DIR": str(out_dir),
        "GAZETTE_PROFILE_NOTIFY_PARENT": "1",
    }
    append = b"s" * 1024 if args.small else b"x" * int(args.append_mib * (1 << 20))
    async with ProcessCluster(BROKERS, env=env) as cluster:
        specs = [journal_spec(R3, 3), journal_spec(R1, 1)]
        for spec in specs:
            spec.fragment.stores.append(cluster.store_url)
        await cluster.apply(specs)
        await cluster.wait_until(cluster.journals_ready([R3], 3), timeout_s=60)
        await cluster.wait_until(cluster.journals_ready([R1], 1), timeout_s=60)
        for journal, replication in ((R1, 1), (R3, 3)):
            brokers = route_order(cluster, journal)
            c = cluster.client(via=brokers[0])
            await large_appends(c, journal, 1.0, append)  # Warm up.
            for b in brokers:
                os.kill(b.pid, START_SIGNAL)
            client_profile = cProfile.Profile() if args.client else None
            if client_profile is not None:
                client_profile.enable()
            if args.small:
                rate, _ = await small_appends(c, journal, args.seconds)
                mb_s, count = rate * len(append) / (1 << 20), int(rate * args.seconds)
            else:
                mb_s, count, _ = await large_appends(c, journal, args.seconds, append)
            if client_profile is not None:
                client_profile.disable()
            await _dump([b.pid for b in brokers])
            print(f"\n=== R={replication}: {mb_s:.1f} MB/s, {count} appends (profiled)")
            for index, b in enumerate(brokers[:2]):
                path = out_dir / f"{b.pid}.prof"
                role = "primary" if index == 0 else "replica"
                kept = out_dir / f"r{replication}-{role}.prof"
                shutil.copy(path, kept)
                _print(kept, f"R={replication} {role} {b.suffix}", args.sort, args.top)
            if client_profile is not None:
                kept = out_dir / f"r{replication}-client.prof"
                client_profile.dump_stats(str(kept))
                _print(kept, f"R={replication} client", args.sort, args.top)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--append-mib", type=float, default=1.0)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--sort", default="tottime")
    parser.add_argument("--dump", help="keep the profiles in this directory")
    parser.add_argument("--client", action="store_true", help="profile this process too")
    parser.add_argument(
        "--small",
        action="store_true",
        help=f"1 KiB appends from {CONCURRENCY} appenders instead of 1 MiB ones from one",
    )
    args = parser.parse_args()
    gazette_logging.configure("console", "warning")
    tune_malloc()
    if args.dump:
        out = Path(args.dump)
        out.mkdir(parents=True, exist_ok=True)
        asyncio.run(run(args, out))
        return
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run(args, Path(tmp)))


if __name__ == "__main__":
    main()
