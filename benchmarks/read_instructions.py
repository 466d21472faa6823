"""Instructions a read-committed message costs the reading process, counted by valgrind: the
deterministic measure of the read path (CPU seconds on a shared machine move by +-25% between
runs minutes apart; instruction counts do not).

    .venv/bin/python benchmarks/read_instructions.py [--messages 40000] [--txn]
        [--tool cachegrind|callgrind] [--keep DIR]

A `gazette serve` process (bench_messages.py's broker, not under valgrind) is given
`--messages` ~200-byte JSON messages of bench_messages.py (`--txn`: in transactions of 100 per
ACK), published from this process. Then this script runs itself under
`valgrind --tool=cachegrind` twice, as the reader alone: once reading every message with a
`ReadCommittedIter` (the benchmark's read loop), once reading none (the same start-up, the
iterator built and closed). The difference of the two counts over `--messages` is the
instructions per message: the gRPC receive, decoding, sequencing, the iterator and the loop,
start-up cancelled. `--tool callgrind` also writes the reading run's callgrind profile
(`--keep DIR` keeps the output files) for `callgrind_annotate --inclusive=yes`.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from bench_kit import assign_journals, gazette_serve
from bench_messages import (
    COMMITTED_JOURNAL,
    MESSAGE_POOL,
    TXN_JOURNAL,
    Reading,
    bench_journals,
    make_messages,
    publish_committed,
    publish_transactions,
)
from valgrind_count import instructions

from broker import client
from broker import logging as gazette_logging
from gazette_consumer.sequencer.read_iter import ReadCommittedIter


async def read(endpoint: str, journal: str, count: int) -> None:
    """Read `count` committed messages of `journal` from offset 0 (the benchmark's loop)."""
    c = client.JournalClient(endpoint)
    it = ReadCommittedIter(c, {journal: 0}, message_type=Reading)
    try:
        n, env = 0, None
        while n < count:
            env = await it.next()
            n += 1
            while (more := it.try_next()) is not None:
                env = more
                n += 1
        if count and (env is None or env.message.sequence != (count - 1) % MESSAGE_POOL):
            raise RuntimeError(f"read {n} messages, the last not the expected one")
    finally:
        await it.close()
        await c.channels.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=40_000)
    parser.add_argument("--txn", action="store_true", help="transactions of 100 per ACK")
    parser.add_argument("--tool", choices=["cachegrind", "callgrind"], default="cachegrind")
    parser.add_argument("--keep", help="keep valgrind's output files in this directory")
    parser.add_argument("--read", nargs=3, metavar=("ENDPOINT", "JOURNAL", "COUNT"))
    args = parser.parse_args()
    gazette_logging.configure("console", "warning")
    if args.read:  # The reader, under valgrind.
        endpoint, journal, count = args.read
        await read(endpoint, journal, int(count))
        return
    journal = TXN_JOURNAL if args.txn else COMMITTED_JOURNAL
    with tempfile.TemporaryDirectory() as tmp:
        async with gazette_serve(Path(tmp) / "broker") as serve:
            c = client.JournalClient(serve.endpoint)
            try:
                await assign_journals(c, bench_journals())
                publish = publish_transactions if args.txn else publish_committed
                await publish(c, make_messages(MESSAGE_POOL), args.messages, None)
            finally:
                await c.channels.close()
            out = Path(args.keep or tmp)
            await asyncio.to_thread(out.mkdir, parents=True, exist_ok=True)
            counts = []
            for count in (args.messages, 0):
                counts.append(
                    await asyncio.to_thread(
                        instructions,
                        args.tool,
                        out / f"{args.tool}.out.{count}",
                        __file__,
                        ["--read", serve.endpoint, journal, str(count)],
                    )
                )
    full, none = counts
    print(
        f"{journal}: {full:,} instructions reading {args.messages:,} messages, {none:,} reading "
        f"none: {(full - none) / args.messages:,.0f} per message"
    )


if __name__ == "__main__":
    asyncio.run(main())
