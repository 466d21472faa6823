"""Micro-benchmark: JSON-lines framing throughput for ~200-byte messages.

Prints frames/s for encode+decode through gazette's JSONFraming (msgspec: marshal, unpacker,
decoder), for bare msgspec without framing, and for the stdlib ``json`` module doing the same
work, all measured in the same run so that the figures are comparable on this machine.

    .venv/bin/python benchmarks/bench_framing.py [--messages N] [--chunk-bytes B]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from uuid import UUID

import msgspec

from gazette_consumer.message.framing import Frame
from gazette_consumer.message.json_framing import JSONFraming, JSONMessage

JOURNAL = "bench/journal"


class Reading(JSONMessage):
    sensor: str = ""
    sequence: int = 0
    value: float = 0.0
    unit: str = ""
    note: str = ""


def make_messages(count: int) -> list[Reading]:
    uuid = UUID("83fc2f81-cc5f-11e9-8aaa-010203040506")
    return [
        Reading(
            uuid=uuid,
            sensor=f"sensor-{i % 97:04d}",
            sequence=i,
            value=i * 0.25,
            unit="celsius",
            note="x" * 77,
        )
        for i in range(count)
    ]


def bench_gazette_framing(messages: list[Reading], chunk_bytes: int) -> int:
    framing = JSONFraming()
    buf = bytearray()
    for message in messages:
        framing.marshal_into(message, buf)
    data = bytes(buf)

    unpacker = framing.new_unpacker(JOURNAL, 0)
    decoder = framing.new_decoder(Reading)
    decoded = 0
    for at in range(0, len(data), chunk_bytes):
        for event in unpacker.feed(data[at : at + chunk_bytes], at):
            if isinstance(event, Frame):
                decoder.decode(event)
                decoded += 1
    return decoded


def bench_bare_msgspec(messages: list[Reading], chunk_bytes: int) -> int:
    encoder, decoder = msgspec.json.Encoder(), msgspec.json.Decoder(Reading)
    data = b"".join(encoder.encode(m) + b"\n" for m in messages)
    decoded = 0
    for line in data.splitlines():
        decoder.decode(line)
        decoded += 1
    return decoded


def bench_stdlib_json(dicts: list[dict[str, object]], chunk_bytes: int) -> int:
    data = "".join(json.dumps(d, separators=(",", ":")) + "\n" for d in dicts).encode()
    decoded = 0
    for line in data.splitlines():
        json.loads(line)
        decoded += 1
    return decoded


def measure(name: str, bench: Callable[[], int], expect: int) -> None:
    started = time.perf_counter()
    count = bench()
    elapsed = time.perf_counter() - started
    assert count == expect, (name, count)
    print(f"{name:<34} {count / elapsed:>12,.0f} frames/s  ({elapsed:.2f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--chunk-bytes", type=int, default=64 * 1024)
    args = parser.parse_args()

    messages = make_messages(args.messages)
    size = len(JSONFraming().marshal(messages[0]))
    print(f"{args.messages:,} messages of {size} bytes, read in {args.chunk_bytes:,}-byte chunks")
    # The stdlib starts from plain dicts, built outside the timed region.
    dicts = [msgspec.to_builtins(m) for m in messages]
    chunk, count = args.chunk_bytes, len(messages)
    measure("gazette JSONFraming (msgspec)", lambda: bench_gazette_framing(messages, chunk), count)
    measure("bare msgspec, no framing", lambda: bench_bare_msgspec(messages, chunk), count)
    measure("stdlib json, no framing", lambda: bench_stdlib_json(dicts, chunk), count)


if __name__ == "__main__":
    main()
