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

from broker.client.retry_reader import RetryReader
from broker.client.route_cache import JournalClient
from broker.protocol import protocol_pb2 as pb
from gazette_consumer.sequencer.types import SequencerCheckpoint
from spark_integration.options import GazetteOptionError
from spark_integration.range_read import scan_committed

_NEWLINE: Final = b"\n"


async def read_bytes(client: JournalClient, journal: str, begin: int, end: int) -> bytes:
    """The content of [begin, end) of `journal` (what remains of it: a jump over removed
    content leaves it out)."""
    if end <= begin:
        return b""
    reader = RetryReader(
        client, pb.ReadRequest(journal=journal, offset=begin, end_offset=end, block=True)
    )
    out = bytearray()
    try:
        async for chunk in reader:
            out += chunk.content
    finally:
        await reader.close()
    return bytes(out)


async def check_boundary(client: JournalClient, journal: str, offset: int, option: str) -> None:
    """Refuse `offset` of `journal` unless it is 0 or follows a newline (see the module
    docstring); `option` names the option it came from. The caller checked it is not beyond
    the write head."""
    if offset == 0:
        return
    if await read_bytes(client, journal, offset - 1, offset) != _NEWLINE:
        raise GazetteOptionError(
            option,
            f"offset {offset} of {journal} is inside a message, not at a message boundary: give"
            " the offset of a message (its offset column) or a write head",
        )


async def _next_boundary(client: JournalClient, journal: str, offset: int, limit: int) -> int:
    """The first message boundary at or after `offset`, or `limit` if there is none before."""
    head = await read_bytes(client, journal, offset - 1, offset) if offset else _NEWLINE
    if head == _NEWLINE:
        return offset
    reader = RetryReader(
        client, pb.ReadRequest(journal=journal, offset=offset, end_offset=limit, block=True)
    )
    try:
        async for chunk in reader:
            found = chunk.content.find(_NEWLINE)
            if found != -1:
                return chunk.offset + found + 1
    finally:
        await reader.close()
    return limit


async def start_checkpoint(
    client: JournalClient, journal: str, start: int, *, lookback: int, ring_size: int
) -> SequencerCheckpoint:
    """The Sequencer's checkpoint of `journal` at `start`, knowing the producers of the
    `lookback` bytes before it (see the module docstring)."""
    if start == 0 or lookback == 0:
        return SequencerCheckpoint(read_through={journal: start})
    window = await _next_boundary(client, journal, max(0, start - lookback), start)
    return await scan_committed(
        client,
        journal,
        window,
        start,
        ring_size=ring_size,
        checkpoint=SequencerCheckpoint(read_through={journal: window}),
        horizon_clock=0,
        strict=False,
    )
