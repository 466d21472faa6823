"""Append throughput of a cluster of three ``gazette serve`` processes on a real etcd, at R=3
and R=1, beside this machine's limits measured in the same run across processes: SHA1 MB/s, a
raw grpc.aio client stream to a sink in another process (MB/s at 1 MiB messages, msgs/s at
1 KiB), and raw Append-shaped RPCs/s from 64 concurrent callers to that sink.

    .venv/bin/python benchmarks/bench_broker_cluster.py [--seconds 5] [--append-mib 1]
        [--spools disk,tmpfs] [--no-small] [--no-malloc-tuning]

Workloads: 1 MiB appends from one appender, and 1 KiB appends from 64 concurrent appenders,
sent by this process straight to each journal's primary. Beside each figure: the CPU time the
brokers spent per MiB appended (primary, then each replica), read from /proc, which says where
the time goes and is less noisy than MB/s on a shared machine. This process (the client) tunes
glibc's allocator as ``gazette serve`` does (broker/malloc_tuning.py), unless told not to: an
untuned client page-faults every chunk-sized buffer anew, which doubles its CPU per MiB and
makes it, not the brokers, the bottleneck of one appender. Etcd comes from
broker/testing/etcd_server.py and the processes from broker/testing/process_cluster.py.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

from bench_broker_append import (
    CONCURRENCY,
    LARGE_APPENDERS,
    SMALL_BYTES,
    journal_spec,
    large_appends,
    print_limits,
    raw_rpcs,
    raw_stream,
    sha1_mb_s,
    small_appends,
)

from broker import logging as gazette_logging
from broker.malloc_tuning import tune_malloc
from broker.testing.process_cluster import BrokerProcess, ProcessCluster

BROKERS = [("zone-a", "broker-a"), ("zone-b", "broker-b"), ("zone-c", "broker-c")]
R3, R1 = "bench/r3", "bench/r1"
_TICKS_S = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS_S  # utime, stime.


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
    finally:
        sink.stdin.close()
        async with asyncio.timeout(30):
            await sink.wait()
    return {"sha1": sha1_mb_s(seconds), "mb_s": mb_s, "msgs_s": msgs_s, "rpcs_s": rpcs_s}


def route_order(cluster: ProcessCluster, journal: str) -> list[BrokerProcess]:
    """The journal's brokers, primary first."""
    route = cluster.route(journal)
    members = [cluster.broker(m.suffix) for m in route.members]
    primary = members.pop(route.primary)
    return [primary, *members]


def cpu_per_mib(before: dict[int, float], brokers: list[BrokerProcess], mib: float) -> str:
    shares = [f"{(cpu_s(b.pid) - before[b.pid]) * 1000 / mib:.1f}" for b in brokers]
    return "brokers " + "/".join(shares) + " (primary first)"


async def run(seconds: float, append: bytes, spools: list[str], small: bool, store: bool) -> None:
    limits = await cross_process_limits(seconds)
    print_limits("limits (client here, raw sink in another process):", limits)
    # Spool files on the default temporary directory (a disk here), and/or on tmpfs.
    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
        for where in spools:
            extra = {"tmpfs": ["--spool-dir", shm], "memory": ["--spool-memory"]}.get(where, [])
            persisted = "fragments persisted to a file:// store" if store else "no fragment store"
            print(f"{len(BROKERS)} gazette serve processes, etcd, spools on {where}, {persisted}:")
            await workloads(seconds, append, extra, small, store)


async def workloads(
    seconds: float, append: bytes, extra_args: list[str], small: bool, store: bool
) -> None:
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
        for journal, replication in ((R1, 1), (R3, 3)):
            brokers = route_order(cluster, journal)
            c = cluster.client(via=brokers[0])
            for appenders in (1, LARGE_APPENDERS):
                before = {b.pid: cpu_s(b.pid) for b in brokers}
                mb_s, count, client_cpu = await large_appends(
                    c, journal, seconds, append, appenders
                )
                mib = count * len(append) / (1 << 20)
                print(
                    f"  R={replication}, {len(append) / (1 << 20):g} MiB x {appenders} appenders"
                    f"       {mb_s:9.1f} MB/s  ({count} appends; cpu ms/MiB:"
                    f" {cpu_per_mib(before, brokers, mib)}; client {client_cpu:.1f})"
                )
            if not small:
                continue
            rate, small_mb_s = await small_appends(c, journal, seconds)
            print(
                f"  R={replication}, 1 KiB x {CONCURRENCY} appenders"
                f"         {rate:9.0f} appends/s  ({small_mb_s:.2f} MB/s)"
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--append-mib", type=float, default=1.0)
    parser.add_argument(
        "--spools",
        default="disk,tmpfs,memory",
        help="where brokers spool, comma separated: disk, tmpfs (--spool-dir on /dev/shm),"
        " memory (--spool-memory)",
    )
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
    spools = [s for s in args.spools.split(",") if s]
    if not spools or any(s not in ("disk", "tmpfs", "memory") for s in spools):
        parser.error(f"--spools: expected disk, tmpfs or memory (got {args.spools!r})")
    gazette_logging.configure("console", "warning")
    if not args.no_malloc_tuning:
        print(f"client: glibc malloc tuned for large buffers: {tune_malloc()}")
    append = b"x" * int(args.append_mib * (1 << 20))
    asyncio.run(run(args.seconds, append, spools, not args.no_small, not args.no_store))


if __name__ == "__main__":
    main()
