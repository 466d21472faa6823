"""Recovery-log playback of a RocksDBStore's state, against the disk's sequential write.

    .venv/bin/python benchmarks/bench_recovery_log.py [--state-mib 1024] [--rounds 1]
        [--value-kib 64] [--commit-mib 64] [--json FILE] [--profile FILE]

Setup: a separate `gazette serve` process (embedded keyspace, spools durable under its
`--data-dir`; the log's fragments persisted to a `file://` store there), and a recovery-log
journal on it. A RocksDBStore with the default options an application gets records its
database into the log: commits of `--commit-mib` of new keys with incompressible `--value-kib`
values, until the database directory holds `--state-mib` (WAL, SSTs, MANIFEST, ...: what a new
primary must rebuild before it opens the database). RocksDB flushes and compacts meanwhile, so
the log holds more than the state (WAL content, compacted-away SSTs); the store's last hints
let a player skip what is obsolete, as a shard's do.

Measured, `--rounds` times, alternately:

- playback: a `Player` plays the log from the store's last hints into an empty directory on
  the same file system, to the write head (what a new primary does before opening the
  database): persisted fragments are read straight from the `file://` store, verified, and
  the rest through the broker (recoverylog/log_source.py); the player syncs what it played
  before it returns, and the benchmark fsyncs the files again so that the figure puts the same
  bytes on disk as the limit does, whoever syncs them. Rate: MiB of played state per wall second (the time without the final
  fsync is given too). Checked once: the played database opens, with every key written.
- the limit: a sequential write of the same number of bytes in 1 MiB writes to a file on the
  same file system, then fdatasync: the disk's sequential write. Beside it, the same without
  the sync (the page cache).

`os.sync()` before each timed phase keeps one phase's dirty pages from being flushed on the
next one's time. Target (issue #17): playback >= 0.5 x the disk's sequential write.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import rocksdict
from bench_json import write_figures
from google.protobuf.duration_pb2 import Duration
from serve_process import assign_journals, gazette_serve

from broker import client
from broker import logging as gazette_logging
from broker.protocol import labels
from broker.protocol import protocol_pb2 as pb
from broker.protocol.recorded_op_pb2 import FSMHints
from gazette_consumer.checkpoint import Checkpoint
from gazette_consumer.recoverylog.player import Player
from gazette_consumer.stores.conformance import SimpleShard
from gazette_consumer.stores.rocksdb import CHECKPOINT_KEY, RocksDBStore

LOG = "bench/recovery-log"
TARGET = 0.5
WRITE_BYTES = 1 << 20  # The limit's write size.
MIB = 1 << 20


def log_spec() -> pb.JournalSpec:
    return pb.JournalSpec(
        name=LOG,
        replication=1,
        labels=labels.label_set([(labels.CONTENT_TYPE, labels.CONTENT_TYPE_RECOVERY_LOG)]),
        fragment=pb.JournalSpec.Fragment(
            length=256 << 20,
            compression_codec=pb.NONE,
            refresh_interval=Duration(seconds=30),
            stores=["file:///fragments/"],
        ),
    )


def dir_bytes(directory: Path) -> tuple[int, int]:
    """(files, bytes) of the regular files directly in `directory`."""
    sizes = [p.stat().st_size for p in directory.iterdir() if p.is_file()]
    return len(sizes), sum(sizes)


async def record_state(
    c: client.JournalClient, directory: Path, state_bytes: int, value_bytes: int, commit_bytes: int
) -> tuple[FSMHints, int, float]:
    """Record a RocksDBStore in `directory` until it holds `state_bytes`: (its last hints, the
    keys written, seconds it took)."""
    store = RocksDBStore(c, LOG, directory)
    shard = SimpleShard("bench/recovery-log-shard")
    keys, t0 = 0, time.perf_counter()
    try:
        await store.restore_checkpoint(shard)
        per_commit = max(1, commit_bytes // value_bytes)
        while (await asyncio.to_thread(dir_bytes, directory))[1] < state_bytes:
            for _ in range(per_commit):
                store.put(b"key-%010d" % keys, os.urandom(value_bytes))
                keys += 1
            await (await store.start_commit(shard, Checkpoint(), []))
            print(f"\r  recorded {keys * value_bytes / MIB:,.0f} MiB", end="", file=sys.stderr)
        print(file=sys.stderr)
        hints = await store.build_hints()
    finally:
        await store.destroy()
    return hints, keys, time.perf_counter() - t0


def fsync_tree(directory: Path) -> None:
    for path in [*directory.iterdir(), directory]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


async def playback(
    c: client.JournalClient,
    hints: FSMHints,
    into: Path,
    broker_cpu: Callable[[], float],
    profile: str | None = None,
) -> dict[str, float]:
    """Play the log into `into` (timed), then fsync what was played (timed apart). With
    `profile`, the playback runs under cProfile and its statistics are written there."""
    await asyncio.to_thread(os.sync)
    player = Player(c, hints, into)
    player.finish_at_write_head()
    profiler = cProfile.Profile() if profile else None
    t0, c0, b0 = time.perf_counter(), time.process_time(), broker_cpu()
    m0 = time.thread_time()  # The event loop's thread: decoding and writing.
    if profiler is not None:
        profiler.enable()
    try:
        await player.play()
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(profile)
    played_s = time.perf_counter() - t0
    await asyncio.to_thread(fsync_tree, into)
    wall_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    loop_cpu_s = time.thread_time() - m0
    broker_cpu_s = broker_cpu() - b0
    files, size = dir_bytes(into)
    return {
        "bytes": size,
        "files": files,
        "log_bytes_read": player.played_through - player.read_from,
        "direct_bytes": player.direct_bytes,
        "broker_bytes": player.broker_bytes,
        "wall_s": wall_s,
        "played_s": played_s,
        "client_cpu_s": cpu_s,
        # Of it, the event loop's thread; the rest is worker threads (file reads, SHA1, syncs).
        "loop_cpu_s": loop_cpu_s,
        "broker_cpu_s": broker_cpu_s,
    }


def sequential_write(path: Path, size: int, sync: bool) -> tuple[float, float]:
    """(Wall, CPU) seconds to write `size` bytes to `path` in WRITE_BYTES writes (then
    fdatasync)."""
    os.sync()
    block = os.urandom(WRITE_BYTES)
    t0, c0 = time.perf_counter(), time.thread_time()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        written = 0
        while written < size:
            written += os.write(fd, block[: min(WRITE_BYTES, size - written)])
        if sync:
            os.fdatasync(fd)
    finally:
        os.close(fd)
    elapsed, cpu = time.perf_counter() - t0, time.thread_time() - c0
    path.unlink()
    return elapsed, cpu


def check_played(directory: Path, keys: int) -> None:
    """The played database opens, with exactly the keys written (and the checkpoint)."""
    db = rocksdict.Rdict(str(directory), rocksdict.Options(raw_mode=True))
    try:
        found = sum(1 for key in db.keys() if key != CHECKPOINT_KEY)
        if db.get(CHECKPOINT_KEY) is None:
            raise RuntimeError(f"played database in {directory}: no checkpoint")
    finally:
        db.close()
    if found != keys:
        raise RuntimeError(f"played database in {directory}: {found} keys, expected {keys}")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "broker" / "fragments").mkdir(parents=True)
        async with gazette_serve(root / "broker") as broker:
            c = client.JournalClient(broker.endpoint)
            try:
                await assign_journals(c, [log_spec()])
                hints, keys, record_s = await record_state(
                    c,
                    root / "store",
                    args.state_mib * MIB,
                    args.value_kib << 10,
                    args.commit_mib * MIB,
                )
                log_head = int((await client.append(c, pb.AppendRequest(journal=LOG))).commit.end)
                print(
                    f"recorded {keys:,} keys of {args.value_kib} KiB in {record_s:.1f} s: a log of "
                    f"{log_head / MIB:,.0f} MiB"
                )
                rounds: list[dict[str, float]] = []
                for round_ in range(args.rounds):
                    into = root / f"played-{round_}"
                    profile = args.profile if round_ == 0 else None
                    played = await playback(c, hints, into, broker.cpu_s, profile)
                    disk_s, disk_cpu_s = await asyncio.to_thread(
                        sequential_write, root / "sequential", int(played["bytes"]), True
                    )
                    cache_s, _ = await asyncio.to_thread(
                        sequential_write, root / "sequential", int(played["bytes"]), False
                    )
                    if round_ == 0:
                        await asyncio.to_thread(check_played, into, keys)
                    await asyncio.to_thread(_remove_tree, into)
                    played.update(disk_s=disk_s, disk_cpu_s=disk_cpu_s, cache_s=cache_s)
                    rounds.append(played)
                    mib = played["bytes"] / MIB
                    print(
                        f"  round {round_ + 1}: playback {mib / played['wall_s']:7.1f} MiB/s "
                        f"({mib / played['played_s']:.1f} before its fsync; "
                        f"{played['log_bytes_read'] / MIB:,.0f} MiB of log read for {mib:,.0f} "
                        f"MiB of state in {played['files']:.0f} files; "
                        f"{played['direct_bytes'] / MIB:,.0f} MiB read from fragment files, "
                        f"{played['broker_bytes'] / MIB:,.0f} MiB through the broker; CPU s: "
                        f"loop {played['loop_cpu_s']:.2f}, workers "
                        f"{played['client_cpu_s'] - played['loop_cpu_s']:.2f}, broker "
                        f"{played['broker_cpu_s']:.2f}), disk sequential write "
                        f"{mib / disk_s:7.1f} MiB/s, page cache {mib / cache_s:7.1f} MiB/s"
                    )
            finally:
                await c.channels.close()
            conditions = {
                "broker": "a separate `gazette serve` process (embedded keyspace), R=1",
                "broker_args": " ".join(broker.args),
                "spools": "durable files under --data-dir, no --fsync; fragments persisted to a "
                "file:// store",
                "store": "RocksDBStore, default options; values incompressible",
                "playback_reads": "persisted fragments straight from the file:// store "
                "(verified against their names), the rest through the broker",
                "file_system": _file_system(root),
            }
    return {"keys": keys, "log_bytes": log_head, "rounds": rounds, "conditions": conditions}


def _remove_tree(path: Path) -> None:
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


def _file_system(path: Path) -> str:
    """The file system type and device `path` is on, from /proc/mounts (longest mount point)."""
    best = ("", "?", "?")
    real = str(path.resolve())
    for line in Path("/proc/mounts").read_text().splitlines():
        device, point, kind, *_ = line.split()
        if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) > len(
            best[0]
        ):
            best = (point, kind, device)
    return f"{best[1]} on {best[2]} (mounted at {best[0]})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--value-kib", type=int, default=64)
    parser.add_argument("--commit-mib", type=int, default=64)
    parser.add_argument("--json", help="also write the figures to this file (bench_all.py)")
    parser.add_argument(
        "--profile", help="run the first playback under cProfile, its statistics to this file"
    )
    args = parser.parse_args()
    if min(args.state_mib, args.rounds, args.value_kib, args.commit_mib) < 1:
        parser.error("--state-mib, --rounds, --value-kib and --commit-mib must be >= 1")
    gazette_logging.configure("console", "warning")
    out = asyncio.run(run(args))
    rates = [r["bytes"] / r["wall_s"] / MIB for r in out["rounds"]]
    disks = [r["bytes"] / r["disk_s"] / MIB for r in out["rounds"]]
    ratio = statistics.median(rates) / statistics.median(disks)
    print(
        f"playback {statistics.median(rates):.1f} MiB/s = {ratio:.2f} x the disk's sequential "
        f"write ({statistics.median(disks):.1f} MiB/s), target >= {TARGET:.2f}: "
        f"{'holds' if ratio >= TARGET else 'MISSED'}"
    )
    if args.json:
        out.update(state_mib=args.state_mib, value_kib=args.value_kib, target=TARGET)
        write_figures(args.json, out)


if __name__ == "__main__":
    main()
