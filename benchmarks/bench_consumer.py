"""One consumer shard counting messages: exactly-once against at-least-once, in one run.

    .venv/bin/python benchmarks/bench_consumer.py [--messages N] [--rounds R] [--pg-url URL]
        [--input committed|txn] [--publish per-txn|per-message|none] [--max-txn-s S]
        [--min-txn-s S] [--profile MODE]

Setup, all in one process (broker, shard, stores' threads share two cores and one GIL): one
R=1 broker on an embedded keyspace; N ~200-byte JSON messages published to one source journal
first (`--input committed`: each committed by itself; `txn`: transactions of 100 per ACK).
Then, alternating `--rounds` times, one shard of a trivial counting Application reads the whole
journal from offset 0, in each of these modes:

- **exactly-once** (`eo sqlite`, `eo postgres`): the default source (a `ReadCommittedIter`),
  a `SQLStore` (a SQLite file; PostgreSQL with `--pg-url` or $GAZETTE_TEST_PG_URL) committing
  the counts with the checkpoint, transactions of `--min-txn-s` (0) to `--max-txn-s` (1 s;
  both modes: a transaction closes once the shard caught up and its minimum passed), and a
  transactional publish: one `Summary` message per transaction published uncommitted, whose
  ACK intent is in the checkpoint and is written once the commit is durable.
- **at-least-once** (`alo sqlite`, ...): the same Application, but a read-uncommitted source
  (no Sequencer: duplicates and rolled-back messages would be counted), a store without a
  checkpoint (the counts are written to the same database in a transaction of their own), and
  the summary published committed.

Both modes run the same `CountApp` (counting_app.py): a count per key in memory, written to
the database in `finalize_txn`. `--publish per-message` publishes one derived message per
message instead of one summary per transaction; `none` publishes nothing.

Rates are messages per wall second from the shard's first `begin_txn` until its progress (a
completed transaction: committed, ACKs written) reaches the journal's head; also per CPU second
of the process (all threads; "loop thread" is the event loop's share). Beside them, limits of
the same run: read-committed iteration of the journal without a shard, the read-uncommitted
source without a shard, msgspec encode+decode. The overhead of exactly-once is 1 - eo/alo, of
the median rates and, steadier on a shared machine, the median of each round's pair (each
round's pair is printed too, to pool rounds across runs). With `--min-txn-s` = `--max-txn-s`
every transaction lasts that long in both modes, and a run ends on a whole transaction: compare
CPU rates then, over runs of many transactions.
Progress goes to stderr (a line per run; a live counter on a terminal or with BENCH_PROGRESS=1).
`--profile eo-sqlite` (or any mode) runs that mode once more under cProfile and prints it
(`--profile-clock cpu` times the loop thread's CPU rather than wall time; BENCH_PROFILE_DUMP=
FILE also writes the whole profile, e.g. to diff two modes' with pstats).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import math
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from bench_messages import (
    MESSAGE_POOL,
    TXN_MESSAGES,
    GCTimer,
    Rate,
    Reading,
    in_process_broker,
    journal_spec,
    make_messages,
    msgspec_round_trips,
    print_profile,
)
from counting_app import OUTPUT, SOURCE, CountApp, UncommittedSource, prepare
from google.protobuf.duration_pb2 import Duration
from sqlalchemy.engine import Engine

from broker import client
from broker import logging as gazette_logging
from broker.client.append_service import AppendService, AsyncAppend
from broker.malloc_tuning import tune_malloc
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import protocol_pb2 as pb
from gazette_consumer.message import CONTENT_TYPE_JSON_LINES, Partition, Publisher
from gazette_consumer.sequencer.read_iter import ReadCommittedIter
from gazette_consumer.shard_runner import ShardRunner
from gazette_consumer.stores.sql import create_sqlite_engine

OVERHEAD_TARGET = 0.03
SHARD_TARGET = 100_000
RUN_TIMEOUT_S = 600.0
LIMIT_MESSAGES = 300_000
PROGRESS_EVERY_S = 0.5

# --- Broker, databases, input -------------------------------------------------------------------


def consumer_journals() -> list[pb.JournalSpec]:
    """SOURCE and OUTPUT, with fragments so large that they never roll to a persisted one."""
    specs = [journal_spec(j, CONTENT_TYPE_JSON_LINES) for j in (SOURCE, OUTPUT)]
    for spec in specs:
        spec.fragment.length = 1 << 30
    return specs


@contextlib.asynccontextmanager
async def pg_database(pg_url: str) -> AsyncIterator[Engine]:
    """An engine on a database created for this run, dropped afterwards."""
    name = f"bench_consumer_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(pg_url, isolation_level="AUTOCOMMIT")

    def ddl(statement: str) -> None:
        with admin.connect() as connection:
            connection.exec_driver_sql(statement)

    await asyncio.to_thread(ddl, f'CREATE DATABASE "{name}"')
    engine = sa.create_engine(sa.make_url(pg_url).set(database=name))
    try:
        yield await prepare(engine)
    finally:
        engine.dispose()
        await asyncio.to_thread(ddl, f'DROP DATABASE "{name}" WITH (FORCE)')
        admin.dispose()


class Ticker:
    """A progress line on stderr, rewritten every PROGRESS_EVERY_S while a phase runs."""

    def __init__(self, label: str, total: int, done: Callable[[], int]) -> None:
        self._label, self._total, self._done = label, total, done
        self._task: asyncio.Task[None] | None = None
        self._enabled = sys.stderr.isatty() or os.environ.get("BENCH_PROGRESS") == "1"

    async def _tick(self) -> None:
        t0 = time.perf_counter()
        while True:
            await asyncio.sleep(PROGRESS_EVERY_S)
            done, elapsed = self._done(), time.perf_counter() - t0
            print(
                f"\r  {self._label}: {done:,}/{self._total:,} ({done / elapsed:,.0f}/s)   ",
                end="",
                file=sys.stderr,
                flush=True,
            )

    def __enter__(self) -> Ticker:
        if self._enabled:
            self._task = asyncio.get_running_loop().create_task(self._tick())
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            print("\r" + " " * 78 + "\r", end="", file=sys.stderr, flush=True)


async def publish_input(
    c: client.JournalClient, count: int, transactions: bool
) -> tuple[Rate, int]:
    """Publish `count` Readings to SOURCE: (Rate, the journal's head)."""
    messages = make_messages(MESSAGE_POOL)
    to_source = lambda _m: Partition(SOURCE, CONTENT_TYPE_JSON_LINES)  # noqa: E731
    done = [0]
    async with AppendService(c) as service:
        publisher = Publisher(service)
        t0, c0 = time.perf_counter(), time.process_time()
        last: list[AsyncAppend] = []
        with Ticker("publishing", count, lambda: done[0]):
            for i in range(count):
                message = messages[i % MESSAGE_POOL]
                if transactions:
                    await publisher.publish_uncommitted(to_source, message)
                    if (i + 1) % TXN_MESSAGES == 0 or i + 1 == count:
                        last = await publisher.write_ack_intents(publisher.build_ack_intents())
                else:
                    last = [await publisher.publish_committed(to_source, message)]
                done[0] = i + 1
            await service.flush()
        rate = Rate(count, time.perf_counter() - t0, time.process_time() - c0)
        if service.stats.failed:
            raise RuntimeError(f"{service.stats.failed} append batches failed")
    return rate, int((await last[-1]).commit.end)


# --- Runs ---------------------------------------------------------------------------------------


@dataclass
class Result:
    rate: Rate
    transactions: int
    loop_cpu_s: float  # CPU time of the event loop's thread (the rest: worker threads).
    # With --steady-txns: CPU seconds over the window by thread group (thread_cpu_s).
    threads: dict[str, float] | None = None


CONFIDENCE = 0.9


def median_interval(
    values: list[float], confidence: float = CONFIDENCE
) -> tuple[float, float] | None:
    """A distribution-free confidence interval of the median of `values` (order statistics:
    the median lies between the j-th smallest and the j-th largest with probability >=
    `confidence`, for the largest such j, whatever the distribution). None if there are too
    few values for one (fewer than 5 at 90%)."""
    ordered, n = sorted(values), len(values)
    tail = (1 - confidence) / 2
    # P(fewer than j of n values fall below the median) = P(Binomial(n, 1/2) < j).
    below, j = 0.0, 0
    while j < n // 2 and below + math.comb(n, j) / 2**n <= tail:
        below += math.comb(n, j) / 2**n
        j += 1
    if j == 0:
        return None
    return ordered[j - 1], ordered[n - j]


def thread_cpu_s() -> dict[str, float]:
    """CPU seconds (user + system) of this process's threads, summed by thread name with
    trailing numbers dropped ("sqlstore_0" and "sqlstore_1" are "sqlstore"), from /proc. The
    event loop's thread is "loop" (Python's other threads are all named "python")."""
    out: dict[str, float] = {}
    loop_tid = str(threading.main_thread().native_id)
    for task in Path("/proc/self/task").iterdir():
        try:
            name = (task / "comm").read_text().strip().rstrip("0123456789_-") or "?"
            name = "loop" if task.name == loop_tid else name
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # The thread ended meanwhile.
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / _TICKS_S
    return out


_TICKS_S = os.sysconf("SC_CLK_TCK")


def duration(seconds: float) -> Duration:
    whole = int(seconds)
    return Duration(seconds=whole, nanos=round((seconds - whole) * 1e9))


def spec_of(shard_id: str, max_txn_s: float, min_txn_s: float) -> cpb.ShardSpec:
    return cpb.ShardSpec(
        id=shard_id,
        sources=[cpb.ShardSpec.Source(journal=SOURCE)],
        max_txn_duration=duration(max_txn_s),
        min_txn_duration=duration(min_txn_s),
    )


async def run_shard(
    c: client.JournalClient,
    app: CountApp,
    shard_id: str,
    count: int,
    head: int,
    max_txn_s: float,
    min_txn_s: float,
    profile: cProfile.Profile | None = None,
    steady_txns: int = 0,
) -> Result:
    """Run one shard of `app` until it completed a transaction through `head`; or, with
    `steady_txns`, until `steady_txns` whole transactions after the first have been consumed,
    measured between their `begin_txn`s (none of which may reach `head`)."""
    ended: asyncio.Future[tuple[float, float, float]] = asyncio.get_running_loop().create_future()
    gc_timer = GCTimer()
    gc_at_marks: list[float] = []
    threads_at_marks: list[dict[str, float]] = []

    def changed() -> None:
        if ended.done():
            return
        handle = runner.shard(shard_id)
        if handle.status().code == cpb.ReplicaStatus.FAILED:
            ended.set_exception(RuntimeError(f"{shard_id}: {list(handle.status().errors)}"))
        elif handle.progress().read_through.get(SOURCE, 0) >= head:
            if steady_txns:
                ended.set_exception(
                    RuntimeError(
                        f"{shard_id}: read the whole journal within {len(app.marks)} "
                        f"transactions, before {steady_txns} steady ones: raise --messages "
                        f"(marks: {app.marks})"
                    )
                )
            else:
                ended.set_result((time.perf_counter(), time.process_time(), time.thread_time()))

    def marked() -> None:
        gc_at_marks.append(gc_timer.seconds)
        threads_at_marks.append(thread_cpu_s())
        if len(app.marks) == steady_txns + 2 and not ended.done():
            ended.set_result(app.marks[-1][:3])

    if steady_txns:
        app.on_mark = marked
    gc.callbacks.append(gc_timer)
    if profile is not None:
        profile.enable()
    try:
        async with ShardRunner(app, c, root=f"/bench/{shard_id}") as runner:
            runner.start(spec_of(shard_id, max_txn_s, min_txn_s), on_change=changed)
            with Ticker(shard_id, count, lambda: app.consumed):
                wall_end, cpu_end, loop_end = await asyncio.wait_for(ended, RUN_TIMEOUT_S)
    finally:
        if profile is not None:
            profile.disable()
        gc.callbacks.remove(gc_timer)
    assert app.began_at is not None
    if steady_txns:
        # From the second transaction's begin (the first one warms up) to the last mark.
        wall_0, cpu_0, loop_0, consumed_0 = app.marks[1]
        consumed = app.marks[steady_txns + 1][3] - consumed_0
        gc_s = gc_at_marks[steady_txns + 1] - gc_at_marks[1]
        rate = Rate(consumed, wall_end - wall_0, cpu_end - cpu_0, gc_s)
        first, last = threads_at_marks[1], threads_at_marks[steady_txns + 1]
        threads = {name: cpu - first.get(name, 0.0) for name, cpu in last.items()}
        return Result(rate, steady_txns, loop_end - loop_0, threads)
    if app.consumed != count:
        raise RuntimeError(f"{shard_id}: counted {app.consumed} messages, expected {count}")
    wall_0, cpu_0, loop_0 = app.began_at
    rate = Rate(count, wall_end - wall_0, cpu_end - cpu_0, gc_timer.seconds)
    return Result(rate, app.transactions, loop_end - loop_0)


async def drain(source: Any, count: int) -> Rate:
    """Take `count` messages from a read iterator or source, as a shard's loop would but with
    nothing else: `next()` when nothing is ready, `try_next()` while something is."""
    t0, c0 = time.perf_counter(), time.process_time()
    n = 0
    while n < count:
        await source.next()
        n += 1
        while n < count and source.try_next() is not None:
            n += 1
    return Rate(count, time.perf_counter() - t0, time.process_time() - c0)


async def raw_read_committed(c: client.JournalClient, count: int) -> Rate:
    it = ReadCommittedIter(c, {SOURCE: 0}, message_type=Reading)
    try:
        return await drain(it, count)
    finally:
        await it.close()


async def raw_read_uncommitted(c: client.JournalClient, count: int) -> Rate:
    source = UncommittedSource(c, SOURCE, 0)
    try:
        return await drain(source, count)
    finally:
        await source.close()


# --- Report -------------------------------------------------------------------------------------


def median_rate(rates: list[Rate], cpu: bool = False) -> float:
    return statistics.median(r.per_cpu_s if cpu else r.per_wall_s for r in rates)


def spread(rates: list[Rate]) -> str:
    walls = [r.per_wall_s for r in rates]
    return f"{min(walls) / 1e3:,.0f}-{max(walls) / 1e3:,.0f}k"


def report_row(name: str, rates: list[Rate], runs: list[Result] | None = None) -> None:
    gc_share = sum(r.gc_s for r in rates) / sum(r.wall_s for r in rates)
    line = (
        f"  {name:<30} {median_rate(rates):>9,.0f} msg/s ({spread(rates):>11})"
        f" {median_rate(rates, cpu=True):>9,.0f} msg/cpu-s  gc {gc_share:3.0%}"
    )
    if runs:
        loop_share = sum(r.loop_cpu_s for r in runs) / sum(r.rate.cpu_s for r in runs)
        txns = statistics.median(r.transactions for r in runs)
        line += f"  txns {txns:,.0f}  loop thread {loop_share:4.0%} of cpu"
    print(line)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=500_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--input", choices=["committed", "txn"], default="committed")
    parser.add_argument("--publish", choices=["per-txn", "per-message", "none"], default="per-txn")
    parser.add_argument("--max-txn-s", type=float, default=1.0)
    parser.add_argument(
        "--min-txn-s",
        type=float,
        default=0.0,
        help="min_txn_duration; = --max-txn-s makes every transaction last that long",
    )
    parser.add_argument(
        "--steady-txns",
        type=int,
        default=0,
        help="measure K whole transactions of exactly --max-txn-s each (min = max), after a "
        "first one, mid-journal: the steady rate at fixed transaction lengths",
    )
    parser.add_argument("--pg-url", default=os.environ.get("GAZETTE_TEST_PG_URL"))
    parser.add_argument("--no-sqlite", action="store_true")
    parser.add_argument("--profile", help="run this mode (e.g. eo-sqlite) once more, profiled")
    parser.add_argument("--profile-sort", default="tottime")
    parser.add_argument(
        "--profile-clock",
        choices=["wall", "cpu"],
        default="wall",
        help="cProfile's timer: wall time, or the loop thread's CPU time (slower to profile)",
    )
    args = parser.parse_args()
    count = args.messages
    if args.steady_txns:
        args.min_txn_s = args.max_txn_s
    # The limit readers need no more than this to settle (the steady mode's journal is long).
    limit_count = min(count, LIMIT_MESSAGES)
    gazette_logging.configure("console", "warning")
    print(f"glibc malloc tuned for large buffers (as `gazette serve`): {tune_malloc()}")

    async with contextlib.AsyncExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        engines: dict[str, Engine] = {}
        if not args.no_sqlite:
            sqlite = create_sqlite_engine(tmp / "bench.sqlite")
            stack.callback(sqlite.dispose)
            engines["sqlite"] = await prepare(sqlite)
        if args.pg_url:
            engines["postgres"] = await stack.enter_async_context(pg_database(args.pg_url))
        if not engines:
            parser.error("no database: drop --no-sqlite or give --pg-url")
        (tmp / "spool").mkdir()
        c = await stack.enter_async_context(in_process_broker(tmp / "spool", consumer_journals()))

        published, head = await publish_input(c, count, args.input == "txn")
        print(
            f"{count:,} messages of ~{head / count:.0f} bytes in {SOURCE} "
            f"(input: {args.input}; published at {published.per_wall_s:,.0f} msg/s)"
        )
        print(
            f"shard: txn duration {args.min_txn_s:g}-{args.max_txn_s:g} s, "
            f"publish {args.publish}, "
            f"databases: {', '.join(engines)}"
        )
        if args.steady_txns:
            print(
                f"steady: rates over {args.steady_txns} whole transactions of "
                f"{args.max_txn_s:g} s per run, after a first one, none reaching the head"
            )
        modes = [(eo, db) for db in engines for eo in (True, False)]
        results: dict[str, list[Result]] = {}
        limits: dict[str, list[Rate]] = {"read-committed": [], "read-uncommitted": []}
        msgspec_rates: list[Rate] = []
        for round_ in range(args.rounds):
            msgspec_rates.append(msgspec_round_trips(make_messages(MESSAGE_POOL), 100_000))
            limits["read-committed"].append(await raw_read_committed(c, limit_count))
            limits["read-uncommitted"].append(await raw_read_uncommitted(c, limit_count))
            # Alternate the order of eo and alo from round to round.
            for eo, db in modes if round_ % 2 == 0 else modes[::-1]:
                name = f"{'eo' if eo else 'alo'}-{db}"
                app = CountApp(eo, engines[db], args.publish)
                result = await run_shard(
                    c,
                    app,
                    f"{name}-{round_}",
                    count,
                    head,
                    args.max_txn_s,
                    args.min_txn_s,
                    steady_txns=args.steady_txns,
                )
                results.setdefault(name, []).append(result)
                print(
                    f"  round {round_ + 1}: {name:<12} {result.rate.per_wall_s:>9,.0f} msg/s",
                    file=sys.stderr,
                )

        profile = None
        if args.profile:
            eo, db = args.profile.split("-", 1)
            # A CPU clock attributes the loop thread's own work, not its waits (epoll).
            cpu = args.profile_clock == "cpu"
            profile = cProfile.Profile(time.thread_time) if cpu else cProfile.Profile()
            app = CountApp(eo == "eo", engines[db], args.publish)
            await run_shard(
                c,
                app,
                f"{args.profile}-profiled",
                count,
                head,
                args.max_txn_s,
                args.min_txn_s,
                profile,
                args.steady_txns,
            )

    print(f"limits (this process, this run; median of {args.rounds}, min-max):")
    report_row("msgspec encode+decode", msgspec_rates)
    report_row("read-committed, no shard", limits["read-committed"])
    report_row("read-uncommitted, no shard", limits["read-uncommitted"])
    print("one shard, trivial count:")
    for name, runs in results.items():
        report_row(name, [r.rate for r in runs], runs)
    print(
        "exactly-once overhead, 1 - eo/alo: of the medians, and the median of each round's "
        "pair (run side by side: steadier under other users' load)"
    )
    for db in engines:
        eo_rates = [r.rate for r in results[f"eo-{db}"]]
        alo_rates = [r.rate for r in results[f"alo-{db}"]]
        wall = 1 - median_rate(eo_rates) / median_rate(alo_rates)
        cpu = 1 - median_rate(eo_rates, cpu=True) / median_rate(alo_rates, cpu=True)
        pairs = list(zip(eo_rates, alo_rates, strict=True))
        paired_wall = statistics.median(1 - e.per_wall_s / a.per_wall_s for e, a in pairs)
        paired_cpu = statistics.median(1 - e.per_cpu_s / a.per_cpu_s for e, a in pairs)
        print(
            f"  {db:<10} wall {wall:6.1%} (paired {paired_wall:6.1%})  cpu {cpu:6.1%} "
            f"(paired {paired_cpu:6.1%})   target <= {OVERHEAD_TARGET:.0%}"
        )
        wall_ci = median_interval([1 - e.per_wall_s / a.per_wall_s for e, a in pairs])
        cpu_ci = median_interval([1 - e.per_cpu_s / a.per_cpu_s for e, a in pairs])
        if wall_ci is not None and cpu_ci is not None:
            print(
                f"  {'':<10} paired median's {CONFIDENCE:.0%} interval: wall {wall_ci[0]:.1%} to "
                f"{wall_ci[1]:.1%}, cpu {cpu_ci[0]:.1%} to {cpu_ci[1]:.1%}"
            )
        # Each round's pair, to pool rounds across runs (CPU us per message: eo - alo).
        per_round = "  ".join(
            f"{1 - e.per_wall_s / a.per_wall_s:+.3f}/{1 - e.per_cpu_s / a.per_cpu_s:+.3f}/"
            f"{1e6 / e.per_cpu_s - 1e6 / a.per_cpu_s:+.3f}"
            for e, a in pairs
        )
        print(f"  {'':<10} rounds (wall/cpu overhead, +us/msg): {per_round}")
        best = max(r.per_wall_s for r in eo_rates)
        print(
            f"  {'':<10} eo {median_rate(eo_rates):,.0f} msg/s (best {best:,.0f}), "
            f"target >= {SHARD_TARGET:,}"
        )
    rc = median_rate(limits["read-committed"], cpu=True)
    ru = median_rate(limits["read-uncommitted"], cpu=True)
    rc_us = 1e6 / rc - 1e6 / ru
    print(
        f"  (read-committed alone, no shard: {1 - rc / ru:.1%} fewer msg/cpu-s than "
        f"read-uncommitted, {rc_us:.2f} us more CPU per message)"
    )
    print("CPU per message (us, medians), and what exactly-once adds:")
    for db in engines:
        eo_us = 1e6 / median_rate([r.rate for r in results[f"eo-{db}"]], cpu=True)
        alo_us = 1e6 / median_rate([r.rate for r in results[f"alo-{db}"]], cpu=True)
        print(
            f"  {db:<10} eo {eo_us:.2f}  alo {alo_us:.2f}  +{eo_us - alo_us:.2f}: read-committed "
            f"{rc_us:.2f} (its limit above), the rest {eo_us - alo_us - rc_us:+.2f} (checkpoints, "
            "commits, ACKs, publishing)"
        )
    if args.steady_txns:
        print("CPU by thread over the steady windows (us per message, medians; /proc ticks):")
        for name, runs in results.items():
            groups = sorted({g for r in runs for g in (r.threads or {})})
            shares = {
                g: statistics.median(
                    1e6 * (r.threads or {}).get(g, 0.0) / r.rate.count for r in runs
                )
                for g in groups
            }
            line = "  ".join(f"{g} {v:.3f}" for g, v in sorted(shares.items()) if v >= 0.0005)
            print(f"  {name:<14} {line}")
    if profile is not None:
        print_profile(profile, args.profile, args.profile_sort)


if __name__ == "__main__":
    asyncio.run(main())
