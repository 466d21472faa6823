"""Message throughput through one in-process R=1 broker, beside limits measured in the same run.

    .venv/bin/python benchmarks/bench_messages.py [--messages N] [--quick] [--profile PHASE]

Workloads, all in one process (broker, client, publisher and reader share one core through the
GIL), on ~200-byte JSON messages:

- raw append: 1 MiB appends to a plain journal: the broker's MB/s, the baseline;
- publish: `Publisher.publish_committed` through an `AppendService`, awaiting every commit;
- read-committed: a `ReadCommittedIter` over that journal, from offset 0 to its head;
- transactions: `publish_uncommitted` x 100 then `build_ack_intents` + `write_ack_intents`,
  repeatedly, to another journal; then read-committed over that journal.

Limits of the same run: SHA1 MB/s, and msgspec encode+decode of the same message per second
(the floor of any JSON publish-then-read). Every rate is given per wall second and per CPU
second of this process (all threads): the machine is shared, and CPU time is the steadier one.
`--profile publish|read|txn|read-txn` runs that phase under cProfile and prints its top entries.
"gc" is the share of a phase's wall time spent in the cyclic garbage collector.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import hashlib
import os
import pstats
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from google.protobuf.duration_pb2 import Duration

from broker import client
from broker import logging as gazette_logging
from broker.allocator import MemberId, broker_is_consistent
from broker.allocator import serve as allocate
from broker.client.append_service import AppendService
from broker.fragment.stores.registry import new_registry
from broker.keyspace.embedded import EmbeddedBackend
from broker.malloc_tuning import tune_malloc
from broker.protocol import labels
from broker.protocol import protocol_pb2 as pb
from broker.server import Broker, BrokerConfig
from gazette_consumer.message import (
    CONTENT_TYPE_JSON_LINES,
    JSONFraming,
    JSONMessage,
    Partitions,
    Publisher,
    random_mapping,
)
from gazette_consumer.sequencer.read_iter import ReadCommittedIter

RAW_JOURNAL = "bench/raw"
COMMITTED_JOURNAL = "bench/committed"
TXN_JOURNAL = "bench/txn"
TXN_MESSAGES = 100
PUBLISH_TARGET = 200_000
READ_TARGET = 300_000
MESSAGE_POOL = 1024


class Reading(JSONMessage, kw_only=True):
    """A ~200-byte JSON message (with its UUID)."""

    sensor: str = ""
    sequence: int = 0
    value: float = 0.0
    unit: str = ""
    note: str = ""


def make_messages(count: int) -> list[Reading]:
    return [
        Reading(
            sensor=f"sensor-{i % 97:04d}",
            sequence=i,
            value=i * 0.25,
            unit="celsius",
            note="n" * 73,
        )
        for i in range(count)
    ]


@dataclass
class Rate:
    """`count` units of work in `wall_s` seconds, using `cpu_s` CPU seconds of the process, of
    which `gc_s` in the cyclic garbage collector."""

    count: int
    wall_s: float
    cpu_s: float
    gc_s: float = 0.0

    @property
    def per_wall_s(self) -> float:
        return self.count / self.wall_s

    @property
    def per_cpu_s(self) -> float:
        return self.count / max(self.cpu_s, 1e-9)


class GCTimer:
    """Time spent in garbage collections while installed (gc.callbacks)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started


async def timed(
    work: Callable[[], Awaitable[int]], profile: cProfile.Profile | None = None
) -> Rate:
    """Run `work` (which returns how many units it did) and time it, on the wall and the CPU."""
    gc_timer = GCTimer()
    gc.callbacks.append(gc_timer)
    if profile is not None:
        profile.enable()
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        count = await work()
    finally:
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if profile is not None:
            profile.disable()
        gc.callbacks.remove(gc_timer)
    return Rate(count, wall, cpu, gc_timer.seconds)


# --- Machine limits -----------------------------------------------------------------------------


def sha1_mb_s(seconds: float) -> float:
    block = b"\x5a" * (1 << 20)
    h = hashlib.sha1()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        h.update(block)
        n += 1
    return n * len(block) / 1e6 / (time.perf_counter() - t0)


def msgspec_round_trips(messages: list[Reading], count: int) -> Rate:
    """msgspec encode then decode of the benchmark's message, `count` times."""
    encode = msgspec.json.Encoder().encode
    decode = msgspec.json.Decoder(Reading).decode
    pool = len(messages)
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(count):
        decode(encode(messages[i % pool]))
    return Rate(count, time.perf_counter() - t0, time.process_time() - c0)


# --- The broker ---------------------------------------------------------------------------------


def journal_spec(name: str, content_type: str | None) -> pb.JournalSpec:
    spec = pb.JournalSpec(
        name=name,
        replication=1,
        fragment=pb.JournalSpec.Fragment(
            length=256 << 20, compression_codec=pb.NONE, refresh_interval=Duration(seconds=30)
        ),
    )
    if content_type is not None:
        spec.labels.CopyFrom(labels.label_set([(labels.CONTENT_TYPE, content_type)]))
    return spec


def bench_journals() -> list[pb.JournalSpec]:
    return [
        journal_spec(RAW_JOURNAL, None),
        journal_spec(COMMITTED_JOURNAL, CONTENT_TYPE_JSON_LINES),
        journal_spec(TXN_JOURNAL, CONTENT_TYPE_JSON_LINES),
    ]


@contextlib.asynccontextmanager
async def in_process_broker(
    data_dir: Path, specs: list[pb.JournalSpec]
) -> AsyncIterator[client.JournalClient]:
    """One broker (R=1) on an embedded keyspace, with `specs` (named bench/...) assigned to it."""
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
    try:
        await client.apply_journals(c, [client.upsert(spec) for spec in specs])
        async with asyncio.timeout(30):
            async for snapshot in client.watch_journals(c, "prefix=bench/"):
                routed = [j for j in snapshot.journals if j.route.primary >= 0]
                if len(routed) == len(specs):
                    break
        yield c
    finally:
        await c.channels.close()
        allocator.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await allocator
        await broker.stop()
        await backend.close()


# --- Workloads ----------------------------------------------------------------------------------


async def raw_appends(c: client.JournalClient, seconds: float) -> Rate:
    """1 MiB appends, one after another, for `seconds`: a Rate of bytes."""
    block = b"r" * (1 << 20)
    await client.append(c, pb.AppendRequest(journal=RAW_JOURNAL), block)  # Warm-up.

    async def work() -> int:
        t0, count = time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds:
            await client.append(c, pb.AppendRequest(journal=RAW_JOURNAL), block)
            count += 1
        return count * len(block)

    return await timed(work)


async def publish_committed(
    c: client.JournalClient, messages: list[Reading], count: int, profile: cProfile.Profile | None
) -> tuple[Rate, int]:
    """`count` publish_committed to COMMITTED_JOURNAL, every commit awaited: (Rate, head)."""
    mapping = random_mapping(Partitions.of_journals([COMMITTED_JOURNAL], CONTENT_TYPE_JSON_LINES))
    async with AppendService(c) as service:
        publisher = Publisher(service)

        last: list[Any] = []

        async def work() -> int:
            pool = len(messages)
            for i in range(count):
                appended = await publisher.publish_committed(mapping, messages[i % pool])
            await service.flush()
            last.append(appended)
            return count

        rate = await timed(work, profile)
        if service.stats.failed:
            raise RuntimeError(f"{service.stats.failed} publish batches failed")
    # Batches of a journal commit in order: the last one ends at the journal's head.
    return rate, int((await last[0]).commit.end)


async def publish_transactions(
    c: client.JournalClient, messages: list[Reading], count: int, profile: cProfile.Profile | None
) -> tuple[Rate, int]:
    """`count` publish_uncommitted to TXN_JOURNAL with an ACK every TXN_MESSAGES, every commit
    awaited: (Rate, head)."""
    mapping = random_mapping(Partitions.of_journals([TXN_JOURNAL], CONTENT_TYPE_JSON_LINES))
    async with AppendService(c) as service:
        publisher = Publisher(service)

        last: list[Any] = []

        async def work() -> int:
            pool = len(messages)
            for i in range(count):
                await publisher.publish_uncommitted(mapping, messages[i % pool])
                if (i + 1) % TXN_MESSAGES == 0 or i + 1 == count:
                    acks = await publisher.write_ack_intents(publisher.build_ack_intents())
            await service.flush()
            last.extend(acks)
            return count

        rate = await timed(work, profile)
        if service.stats.failed:
            raise RuntimeError(f"{service.stats.failed} transaction batches failed")
    return rate, int((await last[0]).commit.end)


async def read_committed(
    c: client.JournalClient, journal: str, expect: int, profile: cProfile.Profile | None
) -> Rate:
    """Read-committed from offset 0 until `expect` messages were returned; checks that they
    are the published sequence (the pool's messages in order)."""
    it = ReadCommittedIter(c, {journal: 0}, message_type=Reading)

    async def work() -> int:
        count = 0
        env = None
        while count < expect:
            env = await it.next()
            count += 1
            while (more := it.try_next()) is not None:
                env = more
                count += 1
        assert env is not None
        if count != expect or env.message.sequence != (expect - 1) % MESSAGE_POOL:
            raise RuntimeError(
                f"{journal}: read {count} messages ending with sequence "
                f"{env.message.sequence}, expected {expect} ending with {(expect - 1) % MESSAGE_POOL}"
            )
        return count

    try:
        return await timed(work, profile)
    finally:
        await it.close()


# --- Report -------------------------------------------------------------------------------------


def row(name: str, rate: Rate, unit: str, target: float | None = None, note: str = "") -> None:
    line = (
        f"  {name:<34} {rate.per_wall_s:>11,.0f} {unit}/s wall"
        f"  {rate.per_cpu_s:>11,.0f} {unit}/cpu-s"
    )
    if target is not None:
        line += f"  target {target:>9,.0f}  x{rate.per_wall_s / target:4.2f} wall"
        line += f" x{rate.per_cpu_s / target:4.2f} cpu"
    line += f"  gc {rate.gc_s / rate.wall_s:4.0%}"
    print(line + (f"  {note}" if note else ""))


def print_profile(profile: cProfile.Profile, phase: str, sort: str) -> None:
    print(f"\ncProfile of {phase} (top 40 by {sort}):")
    pstats.Stats(profile).sort_stats(sort).print_stats(40)
    if dump := os.environ.get("BENCH_PROFILE_DUMP"):
        profile.dump_stats(dump)  # For pstats or a diff of two runs' profiles.
        print(f"(whole profile written to {dump})")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--quick", action="store_true", help="20k messages, 1 s baselines")
    parser.add_argument("--raw-seconds", type=float, default=3.0)
    parser.add_argument(
        "--profile", choices=["publish", "read", "txn", "read-txn"], help="cProfile one phase"
    )
    parser.add_argument(
        "--profile-sort", default="tottime", help="pstats sort key (tottime, cumulative, ...)"
    )
    parser.add_argument("--no-malloc-tuning", action="store_true")
    args = parser.parse_args()
    count, raw_seconds = args.messages, args.raw_seconds
    if args.quick:
        count, raw_seconds = min(count, 20_000), 1.0
    gazette_logging.configure("console", "warning")
    if not args.no_malloc_tuning:
        print(f"glibc malloc tuned for large buffers (as `gazette serve`): {tune_malloc()}")

    messages = make_messages(MESSAGE_POOL)
    frame_bytes = sum(len(JSONFraming().marshal(m)) for m in messages) / len(messages)
    profiles = {
        phase: cProfile.Profile() if args.profile == phase else None
        for phase in ("publish", "read", "txn", "read-txn")
    }

    print(f"{count:,} messages of ~{frame_bytes:.0f} bytes (JSON lines, UUID included)")
    print("limits (this process, this run):")
    sha1 = sha1_mb_s(raw_seconds)
    round_trips = msgspec_round_trips(messages, min(count, 200_000))
    print(f"  {'SHA1':<34} {sha1:>11,.1f} MB/s")
    row("msgspec encode+decode, no framing", round_trips, "msg")

    with tempfile.TemporaryDirectory() as tmp:
        async with in_process_broker(Path(tmp), bench_journals()) as c:
            raw = await raw_appends(c, raw_seconds)
            publish, head = await publish_committed(c, messages, count, profiles["publish"])
            read = await read_committed(c, COMMITTED_JOURNAL, count, profiles["read"])
            txn, txn_head = await publish_transactions(c, messages, count, profiles["txn"])
            read_txn = await read_committed(c, TXN_JOURNAL, count, profiles["read-txn"])

    raw_mb_s = raw.per_wall_s / 1e6
    print("broker (R=1, in process):")
    print(
        f"  {'raw append, 1 MiB appends':<34} {raw_mb_s:>11,.1f} MB/s wall "
        f" {raw.per_cpu_s / 1e6:>11,.1f} MB/cpu-s"
    )

    def vs_raw(rate: Rate, journal_bytes: int) -> str:
        mb_s = journal_bytes / rate.count * rate.per_wall_s / 1e6
        return f"{mb_s:6.1f} MB/s = {mb_s / raw_mb_s:4.2f} x raw append"

    print("messages:")
    row(
        "publish_committed (commits awaited)", publish, "msg", PUBLISH_TARGET, vs_raw(publish, head)
    )
    row("read-committed of those", read, "msg", READ_TARGET, vs_raw(read, head))
    row(
        f"transactions of {TXN_MESSAGES} per ACK", txn, "msg", PUBLISH_TARGET, vs_raw(txn, txn_head)
    )
    row("read-committed of transactions", read_txn, "msg", READ_TARGET, vs_raw(read_txn, txn_head))
    print(
        f"  (read-committed at {read.per_wall_s / round_trips.per_wall_s:4.2f} x, publishing at "
        f"{publish.per_wall_s / round_trips.per_wall_s:4.2f} x msgspec encode+decode of the run)"
    )
    for phase, profile in profiles.items():
        if profile is not None:
            print_profile(profile, phase, args.profile_sort)


def run() -> None:
    asyncio.run(main())


if __name__ == "__main__":
    run()
