"""Replay of a committed span the Sequencer's ring no longer holds, read lazily from its journal.

When an ACK commits a span that began before what the ring still holds, the Sequencer asks for
the journal's byte range [begin, end) again (`ReplayRequired`) and consumes the envelopes it is
given through an iterator, pulling them one `step()` at a time. The range may be large (a long
transaction), so it is not read whole: a `Replay` is that iterator, fed one chunk at a time by
`fill()` while the iterator shell awaits, and holding at most one chunk's worth of envelopes.

The Sequencer takes an exhausted iterator to mean "the replay is over". So `step()` may only be
called while the Replay `holds(1)` envelope, and the iterator must only hold envelopes the
Sequencer is certain to deliver: otherwise, having skipped the last one held, it would give up on a replay
whose rest is still unread. `Replay` therefore keeps only the replayed producer's envelopes with
clocks above the last delivered one (`last_ack`, then each kept clock in turn) and up to the ACK's:
exactly those the Sequencer returns, one per `step()`, in journal order.

A chunk read is decoded a piece at a time (`REPLAY_PIECE_BYTES`), as its messages are needed,
for the reason the iterator decodes its chunks so (read_pieces.DECODE_PIECE_BYTES): the messages
decoded and not yet returned are then a few dozen, which die young, where a whole chunk's
(hundreds) would outlive collections of the young generation, be promoted, and soon cost
collections of the whole heap (measured: a shard reading transactions longer than the ring
spent ~20% of its time in the garbage collector).

A range the reader still keeps in memory (`RetainedContent`, retained.py) is replayed from the
chunks kept, synchronously: no read, no await (`fill_nowait` serves the whole replay). Where it
also kept the span's messages decoded (`DecodedRun`s, decoded.py), those are handed over as
they are, a slice of each run found by bisection, and only the bytes between them are decoded,
each stretch by a decoder of its own.

Whatever it serves, a Replay yields only its producer's envelopes, clocks rising within
(`last_ack`, the ACK's clock], offsets rising within the range (`sequenced`): the Sequencer
checks a run of them at its ends (`Sequencer.dequeue_replayed`), not message by message.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Iterator, Sequence
from operator import attrgetter
from typing import Any, Final

from broker.client.retry_reader import RetryReader
from broker.protocol import protocol_pb2 as pb
from gazette_consumer.message.message import Envelope
from gazette_consumer.sequencer.decode import ChunkDecoder
from gazette_consumer.sequencer.decoded import DecodedRun
from gazette_consumer.sequencer.types import ReplayRequired

REPLAY_PIECE_BYTES: Final = 16 << 10
"""A replayed chunk is decoded this much at a time (see the module docstring)."""

RetainedPiece = tuple[bytes, int, int, int]
"""Bytes `content[start:stop]` of a replayed range, read at `offset`: (content, offset, start,
stop), as `RetainedContent.pieces` gives them."""
RetainedSegment = RetainedPiece | ChunkDecoder | DecodedRun
"""What a replay served from memory is given, in journal order: pieces of bytes, each decoded
by the decoder last given (the Replay's own first); a decoder, from which the pieces that follow
are decoded (where the bytes resume after a run); a run of envelopes decoded already."""

_clock = attrgetter("clock")


class Replay(Iterator[Envelope[Any]]):
    """The envelopes of one replayed span, read from `reader` by `fill()` and handed to the
    Sequencer through iteration. Call order: `holds(n)`, else `fill(n)`, before n steps of the
    Sequencer, which iterates; once exhausted the reader is closed.

    `reader` reads the range from the journal; or `retained` holds it all already, as
    `RetainedContent.pieces` gives it, or with runs decoded already (`RetainedSegment`;
    `reader` is then None, and unused)."""

    sequenced: Final = True
    """What it yields is one producer's, clocks and offsets rising, within the range and
    (`last_ack`, ACK's clock] (see the module docstring): `Sequencer.dequeue_replayed` relies
    on it."""

    def __init__(
        self,
        required: ReplayRequired,
        producer: bytes,
        last_ack: int,
        ack_clock: int,
        reader: RetryReader | None,
        decoder: ChunkDecoder,
        retained: Sequence[RetainedSegment] | None = None,
    ) -> None:
        self.required = required
        self._producer = producer
        self._last_kept = last_ack  # Exclusive lower bound of the clocks still to keep.
        self._ack_clock = ack_clock  # Inclusive upper bound: larger clocks are rolled back.
        self._reader = reader
        self._decoder = decoder
        self._kept: deque[Envelope[Any]] = deque()
        # The chunk being decoded, its offset, the index of its next piece in it, and where
        # its part of the range stops.
        self._content = b""
        self._offset = 0
        self._at = 0
        self._stop = 0
        if reader is None and retained is None:
            raise ValueError("replay: a reader or the retained content is required")
        self._retained = None if retained is None else iter(retained)
        self.from_memory = retained is not None
        """Served from the content the reader kept (no read)."""
        self.exhausted = False
        """The whole range was read (and the reader closed)."""

    @property
    def held(self) -> int:
        """How many envelopes are held: the Sequencer's next steps, served without reading."""
        return len(self._kept)

    def holds(self, count: int) -> bool:
        """True if `count` more steps of the Sequencer can be served without reading (`fill`)."""
        return len(self._kept) >= count or self.exhausted

    def __next__(self) -> Envelope[Any]:
        if not self._kept:
            if not self.exhausted:
                raise AssertionError("replay iterated while it needs I/O (step() before fill())")
            raise StopIteration
        return self._kept.popleft()

    def take(self, count: int) -> list[Envelope[Any]]:
        """The next `count` envelopes at once, as `count` iterations would return them (fewer
        only where the replay ended): what `Sequencer.dequeue_replayed` takes a run with."""
        kept = self._kept
        if len(kept) < count and not self.exhausted:
            raise AssertionError("replay iterated while it needs I/O (step() before fill())")
        out = list(kept)
        kept.clear()
        if len(out) > count:
            kept.extend(out[count:])
            del out[count:]
        return out

    def fill_nowait(self, count: int) -> bool:
        """Decode on through the chunk already read, a piece at a time, until `holds(count)`;
        no read. Returns `holds(count)`. What spares a reader a turn of its caller's event
        loop (an await of `fill`) for every piece: only a chunk read needs one."""
        while not self.holds(count):
            content, at = self._content, self._at
            if at >= self._stop:
                retained = self._retained
                if retained is None:
                    return False
                kept = next(retained, None)
                if kept is None:  # The whole range was decoded: as a read's end, in fill().
                    self._retained = None
                    self._keep_decoded(self._decoder.flush())
                    self.exhausted = True
                elif type(kept) is tuple:
                    self._content, self._offset, self._at, self._stop = kept
                else:
                    # The bytes before stop at a frame's end: what the decoder holds is done.
                    self._keep_decoded(self._decoder.flush())
                    if isinstance(kept, DecodedRun):
                        self._keep_run(kept.envelopes)
                    else:
                        assert isinstance(kept, ChunkDecoder)
                        self._decoder = kept
                continue
            piece = content[at : min(at + REPLAY_PIECE_BYTES, self._stop)]
            self._at = at + len(piece)
            self._keep_decoded(self._decoder.feed(piece, self._offset + at))
        return True

    async def fill(self, count: int) -> None:
        """Decode and read on until `holds(count)`. Cancellation-safe: a chunk is kept as
        soon as its read returns, with no await in between."""
        while not self.fill_nowait(count):
            reader = self._reader
            assert reader is not None  # Else fill_nowait serves the whole range.
            chunk = await reader.read_chunk()
            if chunk.content:
                content = chunk.content
                self._content, self._offset, self._at = content, chunk.offset, 0
                self._stop = len(content)
                continue  # Decoded a piece at a time, by fill_nowait.
            self._keep_decoded(self._decoder.flush())
            self.exhausted = True
            await reader.close()

    def _keep_decoded(self, envelopes: list[Envelope[Any]]) -> None:
        self._keep(envelopes)
        if self._decoder.error is not None:
            # A message of the span does not decode as the reader's message type: one that
            # was only counted when first read (its UUID decoded alone: see
            # ChunkDecoder.feed_continuing), or content that changed. Exactly-once cannot go
            # past it: the error reaches the caller, within the transaction's messages.
            raise self._decoder.error

    def _keep(self, envelopes: list[Envelope[Any]]) -> None:
        # Locals in the loop, which runs per replayed message.
        producer, last_kept, ack_clock, append = (
            self._producer,
            self._last_kept,
            self._ack_clock,
            self._kept.append,
        )
        for env in envelopes:
            clock = env.clock
            if last_kept < clock <= ack_clock and (
                env.producer is producer or env.producer == producer
            ):
                append(env)
                last_kept = clock
            # Else another producer's, a duplicate, rolled back or a zero clock: not kept.
        self._last_kept = last_kept

    def _keep_run(self, envelopes: list[Envelope[Any]]) -> None:
        # `_keep` of a run of the producer's envelopes with clocks rising (decoded.py): those
        # kept are a slice, found by bisection rather than by a test per message.
        last_kept, ack_clock = self._last_kept, self._ack_clock
        lo = bisect_right(envelopes, last_kept, key=_clock)
        hi = bisect_right(envelopes, ack_clock, lo=lo, key=_clock)
        if lo < hi:
            self._kept.extend(envelopes[lo:hi])
            self._last_kept = envelopes[hi - 1].clock

    async def close(self) -> None:
        """Stop reading, and let go of what is held: the Sequencer keeps the replay it was
        given (in its emission) until it is itself dropped, which for a closed iterator may
        take the cyclic collector; the messages must not wait for that (up to
        replay_decoded_messages_max of them, kept decoded)."""
        self._kept.clear()
        self._retained = None
        self._content = b""
        if self._reader is not None:
            await self._reader.close()


def replay_request(required: ReplayRequired) -> pb.ReadRequest:
    """The Read of a replayed range: bounded, and blocking so that a broker that is briefly
    unavailable (or a fragment being persisted) is waited for, not reported as the head."""
    return pb.ReadRequest(
        journal=required.journal, offset=required.begin, end_offset=required.end, block=True
    )
