"""Append throughput of one in-process broker (R=1), beside this machine's limits measured in
the same run: SHA1 MB/s, a raw grpc.aio client stream's MB/s (1 MiB messages) and msgs/s (1 KiB
messages), raw Append-shaped RPCs/s from 64 concurrent callers, and the MB/s of Append-shaped
RPCs of 1 MiB sent one after another (one appender's ceiling: a round trip per append).

    .venv/bin/python benchmarks/bench_broker_append.py [--seconds 5] [--append-mib 1]
        [--spools durable|temp|fsync]

Two workloads: 1 MiB appends from one appender, and 1 KiB appends from 64 concurrent appenders.
The broker, its client and the raw-gRPC baselines all share one process (and, through the GIL,
mostly one core), so the ratio to the raw figures of the same run is the figure to compare.
"cpu ms/MiB" is the process's CPU time (all threads) per MiB appended: less noisy than MB/s on
a shared machine. Spools are durable files under a data directory by default, as a broker run
with `--data-dir` (the README's) keeps them; `--spools temp` measures the temporary files of a
broker without one, `fsync` adds `--fsync`. benchmarks/bench_broker_cluster.py measures R=3 with broker processes.

This module's limit functions are imported by bench_broker_cluster.py. `--sink-server` runs a
raw gRPC sink in this process and prints its port: the cluster benchmark's cross-process limit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
from bench_kit import sha1_bytes_s
from google.protobuf.duration_pb2 import Duration

from broker import client
from broker import logging as gazette_logging
from broker.allocator import MemberId, broker_is_consistent
from broker.allocator import serve as allocate
from broker.fragment.stores.registry import new_registry
from broker.keyspace.embedded import EmbeddedBackend
from broker.malloc_tuning import tune_malloc
from broker.protocol import protocol_pb2 as pb
from broker.protocol import protocol_pb2_grpc as pbg
from broker.server import Broker, BrokerConfig

JOURNAL = "bench/append"
SMALL_BYTES = 1 << 10
CONCURRENCY = 64
# Concurrent appenders of large appends, for the pipelined figure.
LARGE_APPENDERS = 4
_GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
]


# --- Machine limits -----------------------------------------------------------------------------


def sha1_mb_s(seconds: float) -> float:
    """SHA1 over 1 MiB blocks (bench_kit's probe), in MiB per second."""
    return sha1_bytes_s(seconds) / (1 << 20)


class _Sink(pbg.JournalServicer):  # type: ignore[misc]
    async def Append(self, requests, context):  # type: ignore[no-untyped-def]
        async for _ in requests:
            pass
        return pb.AppendResponse()


async def start_sink(port: int = 0) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(options=_GRPC_OPTIONS)
    pbg.add_JournalServicer_to_server(_Sink(), server)
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, port


async def raw_stream(target: str, seconds: float, chunk: bytes) -> tuple[float, float]:
    """One client stream of `chunk`-sized messages to the sink at `target`: (MB/s, msgs/s)."""
    async with grpc.aio.insecure_channel(target, options=_GRPC_OPTIONS) as channel:
        stub = pbg.JournalStub(channel)
        n, t0 = 0, time.perf_counter()

        async def requests() -> AsyncIterator[pb.AppendRequest]:
            nonlocal n
            yield pb.AppendRequest(journal=JOURNAL)
            while time.perf_counter() - t0 < seconds:
                yield pb.AppendRequest(content=chunk)
                n += 1

        await stub.Append(requests())
        elapsed = time.perf_counter() - t0
    return n * len(chunk) / elapsed / (1 << 20), n / elapsed


async def raw_rpcs(target: str, seconds: float, content: bytes, concurrency: int) -> float:
    """Append-shaped RPCs/s (metadata, one content message, the empty commit message, answer)
    to the sink at `target` from `concurrency` concurrent callers: the ceiling of small appends."""
    async with grpc.aio.insecure_channel(target, options=_GRPC_OPTIONS) as channel:
        stub = pbg.JournalStub(channel)
        count, t0 = 0, time.perf_counter()

        async def caller() -> None:
            nonlocal count
            while time.perf_counter() - t0 < seconds:
                call = stub.Append()
                await call.write(pb.AppendRequest(journal=JOURNAL))
                await call.write(pb.AppendRequest(content=content))
                await call.write(pb.AppendRequest())
                await call.done_writing()
                await call
                count += 1

        await asyncio.gather(*(caller() for _ in range(concurrency)))
        return count / (time.perf_counter() - t0)


async def raw_append_rpcs(target: str, seconds: float, content: bytes) -> float:
    """MB/s of Append-shaped RPCs of `content` to the sink at `target`, one after another from
    one caller (metadata, one content message, the commit message, done writing, the answer):
    what one appender of `content`-sized appends could reach if the broker did no work."""
    async with grpc.aio.insecure_channel(target, options=_GRPC_OPTIONS) as channel:
        stub = pbg.JournalStub(channel)
        count, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            call = stub.Append()
            await call.write(pb.AppendRequest(journal=JOURNAL))
            await call.write(pb.AppendRequest(content=content))
            await call.write(pb.AppendRequest())
            await call.done_writing()
            await call
            count += 1
        return count * len(content) / (time.perf_counter() - t0) / (1 << 20)


async def in_process_limits(seconds: float) -> dict[str, float]:
    server, port = await start_sink()
    target = f"127.0.0.1:{port}"
    try:
        mb_s, _ = await raw_stream(target, seconds, b"x" * (1 << 20))
        _, msgs_s = await raw_stream(target, seconds, b"x" * SMALL_BYTES)
        rpcs_s = await raw_rpcs(target, seconds, b"x" * SMALL_BYTES, CONCURRENCY)
        rpc_mb_s = await raw_append_rpcs(target, seconds, b"x" * (1 << 20))
    finally:
        await server.stop(0)
    return {
        "sha1": sha1_mb_s(seconds),
        "mb_s": mb_s,
        "msgs_s": msgs_s,
        "rpcs_s": rpcs_s,
        "rpc_mb_s": rpc_mb_s,
    }


def print_limits(title: str, limits: dict[str, float]) -> None:
    print(title)
    print(f"  SHA1                                    {limits['sha1']:9.1f} MB/s")
    print(f"  raw grpc.aio stream, 1 MiB messages     {limits['mb_s']:9.1f} MB/s")
    print(f"  raw grpc.aio stream, 1 KiB messages     {limits['msgs_s']:9.0f} msgs/s")
    print(f"  raw Append-shaped RPCs, {CONCURRENCY} callers, 1 KiB {limits['rpcs_s']:6.0f} RPCs/s")
    if "rpc_mb_s" in limits:
        print(f"  raw Append-shaped RPCs of 1 MiB, one at a time {limits['rpc_mb_s']:7.1f} MB/s")


# --- Workloads ----------------------------------------------------------------------------------


def journal_spec(name: str, replication: int) -> pb.JournalSpec:
    return pb.JournalSpec(
        name=name,
        replication=replication,
        fragment=pb.JournalSpec.Fragment(
            length=64 << 20, compression_codec=pb.NONE, refresh_interval=Duration(seconds=30)
        ),
    )


async def large_appends(
    c: client.JournalClient, journal: str, seconds: float, append: bytes, appenders: int = 1
) -> tuple[float, int, float]:
    """Appends of `append` from `appenders` concurrent appenders, each one append after
    another: (MB/s, appends, this process's cpu ms/MiB). With more than one, the next append
    streams while the one before waits for its acknowledgements (the pipeline is full)."""
    await client.append(c, pb.AppendRequest(journal=journal), b"warm-up")
    count = 0
    t0, cpu0 = time.perf_counter(), time.process_time()

    async def appender() -> None:
        nonlocal count
        while time.perf_counter() - t0 < seconds:
            await client.append(c, pb.AppendRequest(journal=journal), append)
            count += 1

    await asyncio.gather(*(appender() for _ in range(appenders)))
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    mib = count * len(append) / (1 << 20)
    return mib / elapsed, count, cpu * 1000 / mib


async def small_appends(
    c: client.JournalClient, journal: str, seconds: float, concurrency: int = CONCURRENCY
) -> tuple[float, float]:
    """1 KiB appends from `concurrency` concurrent appenders: (appends/s, MB/s)."""
    content = b"s" * SMALL_BYTES
    count, t0 = 0, time.perf_counter()

    async def appender() -> None:
        nonlocal count
        while time.perf_counter() - t0 < seconds:
            await client.append(c, pb.AppendRequest(journal=journal), content)
            count += 1

    await asyncio.gather(*(appender() for _ in range(concurrency)))
    rate = count / (time.perf_counter() - t0)
    return rate, rate * SMALL_BYTES / (1 << 20)


async def in_process_broker(
    seconds: float, append: bytes, data_dir: Path, spools: str = "temp"
) -> None:
    backend = EmbeddedBackend()
    if spools == "temp":
        config = BrokerConfig(zone="local", suffix="bench", spool_dir=str(data_dir))
    else:
        config = BrokerConfig(
            zone="local", suffix="bench", data_dir=str(data_dir), fsync=spools == "fsync"
        )
    broker = Broker(backend, config, stores=new_registry(file_root="/"))
    await broker.start()
    allocator = asyncio.create_task(
        allocate(backend, broker.ks, MemberId("local", "bench"), is_consistent=broker_is_consistent)
    )
    c = client.JournalClient(broker.endpoint)
    try:
        await client.apply_journals(c, [client.upsert(journal_spec(JOURNAL, 1))])
        async with asyncio.timeout(30):
            async for snapshot in client.watch_journals(c, f"name={JOURNAL}"):
                if any(j.route.primary >= 0 for j in snapshot.journals):
                    break
        mib = len(append) / (1 << 20)
        for appenders in (1, LARGE_APPENDERS):
            mb_s, count, cpu_ms = await large_appends(c, JOURNAL, seconds, append, appenders)
            print(
                f"  broker append R=1, {mib:g} MiB x {appenders} appenders  {mb_s:9.1f} MB/s"
                f"  ({count} appends, {cpu_ms:.1f} cpu ms/MiB)"
            )
        rate, small_mb_s = await small_appends(c, JOURNAL, seconds)
        print(
            f"  broker append R=1, 1 KiB x {CONCURRENCY} appenders {rate:9.0f} appends/s"
            f"  ({small_mb_s:.2f} MB/s)"
        )
    finally:
        await c.channels.close()
        allocator.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await allocator
        await broker.stop()
        await backend.close()


async def serve_sink() -> None:
    """--sink-server: serve the raw sink until stdin closes; print the port first."""
    server, port = await start_sink()
    print(port, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.stop(0)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--append-mib", type=float, default=1.0)
    parser.add_argument(
        "--no-malloc-tuning",
        action="store_true",
        help="run as an embedded broker in an untuned process would (see malloc_tuning.py)",
    )
    parser.add_argument(
        "--spools",
        choices=["durable", "temp", "fsync"],
        default="durable",
        help="durable spool files (--data-dir, the default), temporary ones (no --data-dir), or"
        " durable and fdatasync'd before each acknowledgement (--data-dir --fsync)",
    )
    parser.add_argument("--sink-server", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sink_server:
        await serve_sink()
        return
    gazette_logging.configure("console", "warning")
    if not args.no_malloc_tuning:
        # As `gazette serve` does (malloc_tuning.py); the baselines run under it too.
        print(f"glibc malloc tuned for large buffers: {tune_malloc()}")
    append = b"x" * int(args.append_mib * (1 << 20))
    print_limits("limits (one process):", await in_process_limits(args.seconds))
    print(f"broker, client and baselines in one process (spools: {args.spools}):")
    with tempfile.TemporaryDirectory() as tmp:
        await in_process_broker(args.seconds, append, Path(tmp), args.spools)


if __name__ == "__main__":
    asyncio.run(main())
