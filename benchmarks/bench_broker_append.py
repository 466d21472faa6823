"""Append throughput of one in-process broker (R=1), beside this machine's limits measured in
the same run: SHA1 MB/s and a raw grpc.aio client-streaming RPC's MB/s on loopback.

    .venv/bin/python benchmarks/bench_broker_append.py [--seconds 5] [--append-mib 1]

The broker, its client and the raw-gRPC baseline all share one process and one core here (the
GIL), so the ratio to the raw stream is the figure to compare. The multi-process R=3 figures
the broker-data-path issue asks for need the process-level cluster harness (not yet built).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import tempfile
import time
from pathlib import Path

import grpc
from google.protobuf.duration_pb2 import Duration

from broker import client
from broker import logging as gazette_logging
from broker.allocator import MemberId, broker_is_consistent
from broker.allocator import serve as allocate
from broker.fragment.stores.registry import new_registry
from broker.keyspace.embedded import EmbeddedBackend
from broker.protocol import protocol_pb2 as pb
from broker.protocol import protocol_pb2_grpc as pbg
from broker.server import Broker, BrokerConfig

JOURNAL = "bench/append"


def sha1_mb_s(seconds: float) -> float:
    block = b"\x5a" * (1 << 20)
    h = hashlib.sha1()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        h.update(block)
        n += 1
    return n / (time.perf_counter() - t0)


class _Sink(pbg.JournalServicer):  # type: ignore[misc]
    async def Append(self, requests, context):  # type: ignore[no-untyped-def]
        async for _ in requests:
            pass
        return pb.AppendResponse()


async def raw_grpc_mb_s(seconds: float, chunk: bytes) -> float:
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 8 << 20)])
    pbg.add_JournalServicer_to_server(_Sink(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pbg.JournalStub(channel)
        n, t0 = 0, time.perf_counter()

        async def requests():  # type: ignore[no-untyped-def]
            nonlocal n
            yield pb.AppendRequest(journal=JOURNAL)
            while time.perf_counter() - t0 < seconds:
                yield pb.AppendRequest(content=chunk)
                n += len(chunk)

        await stub.Append(requests())
        elapsed = time.perf_counter() - t0
    await server.stop(0)
    return n / elapsed / (1 << 20)


async def broker_mb_s(seconds: float, append: bytes, data_dir: Path) -> tuple[float, int]:
    backend = EmbeddedBackend()
    broker = Broker(
        backend,
        BrokerConfig(zone="local", suffix="bench", spool_dir=str(data_dir)),
        stores=new_registry(file_root="/"),
    )
    await broker.start()
    allocator = asyncio.create_task(
        allocate(backend, broker.ks, MemberId("local", "bench"), is_consistent=broker_is_consistent)
    )
    c = client.JournalClient(broker.endpoint)
    spec = pb.JournalSpec(
        name=JOURNAL,
        replication=1,
        fragment=pb.JournalSpec.Fragment(
            length=64 << 20, compression_codec=pb.NONE, refresh_interval=Duration(seconds=30)
        ),
    )
    try:
        await client.apply_journals(c, [client.upsert(spec)])
        async with asyncio.timeout(30):
            async for snapshot in client.watch_journals(c, f"name={JOURNAL}"):
                if any(j.route.primary >= 0 for j in snapshot.journals):
                    break
        await client.append(c, pb.AppendRequest(journal=JOURNAL), b"warm-up")
        n, count, t0 = 0, 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            await client.append(c, pb.AppendRequest(journal=JOURNAL), append)
            n += len(append)
            count += 1
        elapsed = time.perf_counter() - t0
    finally:
        await c.channels.close()
        allocator.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await allocator
        await broker.stop()
        await backend.close()
    return n / elapsed / (1 << 20), count


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--append-mib", type=float, default=1.0)
    args = parser.parse_args()
    gazette_logging.configure("console", "warning")
    append = b"x" * int(args.append_mib * (1 << 20))
    chunk = append[: 1 << 20]
    print(f"SHA1                          {sha1_mb_s(args.seconds):8.1f} MB/s")
    print(f"raw grpc.aio stream (1 MiB)   {await raw_grpc_mb_s(args.seconds, chunk):8.1f} MB/s")
    with tempfile.TemporaryDirectory() as tmp:
        mb_s, count = await broker_mb_s(args.seconds, append, Path(tmp))
    print(f"broker append R=1 ({args.append_mib:g} MiB)  {mb_s:8.1f} MB/s  ({count} appends)")


if __name__ == "__main__":
    asyncio.run(main())
