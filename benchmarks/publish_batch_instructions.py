"""Instructions a message published by `Publisher.publish_uncommitted_batch` costs, counted by
valgrind: the deterministic measure of the batch publish path a shard's derived messages take
(bench_consumer.py's `--publish per-message`), without a broker.

    .venv/bin/python benchmarks/publish_batch_instructions.py [--batch 256] [--batches 200]

This script runs itself under `valgrind --tool=cachegrind` four times: building `--batches` and
`--batches` x 3 batches of `--batch` small JSON messages (bench_consumer's `Derived`), each
time publishing them or not, to an in-memory appender (one journal). The instructions per
message are the difference of the publishing runs' counts less that of the building ones,
over the messages in the difference: the UUIDs, the checks and mapping, the framing (msgspec's
encode_lines) and the write; start-up and the messages' construction cancelled.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from counting_app import Derived
from valgrind_count import instructions

from gazette_consumer.message import CONTENT_TYPE_JSON_LINES, Partition, Publisher
from gazette_consumer.message.clock import Clock


class _Appended:
    """An append that counts what it is given."""

    def __init__(self) -> None:
        self.bytes = 0

    def write(self, data: bytes, /) -> None:
        self.bytes += len(data)

    def release(self) -> None:
        pass

    def abort(self) -> None:
        pass


class _Appender:
    """Every journal's append at hand at once (no broker)."""

    def __init__(self) -> None:
        self.appended = _Appended()

    def start_append_nowait(self, journal: str, /) -> _Appended:
        return self.appended

    async def start_append(self, journal: str, *dependencies: Any) -> _Appended:
        return self.appended


async def _run(publish: bool, batches: int, size: int) -> None:
    appender = _Appender()
    publisher = Publisher(appender, Clock.from_unix(1_700_000_000))
    partition = Partition("bench/derived", CONTENT_TYPE_JSON_LINES)

    def mapping(_message: Any) -> Partition:
        return partition

    for _ in range(batches):
        batch = [Derived(sensor="sensor-7", sequence=n) for n in range(size)]
        if publish:
            await publisher.publish_uncommitted_batch(mapping, batch)
    if publish and appender.appended.bytes == 0:
        raise RuntimeError("nothing was published")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--inner", choices=["build", "publish"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        asyncio.run(_run(args.inner == "publish", args.batches, args.batch))
        return
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    counts: dict[tuple[str, int], int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for inner in ("build", "publish"):
            for batches in (args.batches, 3 * args.batches):
                out = Path(tmp) / f"{inner}-{batches}.out"
                script_args = ["--inner", inner, "--batch", str(args.batch)]
                script_args += ["--batches", str(batches)]
                counts[inner, batches] = instructions("cachegrind", out, __file__, script_args, env)
    messages = 2 * args.batches * args.batch
    build = counts["build", 3 * args.batches] - counts["build", args.batches]
    publish = counts["publish", 3 * args.batches] - counts["publish", args.batches]
    print(f"messages built:      {build / messages:9,.0f} instructions a message")
    print(f"built and published: {publish / messages:9,.0f} instructions a message")
    print(f"published (batches of {args.batch}): {(publish - build) / messages:,.0f} a message")


if __name__ == "__main__":
    main()
