"""What read-committed reading costs over read-uncommitted, per message, without any IO.

    .venv/bin/python benchmarks/bench_read_paths.py [--messages N] [--rounds R] [--txn K]

The shard benchmark (bench_consumer.py) compares exactly-once with at-least-once end to end;
its rounds differ by a few per cent from machine noise alone, more than read-committed reading
costs. This one isolates the readers: N ~200-byte JSON messages of one producer are framed in
memory and cut into 128 KiB chunks (a Read's), and each source consumes them straight from its
read channel, with no broker and no reader task, alternating round by round:

- read-committed: a `ReadCommittedIter` (Sequencer, checkpoints' floors, runs committed at
  once), as a shard's default source;
- read-uncommitted: `counting_app.UncommittedSource`, the at-least-once source of
  bench_consumer.py, which decodes the same way (pieces of DECODE_PIECE_BYTES, handed out by
  `pop()`), minus what read-committed adds.

Both are called through `try_next()` per message, as a shard calls them. Printed: CPU us per
message of each (medians of the rounds, thread CPU time), and the difference, per message and
per decoded piece. `--txn K` writes the messages as transactions of K (CONTINUE_TXN, then an
ACK) instead of OUTSIDE_TXN messages: the Sequencer's general path.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from collections.abc import Callable, Coroutine
from typing import Any

from bench_messages import MESSAGE_POOL, Reading, journal_spec, make_messages
from counting_app import UncommittedSource

from broker.protocol import protocol_pb2 as pb
from gazette_consumer.message import CONTENT_TYPE_JSON_LINES
from gazette_consumer.message.publisher import Publisher
from gazette_consumer.sequencer.decode import framing_of, new_chunk_decoder
from gazette_consumer.sequencer.read_ahead import Chunk
from gazette_consumer.sequencer.read_iter import READ_CHANNEL_SIZE_MAX, ReadCommittedIter
from gazette_consumer.sequencer.read_pieces import DECODE_PIECE_BYTES
from gazette_consumer.sequencer.types import FLAG_ACK_TXN, FLAG_CONTINUE_TXN, FLAG_OUTSIDE_TXN

JOURNAL = "bench/read-paths"
CHUNK_BYTES = 128 << 10  # A Read response's content, at most.


def framed_journal(spec: pb.JournalSpec, count: int, txn: int) -> bytes:
    """`count` messages of one producer, framed as a publisher appends them."""
    publisher: Publisher[Any] = Publisher(appender=None)  # type: ignore[arg-type]
    framing = framing_of(spec)
    pool = make_messages(MESSAGE_POOL)
    frames = []
    for i in range(count):
        if not txn:
            flags = FLAG_OUTSIDE_TXN
        else:
            flags = FLAG_ACK_TXN if i % (txn + 1) == txn else FLAG_CONTINUE_TXN
        frames.append(publisher._sequence(pool[i % MESSAGE_POOL], framing, flags))
    return b"".join(frames)


async def read_committed(
    spec: pb.JournalSpec, chunks: list[tuple[bytes, int]]
) -> tuple[int, float]:
    it = ReadCommittedIter(
        None,  # type: ignore[arg-type]  # No reader: the chunks are queued below.
        {JOURNAL: 0},
        message_type=Reading,
        read_channel_size=READ_CHANNEL_SIZE_MAX,
    )
    # White-box: queue the chunks where its readers would, and mark them started.
    decoder = new_chunk_decoder(spec, 0, Reading)
    read_ahead = it._read_ahead
    read_ahead.specs[JOURNAL] = spec
    for content, offset in chunks:
        await read_ahead.channel.put(Chunk(JOURNAL, decoder, content, offset))
    read_ahead._supervisor = asyncio.get_running_loop().create_future()  # type: ignore[assignment]
    return drain(lambda: it.try_next())


async def read_uncommitted(
    spec: pb.JournalSpec, chunks: list[tuple[bytes, int]]
) -> tuple[int, float]:
    source = UncommittedSource(None, JOURNAL, 0, read_ahead_chunks=READ_CHANNEL_SIZE_MAX)
    decoder = new_chunk_decoder(spec, 0, Reading)
    for content, offset in chunks:
        await source.put_chunk(decoder, content, offset)
    return drain(lambda: source.try_next())


def drain(try_next: Callable[[], Any]) -> tuple[int, float]:
    """Messages returned until none is at hand, and the CPU seconds that took. `try_next` looks
    the source's up per call, as a shard's loop does: ReadCommittedIter rebinds its own."""
    count = 0
    began = time.thread_time()
    while try_next() is not None:
        count += 1
    return count, time.thread_time() - began


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=400_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--txn", type=int, default=0, help="messages per transaction (0: none)")
    args = parser.parse_args()

    if args.txn:  # Whole transactions only, so that both sources return every message.
        args.messages -= args.messages % (args.txn + 1)
    spec = journal_spec(JOURNAL, CONTENT_TYPE_JSON_LINES)
    content = framed_journal(spec, args.messages, args.txn)
    chunks = [(content[at : at + CHUNK_BYTES], at) for at in range(0, len(content), CHUNK_BYTES)]
    if len(chunks) > READ_CHANNEL_SIZE_MAX:
        parser.error(f"--messages: at most {READ_CHANNEL_SIZE_MAX} chunks of 128 KiB")
    expected = args.messages - (args.messages // (args.txn + 1) if args.txn else 0)
    pieces = len(content) / DECODE_PIECE_BYTES
    print(
        f"{args.messages:,} messages, {len(content) / args.messages:.0f} bytes each, "
        f"{'OUTSIDE_TXN' if not args.txn else f'transactions of {args.txn}'}; "
        f"{pieces / args.messages * 1e3:.1f} pieces of {DECODE_PIECE_BYTES >> 10} KiB per 1k "
        "messages"
    )

    modes: dict[str, Callable[..., Coroutine[Any, Any, tuple[int, float]]]] = {
        "read-committed": read_committed,
        "read-uncommitted": read_uncommitted,
    }
    us: dict[str, list[float]] = {name: [] for name in modes}
    for round_ in range(args.rounds):
        order = list(modes) if round_ % 2 == 0 else list(reversed(modes))
        for name in order:
            gc.collect()
            count, cpu_s = await modes[name](spec, chunks)
            if count != expected:
                raise SystemExit(f"{name}: returned {count:,} messages, expected {expected:,}")
            us[name].append(cpu_s / count * 1e6)

    rc, ru = (statistics.median(us[name]) for name in modes)
    for name in modes:
        values = us[name]
        print(
            f"  {name:<17} {statistics.median(values):.4f} us/msg "
            f"({min(values):.4f}-{max(values):.4f}, {len(values)} rounds)"
        )
    per_piece = (rc - ru) * args.messages / pieces
    print(
        f"read-committed adds {rc - ru:+.4f} us/msg ({rc / ru - 1:+.1%}), "
        f"{per_piece:+.2f} us per decoded piece"
    )


if __name__ == "__main__":
    asyncio.run(main())
