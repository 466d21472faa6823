"""How the read-committed iterator takes the chunks read ahead: a piece at a time, as their
messages are needed (sans-IO over the read channel).

A chunk waits in the channel as bytes, and is decoded DECODE_PIECE_BYTES at a time once every
envelope decoded before was consumed, so that decoded messages live from their decoding to
their return, not through the read-ahead too (see DECODE_PIECE_BYTES). A piece that continues
a transaction the Sequencer only counts (its span links nothing in the ring: it is replayed
whole at its ACK) has the messages at its front that do decoded for their UUIDs only
(`Replays.feed_continuing`). Once a chunk's envelopes are consumed, the content skipped after
its last one counts as read for checkpoints (the iterator's `floors`).
"""

from __future__ import annotations

from typing import Any, Final

from gazette_consumer.message.message import Envelope
from gazette_consumer.sequencer.read_ahead import Chunk
from gazette_consumer.sequencer.read_channel import ReadChannel
from gazette_consumer.sequencer.read_tails import ReadTails
from gazette_consumer.sequencer.replays import Replays
from gazette_consumer.sequencer.sequencer import Sequencer
from gazette_consumer.sequencer.types import FLAG_CONTINUE_TXN

DECODE_PIECE_BYTES: Final = 16 << 10
"""A chunk is decoded this much at a time, as its messages are needed: the messages decoded and
not yet returned are then a few dozen, not a chunk's worth. Decoding makes several objects per
message for the garbage collector to track; kept this few, they are freed before a collection
sees them (every 700 net allocations), where a whole chunk's would be promoted into the old
generation and soon cost a scan of the whole heap. Measured: read-committed 50% faster."""


class ChunkPieces:
    """The next piece of the chunks in `channel`, decoded (see the module docstring).

    `floors` (per journal, the offset through which every queued envelope was consumed) is the
    iterator's, moved forward here past a consumed chunk's skipped content. `tails`, if given,
    is handed each chunk taken (read_tails.py)."""

    def __init__(
        self,
        channel: ReadChannel[Chunk],
        replays: Replays,
        seq: Sequencer[Envelope[Any]],
        floors: dict[str, int],
        tails: ReadTails | None = None,
    ) -> None:
        self._channel = channel
        self._tails = tails
        self._replays = replays
        self._seq = seq
        self._floors = floors
        # The journal of the chunk being consumed, and the offset reading resumes from once
        # its envelopes are consumed (past content skipped after its last envelope).
        self._chunk_through: tuple[str, int] | None = None
        # A message of a consumed chunk did not decode: raised once its envelopes are consumed.
        self._decode_error: Exception | None = None
        self._chunk: Chunk | None = None  # Taken from the channel, not wholly decoded yet.
        # Per journal, the producer of the CONTINUE_TXN message that ended its last decoded
        # piece: the next piece may continue its transaction.
        self._continuing: dict[str, bytes] = {}
        self.lead_run: int | None = None
        """Of the piece decoded last: its leading run, as the decoder measured it
        (`ChunkDecoder.lead_run`, for `Sequencer.commit_alone_run`)."""

    def next(self) -> list[Envelope[Any]] | None:
        """Decode the next piece of the next chunk, once every envelope decoded before was
        consumed (the caller's to know); None if no chunk is at hand. Raises the error of a
        message that did not decode, once the envelopes before it were consumed, and on every
        call after."""
        if self._chunk_through is not None:
            # Every envelope of the chunk was consumed: skipped content after the last one
            # may be checkpointed as read too.
            journal, through = self._chunk_through
            floors = self._floors
            if through > floors[journal]:
                floors[journal] = through
            self._chunk_through = None
        if self._decode_error is not None:
            raise self._decode_error  # Every call from now on.
        chunk = self._chunk
        if chunk is None:
            chunk = self._chunk = self._channel.get_nowait()
            if chunk is None:
                return None
            if self._replays.retained_bytes_max:
                self._replays.retain(chunk, self._seq)
            if self._tails is not None:
                self._tails.add(chunk.journal, chunk.offset, chunk.content)
        replays = self._replays
        if replays.gc_hold.held:
            replays.release_gc_hold()
        decoder, at, journal = chunk.decoder, chunk.at, chunk.journal
        piece = chunk.content[at : at + DECODE_PIECE_BYTES]
        chunk.at = at + len(piece)
        if chunk.at == len(chunk.content):
            self._chunk = None
        offset = chunk.offset + at
        producer = self._continuing.get(journal)
        after = None if producer is None else self._seq.unlinked_span_clock(journal, producer)
        if after is None:
            envs = decoder.feed(piece, offset)
        else:
            # The piece likely continues a transaction that is only counted now and replayed
            # whole at its ACK: see `Replays.feed_continuing`.
            assert producer is not None
            envs = replays.feed_continuing(self._seq, decoder, piece, offset, producer, after)
        if envs:
            last = envs[-1]
            if last.flags == FLAG_CONTINUE_TXN and decoder.decodes_uuids:
                self._continuing[journal] = last.producer
            elif producer is not None:
                del self._continuing[journal]
        self._chunk_through = (journal, decoder.through)
        self._decode_error = decoder.error
        self.lead_run = decoder.lead_run
        return envs
