"""Append throughput of a cluster of three ``gazette serve`` processes on a real etcd, at R=3
and R=1, beside this machine's limits measured in the same run across processes: SHA1 MB/s, a
raw grpc.aio client stream to a sink in another process (MB/s at 1 MiB messages, msgs/s at
1 KiB), raw Append-shaped RPCs/s from 64 concurrent callers to that sink, and the MB/s of
Append-shaped RPCs of 1 MiB sent one after another (what one appender could reach if the
brokers did no work: each append is a round trip, where the stream is not; every 1 MiB figure
is also printed as a ratio of it).

    .venv/bin/python benchmarks/bench_broker_cluster.py [--seconds 5] [--append-mib 1]
        [--spools durable,memory] [--appenders 1,4] [--no-small] [--no-malloc-tuning]
        [--json FILE]

Workloads: 1 MiB appends from one appender (and from `--appenders` more), and 1 KiB appends from
64 concurrent appenders, sent by this process straight to each journal's primary. Spools:
`durable` (the default: files under each broker's `--data-dir`, which ProcessCluster always
gives, no `--fsync`), or `memory` (`--spool-memory`, never durable). Spools on tmpfs
(`--spool-dir`) cannot be measured here any more: `gazette serve` refuses `--spool-dir` with
`--data-dir`. The raw limits are measured before the workloads and again after them, and each
figure is printed as a ratio of their mean, against the targets of issue #17 where it names one.
Beside each figure: the CPU time the brokers spent per MiB appended (primary, then each
replica), read from /proc, which says where the time goes and is less noisy than MB/s on a
shared machine. This process (the client) tunes glibc's allocator as ``gazette serve`` does
(broker/malloc_tuning.py), unless told not to: an untuned client page-faults every chunk-sized
buffer anew, which doubles its CPU per MiB and makes it, not the brokers, the bottleneck of one
appender. Etcd comes from broker/testing/etcd_server.py and the processes from
broker/testing/process_cluster.py.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from bench_broker_append import (
    CONCURRENCY,
    LARGE_APPENDERS,
    SMALL_BYTES,
    journal_spec,
    large_appends,
    print_limits,
    raw_append_rpcs,
    raw_rpcs,
    raw_stream,
    sha1_mb_s,
    small_appends,
)
from bench_json import write_figures
from serve_process import process_cpu_s

from broker import logging as gazette_logging
from broker.malloc_tuning import tune_malloc
from broker.testing.process_cluster import BrokerProcess, ProcessCluster

BROKERS = [("zone-a", "broker-a"), ("zone-b", "broker-b"), ("zone-c", "broker-c")]
R3, R1 = "bench/r3", "bench/r1"
# Issue #17's targets: a ratio of the raw limit measured in the same run.
TARGETS = {
    ("large", 1): 0.4,  # 1 MiB appends, R=1, one appender / raw grpc.aio stream of 1 MiB.
    ("large", 3): 0.25,  # The same at R=3.
    ("small", 1): 0.5,  # 1 KiB x 64 appenders, R=1 / raw Append-shaped RPCs.
}
SPOOL_ARGS = {"durable": [], "memory": ["--spool-memory"]}
cpu_s = process_cpu_s


async def cross_process_limits(seconds: float) -> dict[str, float]:
    """Raw gRPC between this process and a sink served by another (bench_broker_append.py)."""
    sink = await asyncio.create_subprocess_exec(
        sys.executable,
        str(Path(__file__).with_name("bench_broker_append.py")),
        "--sink-server",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert sink.stdin is not None and sink.stdout is not None
    try:
        async with asyncio.timeout(60):
            port = int(await sink.stdout.readline())
        target = f"127.0.0.1:{port}"
        mb_s, _ = await raw_stream(target, seconds, b"x" * (1 << 20))
        _, msgs_s = await raw_stream(target, seconds, b"x" * SMALL_BYTES)
        rpcs_s = await raw_rpcs(target, seconds, b"x" * SMALL_BYTES, CONCURRENCY)
        rpc_mb_s = await raw_append_rpcs(target, seconds, b"x" * (1 << 20))
    finally:
        sink.stdin.close()
        async with asyncio.timeout(30):
            await sink.wait()
    return {
        "sha1": sha1_mb_s(seconds),
        "mb_s": mb_s,
        "msgs_s": msgs_s,
        "rpcs_s": rpcs_s,
        "rpc_mb_s": rpc_mb_s,
    }


def route_order(cluster: ProcessCluster, journal: str) -> list[BrokerProcess]:
    """The journal's brokers, primary first."""
    route = cluster.route(journal)
    members = [cluster.broker(m.suffix) for m in route.members]
    primary = members.pop(route.primary)
    return [primary, *members]


def cpu_per_mib(before: dict[int, float], brokers: list[BrokerProcess], mib: float) -> list[float]:
    """Each broker's CPU milliseconds per MiB appended, primary first."""
    return [(cpu_s(b.pid) - before[b.pid]) * 1000 / mib for b in brokers]


def verdict(kind: str, replication: int, ratio: float) -> str:
    target = TARGETS.get((kind, replication))
    if target is None:
        return f"{ratio:.2f} x raw"
    return f"{ratio:.2f} x raw, target >= {target:.2f}: {'holds' if ratio >= target else 'MISSED'}"


async def run(args: argparse.Namespace, append: bytes, spools: list[str]) -> dict[str, Any]:
    """The raw limits are measured before and after the workloads (a shared machine's speed
    moves within seconds): their mean is what each figure is compared with."""
    before = await cross_process_limits(args.seconds)
    print_limits("limits before (client here, raw sink in another process):", before)
    out: dict[str, Any] = {"spools": {}}
    for where in spools:
        persisted = "fragments persisted to a file:// store" if args.store else "no fragment store"
        print(f"{len(BROKERS)} gazette serve processes, etcd, spools {where}, {persisted}:")
        out["spools"][where] = await workloads(args, append, SPOOL_ARGS[where], before)
    after = await cross_process_limits(args.seconds)
    print_limits("limits after:", after)
    limits = {key: (before[key] + after[key]) / 2 for key in before}
    print_limits("limits (the mean of both), against which the targets are judged:", limits)
    for where, figures in out["spools"].items():
        for large in figures["large"]:
            ratio = large["mib_s"] / limits["mb_s"]
            kind = "large" if large["appenders"] == 1 else ""
            print(
                f"  {where}: R={large['replication']}, 1 MiB x {large['appenders']}: "
                + verdict(kind, large["replication"], ratio)
                + f"; {large['mib_s'] / limits['rpc_mb_s']:.2f} x raw 1 MiB Append-shaped RPCs"
                " one at a time"
            )
        for small in figures["small"]:
            ratio = small["appends_s"] / limits["rpcs_s"]
            print(
                f"  {where}: R={small['replication']}, 1 KiB x {CONCURRENCY}: "
                + verdict("small", small["replication"], ratio)
            )
    out.update(limits=limits, limits_before=before, limits_after=after)
    return out


async def workloads(
    args: argparse.Namespace, append: bytes, extra_args: list[str], limits: dict[str, float]
) -> dict[str, Any]:
    seconds, store = args.seconds, args.store
    figures: dict[str, Any] = {"large": [], "small": [], "broker_args": []}
    async with ProcessCluster(BROKERS, extra_args=extra_args) as cluster:
        specs = [journal_spec(R3, 3), journal_spec(R1, 1)]
        if store:
            # Persisted, as in production: a spool is released once its fragment is in the
            # store. Without one, every appended byte stays in the brokers' spools for good.
            for spec in specs:
                spec.fragment.stores.append(cluster.store_url)
        await cluster.apply(specs)
        await cluster.wait_until(cluster.journals_ready([R3], 3), timeout_s=60)
        await cluster.wait_until(cluster.journals_ready([R1], 1), timeout_s=60)
        figures["broker_args"] = [*cluster.extra_args, "--data-dir <per broker>"]
        for journal, replication in ((R1, 1), (R3, 3)):
            brokers = route_order(cluster, journal)
            c = cluster.client(via=brokers[0])
            for appenders in args.appenders:
                before = {b.pid: cpu_s(b.pid) for b in brokers}
                mb_s, count, client_cpu = await large_appends(
                    c, journal, seconds, append, appenders
                )
                mib = count * len(append) / (1 << 20)
                brokers_cpu = cpu_per_mib(before, brokers, mib)
                ratio = mb_s / limits["mb_s"]
                print(
                    f"  R={replication}, {len(append) / (1 << 20):g} MiB x {appenders} appenders"
                    f"       {mb_s:9.1f} MB/s  ({count} appends; cpu ms/MiB: brokers "
                    f"{'/'.join(f'{v:.1f}' for v in brokers_cpu)} (primary first); client "
                    f"{client_cpu:.1f}); " + f"{ratio:.2f} x the raw limit before"
                )
                figures["large"].append(
                    {
                        "replication": replication,
                        "appenders": appenders,
                        "mib_s": mb_s,
                        "appends": count,
                        "brokers_cpu_ms_per_mib": brokers_cpu,
                        "client_cpu_ms_per_mib": client_cpu,
                    }
                )
            if not args.small:
                continue
            rate, small_mb_s = await small_appends(c, journal, seconds)
            print(
                f"  R={replication}, 1 KiB x {CONCURRENCY} appenders"
                f"         {rate:9.0f} appends/s  ({small_mb_s:.2f} MB/s); "
                + f"{rate / limits['rpcs_s']:.2f} x the raw limit before"
            )
            figures["small"].append(
                {"replication": replication, "appenders": CONCURRENCY, "appends_s": rate}
            )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--append-mib", type=float, default=1.0)
    parser.add_argument(
        "--spools",
        default="durable,memory",
        help="how brokers spool, comma separated: durable (files under --data-dir; 'disk' is"
        " the same), memory (--spool-memory)",
    )
    parser.add_argument(
        "--appenders",
        default=f"1,{LARGE_APPENDERS}",
        help="concurrent appenders of the large appends, comma separated",
    )
    parser.add_argument("--json", help="also write the figures to this file (bench_all.py)")
    parser.add_argument("--no-small", action="store_true", help="skip the 1 KiB appends")
    parser.add_argument(
        "--no-store",
        action="store_true",
        help="journals without a fragment store (default: a file:// store on the cluster's"
        " directory, so fragments are persisted and spools released)",
    )
    parser.add_argument(
        "--no-malloc-tuning",
        action="store_true",
        help="do not tune this client process's allocator",
    )
    args = parser.parse_args()
    spools = [{"disk": "durable"}.get(s, s) for s in args.spools.split(",") if s]
    if "tmpfs" in spools:
        parser.error(
            "--spools tmpfs: `gazette serve` refuses --spool-dir with --data-dir, which every"
            " broker of a ProcessCluster has"
        )
    if not spools or any(s not in SPOOL_ARGS for s in spools):
        parser.error(f"--spools: expected durable or memory (got {args.spools!r})")
    try:
        args.appenders = [int(a) for a in args.appenders.split(",") if a]
    except ValueError:
        parser.error(f"--appenders: expected numbers, comma separated (got {args.appenders!r})")
    if not args.appenders or min(args.appenders) < 1:
        parser.error(f"--appenders: expected numbers >= 1 (got {args.appenders})")
    args.small, args.store = not args.no_small, not args.no_store
    gazette_logging.configure("console", "warning")
    if not args.no_malloc_tuning:
        print(f"client: glibc malloc tuned for large buffers: {tune_malloc()}")
    append = b"x" * int(args.append_mib * (1 << 20))
    figures = asyncio.run(run(args, append, spools))
    if args.json:
        figures["conditions"] = {
            "process": f"{len(BROKERS)} `gazette serve` processes on a real etcd; client in this"
            " process, appending to each journal's primary; raw limits against a sink in"
            " another process",
            "store": "file:// fragment store (fragments persisted)" if args.store else "none",
            "client_malloc_tuned": not args.no_malloc_tuning,
            "append_bytes": len(append),
            "seconds": args.seconds,
        }
        write_figures(args.json, figures)


if __name__ == "__main__":
    main()
