"""One consumer shard counting messages: exactly-once against at-least-once, in one run.

    .venv/bin/python benchmarks/bench_consumer.py [--messages N] [--rounds R] [--pg-url URL]
        [--input committed|txn] [--chain] [--publish per-txn,per-message,none]
        [--max-txn-s S] [--min-txn-s S] [--steady-txns K] [--require-durable] [--json FILE]
        [--profile MODE]

Setup, all in one process (broker, shard, stores' threads share two cores and one GIL): one
R=1 broker on an embedded keyspace, its spools durable files under a data directory (as
`gazette serve --data-dir` keeps them); N ~200-byte JSON messages published to one source
journal first (`--input committed`: each committed by itself; `txn`: transactions of 100 per
ACK). Then, alternating `--rounds` times, one shard of a trivial counting Application reads the
whole journal from offset 0, in each of these modes:

- **exactly-once** (`eo sqlite`, `eo postgres`): the default source (a `ReadCommittedIter`),
  a `SQLStore` (a SQLite file in WAL with synchronous=FULL; PostgreSQL with `--pg-url` or
  $GAZETTE_TEST_PG_URL) committing the counts with the checkpoint, transactions of
  `--min-txn-s` (0) to `--max-txn-s` (1 s; both modes: a transaction closes once the shard
  caught up and its minimum passed), and a transactional publish: one `Summary` message per
  transaction published uncommitted, whose ACK intent is in the checkpoint and is written once
  the commit is durable.
- **at-least-once** (`alo sqlite`, ...): the same Application, but a read-uncommitted source
  (no Sequencer: duplicates and rolled-back messages would be counted), a store without a
  checkpoint (the counts are written to the same database in a transaction of their own,
  committed while the next transaction reads, as exactly-once's commits are), and the summary
  published committed.

Both modes run the same `CountApp` (counting_app.py): a count per key in memory, written to
the database in `finalize_txn`. `--publish` lists what the shard publishes, each list item a
configuration of its own in every round: `per-txn` (one summary per transaction), `per-message`
(one derived message per message, held and published 256 at a time with
`Publisher.publish_*_batch`), `none`. `--chain` adds a configuration whose input is the
output of another exactly-once shard (a chain of two shards): before the rounds, an
exactly-once shard relays SOURCE into a journal of its own, each message published uncommitted
and committed by its transaction's ACKs (transactions of up to `--max-txn-s`, as a shard's);
the measured shard then reads that journal (publishing `--chain-publish`).

The durability the databases really run with is read back from them and printed;
`--require-durable` refuses to run on anything weaker than a user's default (SQLite in WAL with
synchronous=FULL; PostgreSQL with fsync and synchronous_commit on: scripts/pg_cluster.sh's
`durable` mode, not the test cluster, which runs with fsync=off).

Rates are messages per wall second from the shard's first `begin_txn` until its progress (a
completed transaction: committed, ACKs written) reaches the journal's head; also per CPU second
of the process (all threads; "loop thread" is the event loop's share). Beside them, limits of
the same run: read-committed iteration of the journal without a shard (with `--chain`, of the
chain's input too), the read-uncommitted source without a shard, msgspec encode+decode. The
overhead of exactly-once is 1 - eo/alo, of the median rates and, steadier on a shared machine,
the median of each round's pair (each round's pair is printed too, to pool rounds across runs). With `--steady-txns K` every
transaction lasts exactly `--max-txn-s` in both modes and the rates are those of K whole
transactions after a first one, none of which may reach the journal's head.
Progress goes to stderr (a line per run; a live counter on a terminal or with BENCH_PROGRESS=1).
`--profile eo-sqlite` (or any mode; `chain/per-txn:eo-sqlite` names a configuration, else the
first one) runs that mode once more under cProfile and prints it (`--profile-clock cpu` times the loop thread's CPU rather than wall time;
BENCH_PROFILE_DUMP=FILE also writes the whole profile, e.g. to diff two modes' with pstats).
`--json FILE` writes every round's figures for benchmarks/bench_all.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench_json import write_figures
from bench_messages import (
    IN_PROCESS_SPOOLS,
    MESSAGE_POOL,
    GCTimer,
    Rate,
    Reading,
    in_process_broker,
    make_messages,
    msgspec_round_trips,
    print_profile,
)
from consumer_report import Result, figures, print_report
from consumer_setup import (
    Ticker,
    consumer_journals,
    durability,
    durable_enough,
    journal_head,
    pg_database,
    publish_input,
)
from counting_app import CHAIN, SOURCE, CountApp, UncommittedSource, prepare
from google.protobuf.duration_pb2 import Duration
from sqlalchemy.engine import Engine

from broker import client
from broker import logging as gazette_logging
from broker.gc_tuning import freeze_startup_heap
from broker.malloc_tuning import tune_malloc
from broker.protocol import consumer_pb2 as cpb
from gazette_consumer.sequencer.read_iter import ReadCommittedIter
from gazette_consumer.shard_runner import ShardRunner
from gazette_consumer.stores.sql import create_sqlite_engine

RUN_TIMEOUT_S = 600.0
LIMIT_MESSAGES = 300_000
# With --steady-txns, the input must outlast K + 2 transactions of the fastest shard: at most the
# read-uncommitted limit's rate (a shard reads slower), with this margin on top.
STEADY_INPUT_MARGIN = 1.25
PUBLISH_MODES = ("per-txn", "per-message", "none")

# --- Runs ---------------------------------------------------------------------------------------


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
    # Through whole nanoseconds, so that nanos never round up to 1e9 (0.9999999999s).
    out = Duration()
    out.FromNanoseconds(round(seconds * 1e9))
    return out


def spec_of(shard_id: str, source: str, max_txn_s: float, min_txn_s: float) -> cpb.ShardSpec:
    return cpb.ShardSpec(
        id=shard_id,
        sources=[cpb.ShardSpec.Source(journal=source)],
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
    """Run one shard of `app` until it completed a transaction through `head` of its source;
    or, with `steady_txns`, until `steady_txns` whole transactions after the first have been
    consumed, measured between their `begin_txn`s (none of which may reach `head`)."""
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
        elif handle.progress().read_through.get(app.source, 0) >= head:
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
            runner.start(spec_of(shard_id, app.source, max_txn_s, min_txn_s), on_change=changed)
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


async def raw_read_committed(c: client.JournalClient, count: int, journal: str = SOURCE) -> Rate:
    it = ReadCommittedIter(c, {journal: 0}, message_type=Reading)
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


async def relay_chain(
    c: client.JournalClient, engine: Engine, count: int, head: int, max_txn_s: float
) -> dict[str, Any]:
    """The chain's first shard: an exactly-once shard relaying SOURCE into CHAIN (each message
    published uncommitted, committed by its transaction's ACK), with transactions of up to
    `max_txn_s` as a user's shard has them. What it did, and CHAIN's head."""
    app = CountApp(True, engine, "relay", source=SOURCE, output=CHAIN)
    result = await run_shard(c, app, "relay", count, head, max_txn_s, 0.0)
    return {
        "relay_msg_s": result.rate.per_wall_s,
        "transactions": result.transactions,
        "messages_per_transaction": count / result.transactions,
        "head": await journal_head(c, CHAIN),
    }


# --- Main ---------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=500_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--input", choices=["committed", "txn"], default="committed")
    parser.add_argument(
        "--publish",
        default="per-txn",
        help=f"comma-separated, each a configuration of its own: {', '.join(PUBLISH_MODES)}",
    )
    parser.add_argument(
        "--chain",
        action="store_true",
        help="also measure a shard reading an exactly-once shard's output (a chain of two)",
    )
    parser.add_argument("--chain-publish", choices=PUBLISH_MODES, default="per-txn")
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
    parser.add_argument(
        "--require-durable",
        action="store_true",
        help="refuse databases weaker than a user's default (see the module docstring)",
    )
    parser.add_argument("--json", help="also write every round's figures to this file")
    parser.add_argument(
        "--profile",
        help="run this [CONFIG:]MODE (e.g. eo-sqlite, chain/per-txn:eo-sqlite) once more, profiled",
    )
    parser.add_argument("--profile-sort", default="tottime")
    parser.add_argument(
        "--profile-clock",
        choices=["wall", "cpu"],
        default="wall",
        help="cProfile's timer: wall time, or the loop thread's CPU time (slower to profile)",
    )
    args = parser.parse_args()
    args.publish_modes = [p for p in args.publish.split(",") if p]
    if not args.publish_modes or any(p not in PUBLISH_MODES for p in args.publish_modes):
        parser.error(f"--publish: expected a list of {', '.join(PUBLISH_MODES)}")
    if args.steady_txns:
        args.min_txn_s = args.max_txn_s
    return args


async def main() -> None:
    args = parse_args()
    count = args.messages
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
            raise SystemExit("no database: drop --no-sqlite or give --pg-url")
        settings = {db: await asyncio.to_thread(durability, e) for db, e in engines.items()}
        for db, engine in engines.items():
            print(f"{db}: {', '.join(f'{k}={v}' for k, v in settings[db].items())}")
            weaker = durable_enough(engine.dialect.name, settings[db])
            if weaker and args.require_durable:
                raise SystemExit(f"--require-durable: {weaker}")
            if weaker:
                print(f"  WARNING: weaker than a user's default: {weaker}")
        (tmp / "broker").mkdir()
        c = await stack.enter_async_context(in_process_broker(tmp / "broker", consumer_journals()))

        published, head = await publish_input(c, count, args.input == "txn")
        if args.steady_txns:
            # Top the input up if this machine reads so fast that a run would reach the head
            # before its last steady transaction (the run would refuse).
            probe = await raw_read_uncommitted(c, limit_count)
            steady_s = (args.steady_txns + 2) * args.max_txn_s
            needed = int(probe.per_wall_s * steady_s * STEADY_INPUT_MARGIN)
            if needed > count:
                print(
                    f"topping the input up to {needed:,} messages (read at {probe.per_wall_s:,.0f}/s)"
                )
                _, head = await publish_input(c, needed - count, args.input == "txn")
                count = needed
        print(
            f"{count:,} messages of ~{head / count:.0f} bytes in {SOURCE} "
            f"(input: {args.input}; published at {published.per_wall_s:,.0f} msg/s)"
        )
        # Each configuration: (its name, the journal its shards read and that journal's head,
        # what they publish).
        configs = [(f"{args.input}/{p}", SOURCE, head, p) for p in args.publish_modes]
        chain: dict[str, Any] | None = None
        if args.chain:
            chain = await relay_chain(c, next(iter(engines.values())), count, head, args.max_txn_s)
            print(
                f"chain: an exactly-once shard relayed {SOURCE} into {CHAIN} at "
                f"{chain['relay_msg_s']:,.0f} msg/s, in {chain['transactions']} transactions "
                f"(~{chain['messages_per_transaction']:,.0f} messages each)"
            )
            configs.append(
                (f"chain/{args.chain_publish}", CHAIN, chain["head"], args.chain_publish)
            )
        print(
            f"shard: txn duration {args.min_txn_s:g}-{args.max_txn_s:g} s, "
            f"configurations (input/publish): {', '.join(name for name, *_ in configs)}, "
            f"databases: {', '.join(engines)}"
        )
        if args.steady_txns:
            print(
                f"steady: rates over {args.steady_txns} whole transactions of "
                f"{args.max_txn_s:g} s per run, after a first one, none reaching the head"
            )
        # As `gazette-consumer` (runner.py) and `gazette serve` do once started: the start-up
        # heap (broker, stores, gRPC) out of full collections, which would otherwise walk it
        # whenever a shard's short-lived objects reach the old generation.
        print(f"start-up heap frozen: {freeze_startup_heap():,} objects (broker.gc_tuning)")
        modes = [(eo, db) for db in engines for eo in (True, False)]
        results: dict[str, dict[str, list[Result]]] = {name: {} for name, *_ in configs}
        limits: dict[str, list[Rate]] = {
            "msgspec encode+decode": [],
            "read-committed": [],
            "read-uncommitted": [],
        }
        if chain is not None:
            # The chain's input read committed: its transactions outgrow the ring (replays).
            limits["read-committed of the chain's input"] = []
        for round_ in range(args.rounds):
            limits["msgspec encode+decode"].append(
                msgspec_round_trips(make_messages(MESSAGE_POOL), 100_000)
            )
            limits["read-committed"].append(await raw_read_committed(c, limit_count))
            limits["read-uncommitted"].append(await raw_read_uncommitted(c, limit_count))
            if chain is not None:
                limits["read-committed of the chain's input"].append(
                    await raw_read_committed(c, limit_count, CHAIN)
                )
            for config, source, source_head, publish in configs:
                # Alternate the order of eo and alo from round to round.
                for eo, db in modes if round_ % 2 == 0 else modes[::-1]:
                    name = f"{'eo' if eo else 'alo'}-{db}"
                    app = CountApp(eo, engines[db], publish, source=source)
                    result = await run_shard(
                        c,
                        app,
                        f"{name}-{config.replace('/', '-')}-{round_}",
                        count,
                        source_head,
                        args.max_txn_s,
                        args.min_txn_s,
                        steady_txns=args.steady_txns,
                    )
                    results[config].setdefault(name, []).append(result)
                    print(
                        f"  round {round_ + 1}: {config:<20} {name:<12} "
                        f"{result.rate.per_wall_s:>9,.0f} msg/s",
                        file=sys.stderr,
                    )

        profile = None
        if args.profile:
            config_name, _, mode = args.profile.rpartition(":")
            chosen = next((cfg for cfg in configs if cfg[0] == config_name), configs[0])
            eo, db = mode.split("-", 1)
            # A CPU clock attributes the loop thread's own work, not its waits (epoll).
            cpu = args.profile_clock == "cpu"
            profile = cProfile.Profile(time.thread_time) if cpu else cProfile.Profile()
            _, source, source_head, publish = chosen
            app = CountApp(eo == "eo", engines[db], publish, source=source)
            await run_shard(
                c,
                app,
                f"{mode}-{chosen[0].replace('/', '-')}-profiled",
                count,
                source_head,
                args.max_txn_s,
                args.min_txn_s,
                profile,
                args.steady_txns,
            )

    print_report(args, list(engines), limits, results)
    if profile is not None:
        print_profile(profile, args.profile, args.profile_sort)
    if args.json:
        out = figures(list(engines), limits, results)
        out.update(
            messages=count,
            rounds=args.rounds,
            steady_txns=args.steady_txns,
            txn_s=[args.min_txn_s, args.max_txn_s],
            input=args.input,
            published_msg_s=published.per_wall_s,
            message_bytes=head / count,
            chain=chain,
            databases=settings,
            conditions={
                "process": "one process: broker (R=1, embedded keyspace), shard, stores' threads",
                "spools": IN_PROCESS_SPOOLS,
            },
        )
        write_figures(args.json, out)


if __name__ == "__main__":
    asyncio.run(main())
