"""Stream-sum messages and the sequence rule both sides check (sans-IO).

A *stream* is a sequence of `Chunk` messages numbered 1, 2, ..., N+1: N chunks of data, then a
final chunk with no data that ends it. The summer folds each chunk into the stream's running
sum (`fold`); the chunker folds the same chunks as they commit; the final `Sum` the summer
publishes must equal the chunker's. `fold` refuses anything but the next chunk of a stream
still open, raising `SequenceViolation` naming the stream, the expected and the observed chunk:
a gap (a chunk lost), a repeat (a duplicate delivered, or a rolled-back chunk that leaked), or a
chunk after the end. Exactly-once delivery is what makes every fold succeed.

The running sum is a CRC-32 chained over each chunk's sequence number and data, so that a
reordered, missing or repeated chunk changes it.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Final

from gazette_consumer.message import JSONMessage

__all__ = [
    "Chunk",
    "SequenceViolation",
    "StreamState",
    "Sum",
    "fold",
]

# Chunk data is hex text of this many bytes at most (a chunk's frame stays small).
CHUNK_DATA_BYTES_MAX: Final = 256


class Chunk(JSONMessage, kw_only=True):
    """One piece of a stream: `seq` counts from 1; empty `data` ends the stream."""

    stream: str = ""
    seq: int = 0
    data: str = ""  # Hex text; "" marks the final chunk.


class Sum(JSONMessage, kw_only=True):
    """A stream's final sum: through chunk `seq` (the final one), the running sum `value`."""

    stream: str = ""
    seq: int = 0
    value: int = 0


class SequenceViolation(Exception):
    """A chunk out of sequence: exactly-once delivery was broken (or the input is wrong)."""

    def __init__(self, stream: str, expected: int | None, observed: int, kind: str) -> None:
        self.stream = stream
        self.expected = expected  # None: the stream had ended, nothing was expected.
        self.observed = observed
        self.kind = kind
        want = "nothing (it ended)" if expected is None else f"chunk {expected}"
        super().__init__(
            f"SequenceViolation: stream {stream}: expected {want}, observed chunk {observed}"
            f" ({kind})"
        )


@dataclass(frozen=True)
class StreamState:
    """Where a stream stands: the last chunk folded, the running sum, whether it ended."""

    seq: int = 0
    value: int = 0
    done: bool = False

    def encode(self) -> bytes:
        return f"{self.seq} {self.value} {int(self.done)}".encode()

    @classmethod
    def decode(cls, data: bytes) -> StreamState:
        seq, value, done = data.split()
        return cls(int(seq), int(value), done == b"1")


def fold(state: StreamState, chunk: Chunk) -> StreamState:
    """The stream's state after `chunk`, or SequenceViolation if it is not the next one."""
    if state.done:
        raise SequenceViolation(chunk.stream, None, chunk.seq, "after the stream's end")
    expected = state.seq + 1
    if chunk.seq != expected:
        kind = "gap: chunks lost" if chunk.seq > expected else "repeat: delivered twice"
        raise SequenceViolation(chunk.stream, expected, chunk.seq, kind)
    data = bytes.fromhex(chunk.data)
    value = zlib.crc32(data, zlib.crc32(chunk.seq.to_bytes(8, "big"), state.value))
    return StreamState(chunk.seq, value, done=not data)
