"""What verifying stored fragments whole before serving them costs a Read (broker/read_staging.py).

    .venv/bin/python benchmarks/bench_stored_reads.py [--fragment-mib 64] [--fragments 3]
        [--rounds 4] [--codec none|gzip]

Two `gazette serve` processes, each as a user runs it (embedded keyspace, durable spools under
--data-dir, a `file://` store under it, separate from this client's process): one with the
default staging room (fragments over 1 MiB are decoded into a scratch copy and verified, then
served from it) and one with `--read-stage-bytes-max 0` (no room: each fragment is decoded and
verified in a first pass, then read again and streamed). Each holds one journal of
`--fragments` persisted fragments of `--fragment-mib` MiB. A round reads the whole journal
from offset 0 through each broker, alternately (A, B, B, A, ...): wall time, the time to its
first byte, and the broker's CPU per MiB. Beside them, the machine's limits measured in the
same run: SHA1 over 1 MiB blocks, and reading a stored fragment file (page cache).

Each broker's `gazette_read_verified_whole_fragments_total` is checked against the fragments
read, so that a figure never comes from a local spool by mistake.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from bench_kit import sha1_bytes_s
from google.protobuf.duration_pb2 import Duration
from serve_process import ServeProcess, assign_journals, gazette_serve

from broker import client
from broker.protocol import protocol_pb2 as pb

JOURNAL = "bench/stored-reads"
STORE = "file:///store/"
MiB = 1 << 20
PERSIST_WAIT_S = 120.0


@dataclass
class Side:
    name: str
    broker: ServeProcess
    client: client.JournalClient
    http_port: int
    walls: list[float]
    first_bytes: list[float]
    cpu_ms_per_mib: list[float]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def verified_fragments(port: int, how: str) -> float:
    url = f"http://127.0.0.1:{port}/debug/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    wanted = f'gazette_read_verified_whole_fragments_total{{how="{how}"}} '
    for line in text.splitlines():
        if line.startswith(wanted):
            return float(line.split()[-1])
    return 0.0


def content_of(size: int, seed: int) -> bytes:
    line = bytes((ord("a") + (seed + i) % 26) for i in range(127)) + b"\n"
    return (line * (size // len(line) + 1))[:size]


async def fill(c: client.JournalClient, fragment_bytes: int, fragments: int) -> int:
    """`fragments` persisted fragments of `fragment_bytes` (each append rolls the one before),
    then a small append that rolls the last; the journal's persisted end."""
    for i in range(fragments):
        await client.append(c, pb.AppendRequest(journal=JOURNAL), content_of(fragment_bytes, i))
    await client.append(c, pb.AppendRequest(journal=JOURNAL), b"roll\n")
    end = fragments * fragment_bytes
    async with asyncio.timeout(PERSIST_WAIT_S):
        while True:
            listed = await client.list_all_fragments(c, pb.FragmentsRequest(journal=JOURNAL))
            stored = [f.spec for f in listed.fragments if f.spec.mod_time and f.spec.end <= end]
            if sum(f.end - f.begin for f in stored) == end:
                return end
            await asyncio.sleep(0.2)  # No event to await: the persister's uploads.


async def read_through(side: Side, end: int) -> None:
    reader = client.Reader(side.client, pb.ReadRequest(journal=JOURNAL, offset=0, end_offset=end))
    t0, cpu0 = time.perf_counter(), side.broker.cpu_s()
    got, first = 0, 0.0
    try:
        while got < end:
            chunk = await reader.read_chunk()
            if not chunk.content:
                raise RuntimeError(f"{side.name}: the read ended at {chunk.offset} of {end}")
            if not got:
                first = time.perf_counter() - t0
            got += len(chunk.content)
    finally:
        await reader.close()
    wall = time.perf_counter() - t0
    side.walls.append(wall)
    side.first_bytes.append(first)
    side.cpu_ms_per_mib.append((side.broker.cpu_s() - cpu0) * 1000 / (end / MiB))


@asynccontextmanager
async def side_of(
    stack_dir: Path, name: str, args: list[str], spec: pb.JournalSpec, tree: str | None = None
) -> AsyncIterator[Side]:
    data = stack_dir / name
    (data / "store").mkdir(parents=True)
    port = free_port()
    async with gazette_serve(data, [*args, "--http-port", str(port)], tree=tree) as broker:
        c = client.JournalClient(broker.endpoint)
        try:
            await assign_journals(c, [spec])
            yield Side(name, broker, c, port, [], [], [])
        finally:
            await c.close()


def file_read_bytes_s(path: Path) -> float:
    t0 = time.perf_counter()
    n = 0
    with open(path, "rb") as f:
        while block := f.read(MiB):
            n += len(block)
    return n / (time.perf_counter() - t0)


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fragment-mib", type=int, default=64)
    p.add_argument("--fragments", type=int, default=3)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--codec", choices=["none", "gzip"], default="none")
    p.add_argument(
        "--baseline-tree",
        default=None,
        help="a source tree (worktree) of a commit before staging: a third broker of it"
        " streams stored fragments as it decodes them (verified at their end), alternated"
        " with the other two",
    )
    a = p.parse_args()
    codec = pb.NONE if a.codec == "none" else pb.GZIP
    spec = pb.JournalSpec(
        name=JOURNAL,
        replication=1,
        fragment=pb.JournalSpec.Fragment(
            length=a.fragment_mib * MiB,
            compression_codec=codec,
            stores=[STORE],
            refresh_interval=Duration(seconds=1),
        ),
    )
    print(
        f"stored reads: {a.fragments} fragments of {a.fragment_mib} MiB, codec {a.codec},"
        f" {a.rounds} rounds each; load average {os.getloadavg()[0]:.1f}"
    )
    with tempfile.TemporaryDirectory(prefix="bench-stored-") as tmp:
        async with AsyncExitStack() as stack:
            staged = await stack.enter_async_context(side_of(Path(tmp), "staged", [], spec))
            twice = await stack.enter_async_context(
                side_of(Path(tmp), "twice", ["--read-stage-bytes-max", "0"], spec)
            )
            sides = [staged, twice]
            if a.baseline_tree:
                baseline = side_of(Path(tmp), "unverified", [], spec, tree=a.baseline_tree)
                sides.append(await stack.enter_async_context(baseline))
            ends = [await fill(side.client, a.fragment_mib * MiB, a.fragments) for side in sides]
            end = ends[0]
            hows = {"staged": "staged", "twice": "first_pass"}
            before = {
                s.name: verified_fragments(s.http_port, hows[s.name]) for s in (staged, twice)
            }
            # Alternated: A, B, C, C, B, A, ...
            order = list(sides)
            for _ in range(a.rounds):
                for side in order:
                    await read_through(side, end)
                order.reverse()
            for side in (staged, twice):
                read = verified_fragments(side.http_port, hows[side.name]) - before[side.name]
                if read != a.rounds * a.fragments:
                    raise RuntimeError(
                        f"{side.name}: {read:g} fragments verified {hows[side.name]}, not"
                        f" {a.rounds * a.fragments}: some reads were not of stored fragments"
                    )
            stored_file = next((Path(tmp) / "staged" / "store").rglob("*-*-*"))
            file_mb_s = file_read_bytes_s(stored_file) / 1e6
    sha1_mb_s = sha1_bytes_s(1.0) / 1e6
    print(f"limits: SHA1 {sha1_mb_s:.0f} MB/s; a stored fragment file read {file_mb_s:.0f} MB/s")
    for side in sides:
        mb_s = [end / w / 1e6 for w in side.walls]
        print(
            f"  {side.name:8}: {statistics.median(mb_s):7.1f} MB/s"
            f" (rounds {', '.join(f'{x:.0f}' for x in mb_s)});"
            f" first byte {statistics.median(side.first_bytes) * 1000:7.1f} ms;"
            f" broker CPU {statistics.median(side.cpu_ms_per_mib):.2f} ms/MiB"
        )
    ratio = statistics.median(twice.walls) / statistics.median(staged.walls)
    print(f"staged / read-twice throughput (median wall): {ratio:.2f}")
    if len(sides) > 2:
        ratio = statistics.median(sides[2].walls) / statistics.median(staged.walls)
        print(f"staged / unverified streaming throughput (median wall): {ratio:.2f}")
    limit = min(sha1_mb_s, file_mb_s)
    print(
        f"staged throughput / min(SHA1, file read): "
        f"{end / statistics.median(staged.walls) / 1e6 / limit:.2f}"
    )


if __name__ == "__main__":
    asyncio.run(main())
