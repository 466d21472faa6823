"""Decoding a range of a journal: its content, chunk by chunk from a `JournalSource` (sources.py),
into `MessageBatch`es a piece at a time, by the decoder of its framing (json_lines.py for JSON
lines, framings.py for CSV and protobuf), or by a content-less one for scans (offsets and UUIDs
only: look-backs, look-aheads, streaming planning).

Read-uncommitted, every message framed in the range is returned, ACKs, duplicates and
transactions that never commit included. Content that does not frame fails the read with
`GazetteJournalError` naming its offsets (range_read.py has the read-committed walk).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Protocol

from spark_integration.json_lines import JSONLinesDecoder, scan_decoder
from spark_integration.message_batch import MessageBatch
from spark_integration.sources import JournalSource


class BatchDecoder(Protocol):
    """Content chunks in, MessageBatches out (json_lines.py, framings.py)."""

    def feed(self, content: bytes, offset: int) -> list[MessageBatch]: ...

    def flush(self) -> list[MessageBatch]: ...


DecoderFactory = Callable[[str, int], BatchDecoder]


def json_decoder(journal: str, offset: int) -> BatchDecoder:
    return JSONLinesDecoder(journal, offset)


def scan_decoder_of(new_decoder: DecoderFactory) -> DecoderFactory:
    """The decoder of scans (offsets and UUIDs only) of what `new_decoder` decodes: content-less
    for JSON lines; the same for other framings."""
    if new_decoder is json_decoder or new_decoder is JSONLinesDecoder:
        return scan_decoder
    return new_decoder


async def decoded(
    source: JournalSource, begin: int, end: int, new_decoder: DecoderFactory
) -> AsyncGenerator[MessageBatch, None]:
    """The messages of [begin, end), in journal order, a decoded piece at a time."""
    if end <= begin:
        return
    decoder = new_decoder(source.journal, begin)
    async for chunk in source.chunks(begin, end):
        for batch in decoder.feed(chunk.content, chunk.offset):
            yield batch
    for batch in decoder.flush():
        yield batch


async def read_uncommitted(
    source: JournalSource, begin: int, end: int, new_decoder: DecoderFactory = json_decoder
) -> AsyncIterator[MessageBatch]:
    async for batch in decoded(source, begin, end, new_decoder):
        yield batch


async def no_batches() -> AsyncIterator[MessageBatch]:
    """An empty stream of batches."""
    return
    yield
