"""ReadUncommittedIter: the messages of one journal as written, duplicates and pending ones too.

    reader = RetryReader(client, pb.ReadRequest(journal="a/journal", offset=0, block=True))
    it = ReadUncommittedIter(reader, MyMessage)
    async for env in it:          # Envelope: journal, begin, end, message, uuid, producer, ...
        ...

The journal's framing comes from its spec's `content-type` label (the spec is fetched on first
read), unless a `framing` is given. `message_type` is the message class, or a function of the
journal's spec returning it (Gazette's NewMessageFunc).

Content is decoded a whole chunk at a time (see `decode.py`), and envelopes are handed out from a
local deque: only the reads of chunks await. Unreadable content is skipped and logged; a message
that does not decode raises `MessageDecodeError` naming journal and offsets, after every message
before it was handed out. The read ends (`StopAsyncIteration`) only once a bounded read
(`end_offset`) is read through.

Cancellation: `next()` and `next_batch()` may be cancelled at any await without losing a
message; an envelope leaves the iterator only when returned.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from broker.client.list_apply import get_journal
from broker.client.retry_reader import RetryReader
from broker.protocol import protocol_pb2 as pb
from gazette_consumer.message.framing import MESSAGE_BYTES_MAX_DEFAULT, Framing
from gazette_consumer.message.message import Envelope
from gazette_consumer.sequencer.decode import ChunkDecoder, MessageTypeSource, new_chunk_decoder


class ReadUncommittedIter:
    """Read-uncommitted Envelopes of the RetryReader's journal. See the module docstring.

    Not safe for concurrent use by several tasks; one task reads it at a time.
    """

    def __init__(
        self,
        reader: RetryReader,
        message_type: MessageTypeSource,
        *,
        framing: Framing | None = None,
        spec: pb.JournalSpec | None = None,
        message_bytes_max: int = MESSAGE_BYTES_MAX_DEFAULT,
    ) -> None:
        self.reader = reader
        self.spec = spec
        """The journal's spec: given, or fetched on first read."""
        self._message_type = message_type
        self._framing = framing
        self._message_bytes_max = message_bytes_max
        self._decoder: ChunkDecoder | None = None
        self._ready: deque[Envelope[Any]] = deque()
        self._offset = reader.offset
        self._ended = False

    @property
    def journal(self) -> str:
        return self.reader.journal

    @property
    def offset(self) -> int:
        """Where a new read would resume: after the last envelope returned, or after content
        skipped since (-1 until a read of the write head resolves)."""
        return self._offset

    @property
    def skipped_bytes(self) -> int:
        """Bytes skipped as unreadable (each skipped range was logged as an error)."""
        return 0 if self._decoder is None else self._decoder.skipped_bytes

    async def next(self) -> Envelope[Any]:
        """The next envelope; `StopAsyncIteration` once a bounded read is read through."""
        while not self._ready:
            if not await self._read_more():
                raise StopAsyncIteration
        env = self._ready.popleft()
        self._offset = env.end
        if not self._ready:
            self._settle()
        return env

    async def next_batch(self) -> list[Envelope[Any]]:
        """Every envelope decoded so far and not yet returned, reading one chunk or more if none
        is; an empty list only once a bounded read is read through."""
        while not self._ready:
            if not await self._read_more():
                return []
        batch = list(self._ready)
        self._ready.clear()
        self._settle()
        return batch

    def __aiter__(self) -> ReadUncommittedIter:
        return self

    async def __anext__(self) -> Envelope[Any]:
        return await self.next()

    async def close(self) -> None:
        await self.reader.close()

    def _settle(self) -> None:
        """All decoded envelopes were returned: what was skipped since counts as read, and an
        undecodable message waiting behind them is raised on the next call."""
        if self._decoder is not None:
            self._offset = max(self._offset, self._decoder.through)

    async def _read_more(self) -> bool:
        """Read and decode chunks until an envelope is ready. False at the end of the read."""
        decoder = self._decoder
        if decoder is not None and decoder.error is not None:
            raise decoder.error
        if self._ended:
            return False
        if self.spec is None:
            # Before the first read, so that a cancelled lookup loses no content.
            self.spec = await get_journal(self.reader.client, self.journal)
        if decoder is None and self.reader.offset >= 0:
            decoder = self._new_decoder(self.spec, self.reader.offset)
        chunk = await self.reader.read_chunk()
        if decoder is None:
            # A read of the write head (-1) learns its offset with its first chunk.
            decoder = self._new_decoder(self.spec, chunk.offset)
        if chunk.content:
            self._ready.extend(decoder.feed(chunk.content, chunk.offset))
        else:
            self._ended = True  # The bounded read is complete: whatever is left is incomplete.
            self._ready.extend(decoder.flush())
        if not self._ready:
            self._settle()
            if decoder.error is not None:
                raise decoder.error
        return bool(self._ready) or not self._ended

    def _new_decoder(self, spec: pb.JournalSpec, offset: int) -> ChunkDecoder:
        self._decoder = new_chunk_decoder(
            spec,
            offset,
            self._message_type,
            framing=self._framing,
            message_bytes_max=self._message_bytes_max,
        )
        if self._offset < 0:
            self._offset = offset
        return self._decoder
