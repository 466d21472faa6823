"""Journal content a read-committed reader keeps for its replays, within a byte budget (sans-IO).

A transaction longer than the Sequencer's ring is replayed at its ACK: the byte range from where
it began to the ACK is decoded again (replay.py). That range was read moments before, by the
reader's own read-ahead, in chunks the reader held anyway. `RetainedContent` keeps those chunks
of one journal (references to the `bytes` the read-ahead produced: no copy, and nothing the
garbage collector tracks) from the first byte of the journal's earliest pending span onwards, up
to `bytes_max`; a replay of a range it covers is then served from memory, decoded without a read
RPC (and, in-process, without the broker's side of one) and without awaiting anything.

Journal content is immutable once written, so the bytes kept are those a read of the range
would return; a range the chunks kept do not cover (a span longer than the budget, one restored
from a checkpoint, or content skipped by an offset jump) is read from the broker as before.
"""

from __future__ import annotations

from collections import deque
from typing import Final

REPLAY_RETAINED_BYTES_MAX_DEFAULT: Final = 64 << 20
"""Journal content a reader keeps per source journal for its replays (see the module
docstring): a one-second transaction of ~35k messages of ~200 bytes is ~7 MiB."""
REPLAY_RETAINED_BYTES_MAX: Final = 1 << 30
"""Upper bound on what a reader may be configured to keep (`bytes_max`): the content is held in
memory."""
RETAINED_TRIM_EVERY_BYTES: Final = 4 << 20
"""Content kept between two looks for what no pending span needs any more (`trim_due`): the
look asks the Sequencer about every producer of the journal, so it is made once per this many
bytes added (a reader of many producers would otherwise pay it per chunk), not per chunk."""


class RetainedContent:
    """Contiguous chunks of one journal, oldest first, at most `bytes_max` bytes in all (but the
    newest chunk, always kept whole: a chunk is at most a Read's 128 KiB)."""

    __slots__ = ("_added", "_bytes", "_bytes_max", "_chunks", "_end")

    def __init__(self, bytes_max: int) -> None:
        self._bytes_max = bytes_max
        self._chunks: deque[tuple[int, bytes]] = deque()  # (offset, content)
        self._bytes = 0
        self._end = -1  # Offset just past the newest chunk; -1 when none is kept.
        self._added = 0  # Bytes added since the last trim.

    @property
    def retained_bytes(self) -> int:
        return self._bytes

    @property
    def begin(self) -> int | None:
        """The offset of the oldest chunk kept, or None."""
        return self._chunks[0][0] if self._chunks else None

    def add(self, offset: int, content: bytes) -> None:
        """Keep `content`, read at `offset`, after the chunks kept: those before a gap (content
        skipped by the read) are dropped, and the oldest while over the budget."""
        chunks = self._chunks
        if offset != self._end:
            chunks.clear()  # Not contiguous: no range across the gap can be served.
            self._bytes = 0
        chunks.append((offset, content))
        self._bytes += len(content)
        self._added += len(content)
        self._end = offset + len(content)
        while self._bytes > self._bytes_max and len(chunks) > 1:
            self._bytes -= len(chunks.popleft()[1])

    @property
    def trim_due(self) -> bool:
        """True once RETAINED_TRIM_EVERY_BYTES were added since the last `trim`."""
        return self._added >= RETAINED_TRIM_EVERY_BYTES

    def trim(self, keep_from: int) -> None:
        """Drop the chunks that end at or before `keep_from` (no replay will need them)."""
        self._added = 0
        chunks = self._chunks
        while chunks and chunks[0][0] + len(chunks[0][1]) <= keep_from:
            self._bytes -= len(chunks.popleft()[1])

    def pieces(self, begin: int, end: int) -> list[tuple[bytes, int, int, int]] | None:
        """The content of `[begin, end)` as `(content, offset, start, stop)`: bytes
        `content[start:stop]`, read at `offset`, in order; None unless it is all kept."""
        chunks = self._chunks
        if not chunks or chunks[0][0] > begin or self._end < end or begin > end:
            return None
        out: list[tuple[bytes, int, int, int]] = []
        for offset, content in chunks:
            stop_offset = offset + len(content)
            if stop_offset <= begin:
                continue
            if offset >= end:
                break
            start = max(begin - offset, 0)
            stop = min(end, stop_offset) - offset
            out.append((content, offset, start, stop))
        return out
