"""Quorum against all-replicas replication, in one run, on three ``gazette serve`` processes
over a real etcd (issue #16): MB/s and p50/p99 append latency of one sequential appender, for
an R=3 journal of each mode, healthy and with one replica SIGSTOPped.

    .venv/bin/python benchmarks/bench_quorum.py [--appends 200] [--append-kib 64]
        [--lease-ttl-s 3]

Per mode, a cluster of four brokers (a spare, so that the allocator can replace a stopped
all-replicas member) and one R=3 journal: healthy; then one member that is not the primary /
leader SIGSTOPped. The all-replicas journal's first append after the stop waits for the
stopped broker's lease to expire and the allocator to re-assign; the quorum journal keeps the
stopped broker in its ensemble and commits with the two others. Appends go straight to each journal's primary / leader through
a Gazette client (broker/client/appender.py). The quorum mode's entry log is in memory in this
version (docs/design/quorum.md, "part two: built / remaining"), so its figures carry no fsync;
the all-replicas spools are durable files without --fsync (ProcessCluster's default).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path

from google.protobuf.duration_pb2 import Duration

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker import logging as gazette_logging
from broker.client.appender import append
from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set
from broker.testing.process_cluster import BrokerProcess, ProcessCluster

BROKERS = [
    ("zone-a", "broker-a1"),
    ("zone-a", "broker-a2"),
    ("zone-b", "broker-b1"),
    ("zone-b", "broker-b2"),
]
ALL, QUORUM = "bench/all-replicas", "bench/quorum"


def spec(name: str, store: str, quorum: bool) -> pb.JournalSpec:
    out = pb.JournalSpec(
        name=name,
        replication=3,
        fragment=pb.JournalSpec.Fragment(
            length=64 << 20,
            compression_codec=pb.NONE,
            stores=[store],
            refresh_interval=Duration(seconds=1),
        ),
    )
    if quorum:
        out.labels.CopyFrom(label_set([(gl.REPLICATION_MODE, gl.REPLICATION_MODE_QUORUM)]))
    return out


async def phase(
    cluster: ProcessCluster, via: BrokerProcess, journal: str, appends: int, size: int
) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    client = cluster.client(via)
    request = pb.AppendRequest(journal=journal)
    payload = b"x" * (size - 1) + b"\n"
    latencies = []
    start = loop.time()
    for _ in range(appends):
        t = loop.time()
        resp = await append(client, request, payload, attempts_max=100, backoff_cap_s=0.5)
        if resp.status != pb.OK:
            raise RuntimeError(f"{journal}: {pb.Status.Name(resp.status)}")
        latencies.append(loop.time() - t)
    elapsed = loop.time() - start
    ordered = sorted(latencies)
    return {
        "mb_s": appends * size / elapsed / 1e6,
        "p50_ms": statistics.median(ordered) * 1e3,
        "p99_ms": ordered[max(0, round(len(ordered) * 0.99) - 1)] * 1e3,
        "max_ms": ordered[-1] * 1e3,
    }


async def leader_of(cluster: ProcessCluster, journal: str) -> BrokerProcess:
    """The broker an append is committed by (the all-replicas primary, the quorum leader)."""
    resp = await append(
        cluster.client(), pb.AppendRequest(journal=journal), b"hello\n", attempts_max=100
    )
    route = resp.header.route
    return cluster.broker(route.members[route.primary].suffix)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=200)
    parser.add_argument("--append-kib", type=int, default=64)
    parser.add_argument("--lease-ttl-s", type=int, default=3)
    args = parser.parse_args()
    gazette_logging.configure(level="error")
    size = args.append_kib << 10
    results: dict[tuple[str, str], dict[str, float]] = {}
    for journal in (ALL, QUORUM):
        # A cluster per mode, each with a spare broker: without one, an all-replicas journal
        # of R=3 whose member stopped stays INSUFFICIENT_JOURNAL_BROKERS until it returns.
        async with ProcessCluster(BROKERS, lease_ttl_s=args.lease_ttl_s) as cluster:
            await cluster.apply([spec(journal, cluster.store_url, journal == QUORUM)])
            await cluster.wait_until(cluster.journals_ready([journal], 3))
            via = await leader_of(cluster, journal)
            results[(journal, "healthy")] = await phase(cluster, via, journal, args.appends, size)
            members = [m.suffix for m in cluster.route(journal).members]
            stopped = next(b for b in cluster.brokers if b.suffix in members and b is not via)
            cluster.pause(stopped)
            try:
                results[(journal, "one stopped")] = await phase(
                    cluster, via, journal, args.appends, size
                )
            finally:
                cluster.resume(stopped)
    print(
        f"{args.appends} sequential appends of {args.append_kib} KiB, R=3, lease TTL {args.lease_ttl_s} s"
    )
    print("| mode | replicas | MB/s | p50 ms | p99 ms | max ms |")
    print("|---|---|---|---|---|---|")
    for (journal, state), r in results.items():
        mode = "quorum" if journal == QUORUM else "all-replicas"
        print(
            f"| {mode} | {state} | {r['mb_s']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f}"
            f" | {r['max_ms']:.0f} |"
        )


if __name__ == "__main__":
    asyncio.run(main())
