"""Instructions an acknowledged publish costs the publishing process, counted by valgrind, and
the CPU it costs the broker: the deterministic measure of the publish path (CPU seconds on a
shared machine move by +-25% between runs minutes apart; instruction counts do not).

    .venv/bin/python benchmarks/publish_instructions.py [--messages 40000]
        [--tool cachegrind|callgrind] [--keep DIR]

A `gazette serve` process (bench_messages.py's broker, not under valgrind) is started; then
this script runs itself under `valgrind --tool=cachegrind` twice, as the publisher alone: once
publishing `--messages` ~200-byte JSON messages with bench_messages.py's `publish_committed`
(`Publisher.publish_committed` per message through an `AppendService`, every batch awaited),
once publishing none (the same start-up, the service and publisher built and closed). The
difference of the two counts over `--messages` is the instructions per message: mapping,
sequencing, framing, the AppendService, the batches' Append RPCs and the caller's loop,
start-up cancelled (bytecode is cached outside the tree by one run outside valgrind first, so
that neither counted run compiles modules). The broker's CPU per message is the difference of its CPU time (all its
threads, in nanoseconds from /proc/<pid>/task/*/schedstat) over the two runs, over
`--messages`: what it spent receiving, checksumming and spooling them (its idle work during
the longer run, a few heartbeats, is counted in: the figure is an upper bound). `--tool
callgrind` also writes the publishing run's callgrind profile (`--keep DIR` keeps the output
files) for `callgrind_annotate --inclusive=yes`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_kit import assign_journals, gazette_serve
from bench_messages import MESSAGE_POOL, bench_journals, make_messages, publish_committed
from valgrind_count import instructions

from broker import client
from broker import logging as gazette_logging


async def publish(endpoint: str, count: int) -> None:
    """Publish `count` of the benchmark's messages, every batch acknowledged (its loop)."""
    c = client.JournalClient(endpoint)
    try:
        await publish_committed(c, make_messages(MESSAGE_POOL), count, None)
    finally:
        await c.channels.close()


def broker_cpu_ns(pid: int) -> int:
    """CPU nanoseconds of every thread of process `pid` so far (schedstat's first field)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except FileNotFoundError:  # A thread that ended since the listing.
            continue
    return total


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=40_000)
    parser.add_argument("--tool", choices=["cachegrind", "callgrind"], default="cachegrind")
    parser.add_argument("--keep", help="keep valgrind's output files in this directory")
    parser.add_argument("--publish", nargs=2, metavar=("ENDPOINT", "COUNT"))
    args = parser.parse_args()
    gazette_logging.configure("console", "warning")
    if args.publish:  # The publisher, under valgrind.
        endpoint, count = args.publish
        await publish(endpoint, int(count))
        return
    with tempfile.TemporaryDirectory() as tmp:
        async with gazette_serve(Path(tmp) / "broker") as serve:
            c = client.JournalClient(serve.endpoint)
            try:
                await assign_journals(c, bench_journals())
            finally:
                await c.channels.close()
            out = Path(args.keep or tmp)
            await asyncio.to_thread(out.mkdir, parents=True, exist_ok=True)
            # Bytecode cached outside the tree (PYTHONDONTWRITEBYTECODE would have both counted
            # runs compile every module, the longer one perhaps more), by one run outside
            # valgrind first.
            env = {
                key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"
            }
            env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
            await asyncio.to_thread(
                subprocess.run,
                [sys.executable, __file__, "--publish", serve.endpoint, str(MESSAGE_POOL)],
                env=env,
                check=True,
            )
            counts, broker_ns = [], []
            for count in (args.messages, 0):
                before = broker_cpu_ns(serve.pid)
                counts.append(
                    await asyncio.to_thread(
                        instructions,
                        args.tool,
                        out / f"{args.tool}.out.{count}",
                        __file__,
                        ["--publish", serve.endpoint, str(count)],
                        env,
                    )
                )
                broker_ns.append(broker_cpu_ns(serve.pid) - before)
    full, none = counts
    print(
        f"publish, acknowledged: {full:,} instructions publishing {args.messages:,} messages, "
        f"{none:,} publishing none: {(full - none) / args.messages:,.0f} per message"
    )
    print(
        f"broker: {broker_ns[0] / 1e6:,.1f} ms of CPU while they were published, "
        f"{broker_ns[1] / 1e6:,.1f} ms while none were: "
        f"{(broker_ns[0] - broker_ns[1]) / args.messages:,.0f} ns per message"
    )


if __name__ == "__main__":
    asyncio.run(main())
