"""Message throughput through an R=1 broker, beside limits measured in the same run.

    .venv/bin/python benchmarks/bench_messages.py [--messages N] [--rounds R] [--quick]
        [--broker serve|in-process] [--profile PHASE] [--json FILE]

The broker (`--broker serve`, the default) is a separate `gazette serve` process as a user runs
it: embedded keyspace, spools durable under `--data-dir` (benchmarks/serve_process.py); this
process is its client. `--broker in-process` runs it inside this process instead (durable spools
under a data directory too), where broker, client, publisher and reader share one GIL: for
profiling the whole path with cProfile. Workloads, on ~200-byte JSON messages:

- raw append: 1 MiB appends to a plain journal: the broker's MB/s;
- publish, acknowledged: `Publisher.publish_committed` through an `AppendService`; every
  append batch the messages went into is awaited before the clock stops, so the rate counts
  only messages the broker acknowledged (appends are pipelined: the publisher does not wait for
  one batch's acknowledgement before filling the next). Printed beside it: how many append
  batches it took, of how many messages, how many were unacknowledged at once at most, and the
  seconds from the last publish to the last acknowledgement (what did not overlap);
- read-committed: a `ReadCommittedIter` over that journal, from offset 0 to its head;
- transactions: `publish_uncommitted` x 100 then `build_ack_intents` + `write_ack_intents`,
  repeatedly, to another journal, every batch awaited as above; then read-committed over it.

The four phases run in `--rounds` rounds of `--messages / R` messages each (a round's reads
read what the round published), and msgspec encode+decode of the same message (the floor of any
JSON publish-then-read) is measured before the first phase and after every phase, on as many
messages as a phase: each phase of each round is divided by the mean of the measurements just
before and just after it, and the headline ratio (against the targets of issue #17) is the
median of those pair ratios, printed with their spread and a distribution-free 90% interval.
A shared machine's CPU speed moves within seconds and by 2x between adjacent runs: a baseline
measured apart from the figure it divides (once a run, or as a run's median) moves the ratio
with it; a pair sees nearly the same machine. SHA1 MB/s is printed too. Every rate is per wall second and per CPU second of
this process and the broker's (all threads of both). `--profile publish|read|txn|read-txn` runs
that phase under cProfile (of this process) and prints its top entries. "gc" is the share of a
phase's wall time spent in this process's cyclic garbage collector. `--json FILE` also writes
the figures for benchmarks/bench_all.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import os
import pstats
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import bench_kit
import msgspec
from bench_json import write_figures
from bench_kit import assign_journals, gazette_serve, sha1_bytes_s
from bench_stats import median_interval
from google.protobuf.duration_pb2 import Duration

from broker import client
from broker import logging as gazette_logging
from broker.client.append_service import AppendService, AsyncAppend
from broker.malloc_tuning import tune_malloc
from broker.protocol import labels
from broker.protocol import protocol_pb2 as pb
from broker.server import BrokerConfig
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
# Issue #17: publish (acknowledged) and read-committed, as ratios of msgspec encode+decode of
# the same message in the same run.
PUBLISH_RATIO_TARGET = 0.4
READ_RATIO_TARGET = 0.7
MESSAGE_POOL = 1024
# The phases of a round, in order; the baseline is measured before the first and after each.
PHASES = ("publish", "read_committed", "txn_publish", "txn_read_committed")


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


def total(rates: list[Rate]) -> Rate:
    """Several rounds' Rates as one (their counts and seconds summed)."""
    return Rate(
        sum(r.count for r in rates),
        sum(r.wall_s for r in rates),
        sum(r.cpu_s for r in rates),
        sum(r.gc_s for r in rates),
    )


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


def no_cpu() -> float:
    return 0.0


async def timed(
    work: Callable[[], Awaitable[int]],
    profile: cProfile.Profile | None = None,
    other_cpu: Callable[[], float] = no_cpu,
) -> Rate:
    """Run `work` (which returns how many units it did) and time it, on the wall and the CPU
    of this process plus `other_cpu()`'s (a separate broker process's CPU seconds)."""
    gc_timer = GCTimer()
    gc.callbacks.append(gc_timer)
    if profile is not None:
        profile.enable()
    t0, c0, o0 = time.perf_counter(), time.process_time(), other_cpu()
    try:
        count = await work()
    finally:
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        cpu += other_cpu() - o0
        if profile is not None:
            profile.disable()
        gc.callbacks.remove(gc_timer)
    return Rate(count, wall, cpu, gc_timer.seconds)


# --- Machine limits -----------------------------------------------------------------------------


def sha1_mb_s(seconds: float) -> float:
    return sha1_bytes_s(seconds) / 1e6


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


IN_PROCESS_SPOOLS = "durable files under a data directory (BrokerConfig.data_dir), no fsync"


@contextlib.asynccontextmanager
async def in_process_broker(
    data_dir: Path, specs: list[pb.JournalSpec]
) -> AsyncIterator[client.JournalClient]:
    """One broker (R=1) on an embedded keyspace, with `specs` (named bench/...) assigned to it.
    Its spools are durable files under `data_dir`, as `gazette serve --data-dir` keeps them."""
    config = BrokerConfig(zone="local", suffix="bench", data_dir=str(data_dir))
    async with bench_kit.in_process_broker(config, specs) as c:
        yield c


@contextlib.asynccontextmanager
async def message_broker(
    kind: str, data_dir: Path, specs: list[pb.JournalSpec]
) -> AsyncIterator[tuple[client.JournalClient, Callable[[], float], dict[str, str]]]:
    """The broker of `--broker kind`: (a client of it, its CPU seconds if it is another process,
    the conditions it runs in)."""
    if kind == "in-process":
        async with in_process_broker(data_dir, specs) as c:
            yield c, no_cpu, {"broker": "in this process (one GIL)", "spools": IN_PROCESS_SPOOLS}
        return
    async with gazette_serve(data_dir) as serve:
        c = client.JournalClient(serve.endpoint)
        try:
            await assign_journals(c, specs)
            conditions = {
                "broker": "a separate `gazette serve` process (embedded keyspace), R=1; "
                "client, publisher and reader in this process",
                "broker_args": " ".join(serve.args),
                "spools": "durable files under --data-dir (the default of a broker with a data "
                "directory), no --fsync",
            }
            yield c, serve.cpu_s, conditions
        finally:
            await c.channels.close()


# --- Workloads ----------------------------------------------------------------------------------


async def raw_appends(
    c: client.JournalClient, seconds: float, other_cpu: Callable[[], float] = no_cpu
) -> Rate:
    """1 MiB appends, one after another, for `seconds`: a Rate of bytes."""
    block = b"r" * (1 << 20)
    await client.append(c, pb.AppendRequest(journal=RAW_JOURNAL), block)  # Warm-up.

    async def work() -> int:
        t0, count = time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds:
            await client.append(c, pb.AppendRequest(journal=RAW_JOURNAL), block)
            count += 1
        return count * len(block)

    return await timed(work, other_cpu=other_cpu)


async def acknowledged(appends: list[AsyncAppend]) -> int:
    """Await every batch in `appends` (raising if one failed): the end offset of the last."""
    end = 0
    for append in appends:
        end = max(end, int((await append).commit.end))
    return end


@dataclass
class Appends:
    """How a publish phase's messages went to the broker: `count` append batches (one Append
    RPC each, retries aside) of `messages_per_append` on average; at most `unacknowledged_max`
    of them unacknowledged at once (the one being appended and those filled behind it: 1 means
    the publisher waited for each batch, more that it filled the next ones meanwhile); `tail_s`
    from the last publish to the last acknowledgement (what of the phase did not overlap)."""

    count: int = 0
    messages_per_append: float = 0.0
    unacknowledged_max: int = 0
    tail_s: float = 0.0

    @classmethod
    def of(cls, rounds: list[Appends]) -> Appends:
        """The appends of several rounds' publish phases together."""
        count = sum(a.count for a in rounds)
        messages = sum(a.count * a.messages_per_append for a in rounds)
        return cls(
            count=count,
            messages_per_append=messages / max(count, 1),
            unacknowledged_max=max(a.unacknowledged_max for a in rounds),
            tail_s=sum(a.tail_s for a in rounds) / len(rounds),
        )

    def note(self) -> str:
        return (
            f"{self.count} appends of ~{self.messages_per_append:,.0f} messages, at most "
            f"{self.unacknowledged_max} unacknowledged at once; {self.tail_s:.2f} s after the "
            "last publish (a round's mean)"
        )


async def publish_committed(
    c: client.JournalClient,
    messages: list[Reading],
    count: int,
    profile: cProfile.Profile | None,
    other_cpu: Callable[[], float] = no_cpu,
) -> tuple[Rate, int, Appends]:
    """`count` publish_committed to COMMITTED_JOURNAL; the clock stops once every batch they
    went into is acknowledged (each awaited, failures raised): (Rate, head, Appends)."""
    mapping = random_mapping(Partitions.of_journals([COMMITTED_JOURNAL], CONTENT_TYPE_JSON_LINES))
    head = [0]
    appends = Appends()
    async with AppendService(c) as service:
        publisher = Publisher(service)

        async def work() -> int:
            pool = len(messages)
            # A batch takes many messages, one after another (one journal): the loop notes a
            # batch when it changes, as an application awaiting its batches would.
            batches: list[AsyncAppend] = []
            last: AsyncAppend | None = None
            for i in range(count):
                appended = await publisher.publish_committed(mapping, messages[i % pool])
                if appended is not last:
                    batches.append(last := appended)
                    # A new batch (tens per phase): how many are unacknowledged with it.
                    pending = sum(1 for batch in batches if not batch.done())
                    appends.unacknowledged_max = max(appends.unacknowledged_max, pending)
            published = time.perf_counter()
            head[0] = await acknowledged(batches)
            appends.tail_s = time.perf_counter() - published
            appends.count = len(batches)
            appends.messages_per_append = count / max(len(batches), 1)
            return count

        rate = await timed(work, profile, other_cpu)
        if service.stats.failed:
            raise RuntimeError(f"{service.stats.failed} publish batches failed")
    return rate, head[0], appends


async def publish_transactions(
    c: client.JournalClient,
    messages: list[Reading],
    count: int,
    profile: cProfile.Profile | None,
    other_cpu: Callable[[], float] = no_cpu,
) -> tuple[Rate, int]:
    """`count` publish_uncommitted to TXN_JOURNAL with an ACK every TXN_MESSAGES; the clock
    stops once every ACK (which commits after the transaction's messages) is acknowledged:
    (Rate, head)."""
    mapping = random_mapping(Partitions.of_journals([TXN_JOURNAL], CONTENT_TYPE_JSON_LINES))
    head = [0]
    async with AppendService(c) as service:
        publisher = Publisher(service)

        async def work() -> int:
            pool = len(messages)
            batches: dict[int, AsyncAppend] = {}
            for i in range(count):
                await publisher.publish_uncommitted(mapping, messages[i % pool])
                if (i + 1) % TXN_MESSAGES == 0 or i + 1 == count:
                    acks = await publisher.write_ack_intents(publisher.build_ack_intents())
                    for ack in acks:
                        batches.setdefault(id(ack), ack)
            head[0] = await acknowledged(list(batches.values()))
            return count

        rate = await timed(work, profile, other_cpu)
        if service.stats.failed:
            raise RuntimeError(f"{service.stats.failed} transaction batches failed")
    return rate, head[0]


async def read_committed(
    c: client.JournalClient,
    journal: str,
    offset: int,
    expect: int,
    profile: cProfile.Profile | None,
    other_cpu: Callable[[], float] = no_cpu,
) -> Rate:
    """Read-committed from `offset` (where a round's publishing began) until `expect` messages
    were returned; checks that they are the published sequence (the pool's messages in order)."""
    it = ReadCommittedIter(c, {journal: offset}, message_type=Reading)

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
        return await timed(work, profile, other_cpu)
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


def pair_ratios(
    rounds: list[dict[str, Rate]], limits: list[Rate], phase: str
) -> list[tuple[float, float]]:
    """(wall, cpu) ratio of `phase` in each round to the mean of the baseline measured just
    before it and just after it (`limits` holds one before the first phase and one after each)."""
    out = []
    index = PHASES.index(phase)
    for n, rates in enumerate(rounds):
        before, after = limits[n * len(PHASES) + index], limits[n * len(PHASES) + index + 1]
        rate = rates[phase]
        out.append(
            (
                rate.per_wall_s / ((before.per_wall_s + after.per_wall_s) / 2),
                rate.per_cpu_s / ((before.per_cpu_s + after.per_cpu_s) / 2),
            )
        )
    return out


def pair_ratios_line(name: str, ratios: list[tuple[float, float]], target: float | None) -> str:
    walls = [w for w, _ in ratios]
    wall, cpu = statistics.median(walls), statistics.median(c for _, c in ratios)
    interval = median_interval(walls)
    spread = f"{min(walls):.2f}-{max(walls):.2f}"
    line = f"  {name:<34} {wall:5.2f} x wall (pairs {spread}"
    if interval is not None:
        line += f", 90% {interval[0]:.2f}-{interval[1]:.2f}"
    line += f")  {cpu:5.2f} x cpu"
    if target is not None:
        verdict = "holds" if wall >= target else "MISSED"
        line += f"   target >= {target:.2f} x wall: {verdict}"
    return line


def rate_json(rate: Rate) -> dict[str, float]:
    return {
        "count": rate.count,
        "wall_s": rate.wall_s,
        "cpu_s": rate.cpu_s,
        "per_wall_s": rate.per_wall_s,
        "per_cpu_s": rate.per_cpu_s,
        "gc_share": rate.gc_s / rate.wall_s,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--quick", action="store_true", help="20k messages, 1 s baselines")
    parser.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="rounds of the four phases, each of --messages / ROUNDS messages, the baseline "
        "measured between every two phases (default 5: the fewest with a 90%% interval)",
    )
    parser.add_argument("--raw-seconds", type=float, default=3.0)
    parser.add_argument(
        "--broker",
        choices=["serve", "in-process"],
        default="serve",
        help="a separate `gazette serve` process (default), or a broker in this process",
    )
    parser.add_argument(
        "--profile", choices=["publish", "read", "txn", "read-txn"], help="cProfile one phase"
    )
    parser.add_argument(
        "--profile-sort", default="tottime", help="pstats sort key (tottime, cumulative, ...)"
    )
    parser.add_argument("--no-malloc-tuning", action="store_true")
    parser.add_argument("--json", help="also write the figures to this file (bench_all.py)")
    args = parser.parse_args()
    count, raw_seconds = args.messages, args.raw_seconds
    if args.quick:
        count, raw_seconds = min(count, 20_000), 1.0
    if args.rounds < 1 or count < args.rounds:
        parser.error(f"--rounds: must be in [1, --messages] (got {args.rounds})")
    per_round = count // args.rounds
    count = per_round * args.rounds
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
    print(f"  {'SHA1':<34} {sha1:>11,.1f} MB/s")
    # The baseline (msgspec encode+decode) is measured between every two phases, so that each
    # phase has one measurement just before it and one just after (a shared CPU's speed moves
    # within seconds, and between adjacent runs by 2x): each phase of each round is divided by
    # the mean of its two, and the headline ratio is the median of those pair ratios.
    limit_count = min(per_round, 200_000)
    limits: list[Rate] = []
    rounds: list[dict[str, Rate]] = []
    appends_each: list[Appends] = []
    loads: list[float] = []

    def limit() -> None:
        limits.append(msgspec_round_trips(messages, limit_count))

    with tempfile.TemporaryDirectory() as tmp:
        async with message_broker(args.broker, Path(tmp), bench_journals()) as (c, cpu, where):
            raw = await raw_appends(c, raw_seconds, cpu)
            head = txn_head = 0
            limit()
            for _ in range(args.rounds):
                loads.append(os.getloadavg()[0])  # Beside each round: was the machine quiet?
                start, txn_start = head, txn_head
                publish, head, appends = await publish_committed(
                    c, messages, per_round, profiles["publish"], cpu
                )
                limit()
                read = await read_committed(
                    c, COMMITTED_JOURNAL, start, per_round, profiles["read"], cpu
                )
                limit()
                txn, txn_head = await publish_transactions(
                    c, messages, per_round, profiles["txn"], cpu
                )
                limit()
                read_txn = await read_committed(
                    c, TXN_JOURNAL, txn_start, per_round, profiles["read-txn"], cpu
                )
                limit()
                rounds.append(
                    {
                        "publish": publish,
                        "read_committed": read,
                        "txn_publish": txn,
                        "txn_read_committed": read_txn,
                    }
                )
                appends_each.append(appends)
    walls = sorted(limits, key=lambda r: r.per_wall_s)
    round_trips = walls[len(walls) // 2]
    row(f"msgspec encode+decode (median of {len(limits)})", round_trips, "msg")
    print(f"    (each: {', '.join(f'{r.per_wall_s:,.0f}' for r in limits)} msg/s)")
    totals = {phase: total([r[phase] for r in rounds]) for phase in PHASES}
    publish, read = totals["publish"], totals["read_committed"]
    txn, read_txn = totals["txn_publish"], totals["txn_read_committed"]
    appends = Appends.of(appends_each)

    raw_mb_s = raw.per_wall_s / 1e6
    print(f"broker (R=1, {where['broker']}; spools: {where['spools']}):")
    print(
        f"  {'raw append, 1 MiB appends':<34} {raw_mb_s:>11,.1f} MB/s wall "
        f" {raw.per_cpu_s / 1e6:>11,.1f} MB/cpu-s"
    )

    def vs_raw(rate: Rate, journal_bytes: int) -> str:
        mb_s = journal_bytes / rate.count * rate.per_wall_s / 1e6
        return f"{mb_s:6.1f} MB/s = {mb_s / raw_mb_s:4.2f} x raw append"

    print("messages (cpu: this process and the broker's):")
    row("publish, acknowledged", publish, "msg", PUBLISH_TARGET, vs_raw(publish, head))
    print(f"    ({appends.note()})")
    row("read-committed of those", read, "msg", READ_TARGET, vs_raw(read, head))
    row(
        f"transactions of {TXN_MESSAGES} per ACK", txn, "msg", PUBLISH_TARGET, vs_raw(txn, txn_head)
    )
    row("read-committed of transactions", read_txn, "msg", READ_TARGET, vs_raw(read_txn, txn_head))
    print(
        "against msgspec encode+decode of the same message: each round's phase over the mean of "
        "the measurements just before and just after it (load average at the rounds' starts: "
        f"{', '.join(f'{load:.1f}' for load in loads)} on {os.cpu_count()} cores)"
    )
    for phase, name, target in (
        ("publish", "publish, acknowledged", PUBLISH_RATIO_TARGET),
        ("read_committed", "read-committed", READ_RATIO_TARGET),
        ("txn_publish", f"transactions of {TXN_MESSAGES} per ACK", None),
        ("txn_read_committed", "read-committed of transactions", None),
    ):
        print(pair_ratios_line(name, pair_ratios(rounds, limits, phase), target))
    for phase, profile in profiles.items():
        if profile is not None:
            print_profile(profile, phase, args.profile_sort)
    if args.json:
        figures = {
            "messages": count,
            "message_bytes": frame_bytes,
            "conditions": where,
            "sha1_mb_s": sha1,
            "msgspec": rate_json(round_trips),
            "msgspec_each": [rate_json(r) for r in limits],
            "raw_append_bytes": rate_json(raw),
            "rounds": [{phase: rate_json(r[phase]) for phase in PHASES} for r in rounds],
            "rounds_load_1min": loads,
            "publish": rate_json(publish),
            "publish_appends": asdict(appends),
            "read_committed": rate_json(read),
            "txn_publish": rate_json(txn),
            "txn_read_committed": rate_json(read_txn),
            "targets": {"publish": PUBLISH_RATIO_TARGET, "read_committed": READ_RATIO_TARGET},
        }
        write_figures(args.json, figures)


def run() -> None:
    asyncio.run(main())


if __name__ == "__main__":
    run()
