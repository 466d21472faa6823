"""``python -m examples.stream_sum``: create the stream-sum journals and shards, and run a chunker.

    python -m examples.stream_sum apply --broker 127.0.0.1:8080 --consumer 127.0.0.1:9000 \\
        --store file:///fragments/ [--single] [--postgres]
    python -m examples.stream_sum chunk --broker 127.0.0.1:8080 --duration 60

The summers run as consumer processes: ``gazette-consumer serve --app
examples.stream_sum:Summer ...`` (README.md). `chunk` publishes for ``--duration`` seconds, then
waits until every stream's sum was verified (at most ``--sum-deadline`` seconds), printing a
line every few seconds; it exits 1 if anything was wrong (each finding is printed: a sum
mismatched, duplicated, late or unexpected, an append that failed), 0 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from collections.abc import Sequence

from broker import logging as gazette_logging
from broker.client.append_service import AppendService
from broker.client.appender import append
from broker.client.list_apply import apply_journals, upsert
from broker.client.route_cache import JournalClient
from broker.protocol import protocol_pb2 as pb
from examples.stream_sum.chunker import Chunker, ChunkerConfig
from examples.stream_sum.layout import Layout, default_layout
from examples.stream_sum.verifier import SumVerifier, read_sums
from gazette_consumer.shard_client import ShardClient
from gazette_consumer.shard_client import upsert as shard_upsert

# Seconds between the chunker's progress lines.
report_interval_s = 5.0


def _layout(args: argparse.Namespace) -> Layout:
    layout = default_layout(file_store=args.store, postgres=args.postgres)
    return layout.capped(1, 0) if args.single else layout


async def _apply(args: argparse.Namespace) -> int:
    layout = _layout(args)
    client = JournalClient(args.broker)
    try:
        await apply_journals(
            client, [upsert(s, expect_mod_revision=-1) for s in layout.journal_specs()]
        )
    finally:
        await client.close()
    async with ShardClient(args.consumer) as shards:
        await shards.apply([shard_upsert(s, expect_mod_revision=-1) for s in layout.shard_specs()])
    print(f"applied {len(layout.journal_specs())} journals and {len(layout.shards)} shards")
    return 0


async def _chunk(args: argparse.Namespace) -> int:
    layout = _layout(args)
    client = JournalClient(args.broker)
    verified = asyncio.Event()
    verifier = SumVerifier(args.sum_deadline, on_verified=lambda *_: verified.set())
    try:
        # An empty append: the sums journal's write head, from which sums are ours.
        barrier = await append(client, pb.AppendRequest(journal=layout.sums_journal), b"")
        errors: list[BaseException] = []
        reader = asyncio.create_task(
            read_sums(client, layout.sums_journal, barrier.commit.end, verifier, errors.append)
        )
        async with AppendService(client) as appends:
            config = ChunkerConfig(journals=layout.chunk_journals, chunks_per_s=args.rate)
            chunker = Chunker(appends, config, verifier, rng=random.Random(args.seed))
            publishing = asyncio.create_task(chunker.run())
            started = time.monotonic()
            while not publishing.done():
                await asyncio.wait({publishing}, timeout=report_interval_s)
                elapsed = time.monotonic() - started
                verifier.check_deadlines()
                print(
                    f"{elapsed:6.1f}s  {chunker.stats.chunks} chunks, {verifier.verified} sums"
                    f" verified, {verifier.outstanding} outstanding,"
                    f" {len(verifier.findings) + len(chunker.findings)} finding(s)",
                    flush=True,
                )
                if elapsed >= args.duration:
                    chunker.stop()
            await publishing
        deadline = time.monotonic() + args.sum_deadline
        while True:
            verified.clear()
            remaining = deadline - time.monotonic()
            if not verifier.outstanding or remaining <= 0:
                break
            try:
                async with asyncio.timeout(remaining):
                    await verified.wait()
            except TimeoutError:
                break
        verifier.check_deadlines()
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
    finally:
        await client.close()
    findings = [*chunker.findings, *verifier.findings]
    s = chunker.stats
    print(
        f"{s.chunks} chunks ({s.duplicates} appended twice), {s.commits} transactions,"
        f" {s.rollbacks} rolled back, {s.abandons} abandoned; {verifier.verified} of"
        f" {s.streams_ended} sums verified"
    )
    for finding in findings:
        print(f"  {finding}")
    if verifier.outstanding:
        print(f"  {verifier.outstanding} sum(s) never arrived")
    return 1 if findings or verifier.outstanding else 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m examples.stream_sum")
    sub = p.add_subparsers(dest="command", required=True)
    for name, text in (("apply", "create the journals and shards"), ("chunk", "run a chunker")):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("--broker", default="127.0.0.1:8080", help="a broker's host:port")
        cmd.add_argument("--store", default="file:///fragments/", help="fragment store URL")
        cmd.add_argument("--single", action="store_true", help="one broker and one consumer")
        cmd.add_argument(
            "--postgres", action="store_true", help="some shards on $STREAM_SUM_PG_URL"
        )
    sub.choices["apply"].add_argument("--consumer", default="127.0.0.1:9000")
    chunk = sub.choices["chunk"]
    chunk.add_argument("--duration", type=float, default=60.0, help="seconds of publishing")
    chunk.add_argument("--rate", type=float, default=40.0, help="chunks per second")
    chunk.add_argument("--sum-deadline", type=float, default=60.0, help="seconds a sum may take")
    chunk.add_argument("--seed", type=int, default=None)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    gazette_logging.configure("console", "error")
    run = _apply if args.command == "apply" else _chunk
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
