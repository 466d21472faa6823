"""Where a read starts: message boundaries, and the transactions open at a start offset.

Offsets given by the user (`begin`, `end`, `startingOffsets`) must be message boundaries: the
offset of a message (the `offset` column) or a write head. In a JSON-lines journal that is 0,
or an offset right after a newline, which `check_boundary` reads the byte before to verify: an
offset inside a message is refused with a `GazetteOptionError` naming it, before anything is
read, rather than failing later on half a message (at `begin`) or losing one (at `end`).

A read-committed read that starts at an offset S other than 0 must not deliver part of a
transaction: one that began before S would otherwise deliver the messages it has at or after
S, when its ACK is read. Such transactions are skipped, whole (a batch read of [S, end) sees
the transactions that begin within it; a streaming query started at S sees those that begin
after S). To know which transactions are open at S, `start_checkpoint` reads the `lookback`
bytes before S (from the first message boundary in them) through a Sequencer and takes its
checkpoint at S: a producer with a pending span there began its transaction before S, and
range_read.py skips that transaction when it commits. A producer seen in those bytes with no
open transaction starts afresh at S, its last ACK known (so its duplicates are dropped too).

The bound: a producer with no message at all in the look-back bytes is taken to start at its
first message at or after S. That is right for a new producer, and for an old one whose last
transaction closed before the look-back; it is wrong only for a transaction that had messages
before the look-back and none within it, i.e. one whose messages lie more than `lookback` bytes
apart (option lookbackBytes, 16 MiB by default): its tail would be delivered.
"""

from __future__ import annotations

from typing import Final

from gazette_consumer.sequencer.types import SequencerCheckpoint
from spark_integration.options import GazetteOptionError
from spark_integration.range_decode import DecoderFactory, json_decoder
from spark_integration.range_read import scan_committed
from spark_integration.sources import JournalSource

_NEWLINE: Final = b"\n"


async def read_bytes(source: JournalSource, begin: int, end: int) -> bytes:
    """The content of [begin, end) of the source's journal (what remains of it)."""
    out = bytearray()
    async for chunk in source.chunks(begin, end):
        out += chunk.content
    return bytes(out)


async def check_boundary(source: JournalSource, offset: int, option: str) -> None:
    """Refuse `offset` unless it is 0 or follows a newline (see the module docstring);
    `option` names the option it came from. The caller checked it is not beyond the head."""
    if offset == 0:
        return
    if await read_bytes(source, offset - 1, offset) != _NEWLINE:
        raise GazetteOptionError(
            option,
            f"offset {offset} of {source.journal} is inside a message, not at a message"
            " boundary: give the offset of a message (its offset column) or a write head",
        )


async def _next_boundary(source: JournalSource, offset: int, limit: int, *, csv: bool) -> int:
    """The first message boundary at or after `offset`, or `limit` if there is none before.
    `limit` is itself a boundary. In a CSV journal a newline may lie inside a quoted field (a
    record spanning lines): `_csv_boundary`."""
    if csv:
        return await _csv_boundary(source, offset, limit)
    head = await read_bytes(source, offset - 1, offset) if offset else _NEWLINE
    if head == _NEWLINE:
        return offset
    async for chunk in source.chunks(offset, limit):
        found = chunk.content.find(_NEWLINE)
        if found != -1:
            return chunk.offset + found + 1
    return limit


async def _csv_boundary(source: JournalSource, offset: int, limit: int) -> int:
    """The first record boundary at or after `offset` in a CSV journal, `limit` being one.
    Read backwards from `limit` (outside any quoted field), each quote opens or closes one (a
    quote within a field is doubled: no change), so a newline is a boundary, outside quotes,
    if and only if an even number of quotes follows it up to `limit` (RFC 4180, as Gazette's
    CSV framing writes records). Two passes over [offset - 1, limit): the quotes counted, then
    the newlines tried, a chunk at a time."""
    if offset == 0:
        return 0
    quotes_after = 0
    async for chunk in source.chunks(offset - 1, limit):
        quotes_after += chunk.content.count(b'"')
    async for chunk in source.chunks(offset - 1, limit):
        content, at = chunk.content, 0
        while (found := content.find(_NEWLINE, at)) != -1:
            quotes_after -= content.count(b'"', at, found)
            if quotes_after % 2 == 0:
                return chunk.offset + found + 1
            at = found + 1
        quotes_after -= content.count(b'"', at)
    return limit


async def start_checkpoint(
    source: JournalSource,
    start: int,
    *,
    lookback: int,
    ring_size: int,
    floor: int = 0,
    new_decoder: DecoderFactory = json_decoder,
    csv: bool = False,
) -> SequencerCheckpoint:
    """The Sequencer's checkpoint of the journal at `start`, knowing the producers of the
    `lookback` bytes before it (not before `floor`; see the module docstring); `csv` for a CSV
    journal, whose records may span lines."""
    journal = source.journal
    if start == 0 or lookback == 0 or start <= floor:
        return SequencerCheckpoint(read_through={journal: start})
    source = source.lenient()
    window = await _next_boundary(source, max(floor, start - lookback), start, csv=csv)
    return await scan_committed(
        source,
        window,
        start,
        ring_size=ring_size,
        checkpoint=SequencerCheckpoint(read_through={journal: window}),
        horizon=0,
        new_decoder=new_decoder,
    )
