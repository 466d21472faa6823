"""Where a `ReadCommittedIter`'s replays read from (its asyncio shell's part): the content it
keeps for them (`RetainedContent`, retained.py) with the messages it kept decoded
(`DecodedSpans`, decoded.py), or a bounded read of the broker (replay.py)."""

from __future__ import annotations

from typing import Any

from broker.gc_tuning import YoungCollectionHold
from broker.protocol.validate import ValidationError
from gazette_consumer.message.message import Envelope
from gazette_consumer.sequencer.decode import ChunkDecoder
from gazette_consumer.sequencer.decoded import (
    REPLAY_DECODED_MESSAGES_MAX,
    TRACKED_OBJECTS_PER_KEPT_MESSAGE,
    DecodedRun,
    DecodedSpans,
)
from gazette_consumer.sequencer.read_ahead import Chunk, ReadAhead
from gazette_consumer.sequencer.replay import Replay, RetainedSegment, replay_request
from gazette_consumer.sequencer.retained import REPLAY_RETAINED_BYTES_MAX, RetainedContent
from gazette_consumer.sequencer.ring import invariant
from gazette_consumer.sequencer.sequencer import Sequencer
from gazette_consumer.sequencer.types import JournalProducer, ReplayRequired


class Replays:
    """The replays of one iterator: each source journal's content kept for them (at most
    `retained_bytes_max` bytes per journal; 0 keeps nothing), and each replay started from it
    or from the broker. Counts both."""

    def __init__(
        self, read_ahead: ReadAhead, retained_bytes_max: int, decoded_messages_max: int
    ) -> None:
        for name, value, most in (
            ("replay_retained_bytes_max", retained_bytes_max, REPLAY_RETAINED_BYTES_MAX),
            ("replay_decoded_messages_max", decoded_messages_max, REPLAY_DECODED_MESSAGES_MAX),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
                raise ValidationError(f"must be an int in [0, {most}] (got {value!r})", name)
        self._read_ahead = read_ahead
        self.retained_bytes_max = retained_bytes_max
        self._retained: dict[str, RetainedContent] = {}
        # Decoded messages are only of use with the bytes around them kept.
        self.decoded = DecodedSpans(decoded_messages_max if retained_bytes_max else 0)
        """Spans' messages kept decoded (`feed_continuing`)."""
        self.gc_hold = YoungCollectionHold(
            self.decoded.messages_max * TRACKED_OBJECTS_PER_KEPT_MESSAGE
        )
        """Held from the first message kept decoded until none is and their replay was
        delivered (see decoded.py): the collector's young collections wait meanwhile."""
        self.count = 0
        """Replays started."""
        self.from_memory = 0
        """Of `count`, those served from the content kept."""
        self.from_decoded = 0
        """Of `from_memory`, those served in part from the messages kept decoded."""

    def retain(self, chunk: Chunk, seq: Sequencer[Envelope[Any]]) -> None:
        """Keep `chunk` (just taken to decode), and of its journal's chunks kept before it only
        those a pending span began in, looked for every RETAINED_TRIM_EVERY_BYTES (see
        retained.py). A span that began before the chunks
        kept (one restored from a checkpoint, or longer than the budget) keeps nothing: its
        replay is read from the broker."""
        journal = chunk.journal
        retained = self._retained.get(journal)
        if retained is None:
            retained = self._retained[journal] = RetainedContent(self.retained_bytes_max)
        retained.add(chunk.offset, chunk.content)
        if retained.trim_due:  # Not per chunk: the look is per producer of the journal.
            begin = seq.pending_begin(journal, retained.begin or 0)
            retained.trim(chunk.offset if begin is None else min(begin, chunk.offset))
            if self.decoded.messages:
                self.decoded.trim(journal, lambda producer: seq.span_begin(journal, producer))

    def release_gc_hold(self) -> None:
        """Release the hold on young collections if no message is kept decoded: called before
        each piece is decoded, which happens only once the replay of what was kept was
        delivered (the reader decodes no piece while a replay serves it) and the reader let
        go of its messages (see read_pieces.py): they are gone by then."""
        if self.gc_hold.held and not self.decoded.messages:
            self.gc_hold.release()

    def feed_continuing(
        self,
        seq: Sequencer[Envelope[Any]],
        decoder: ChunkDecoder,
        piece: bytes,
        offset: int,
        producer: bytes,
        after: int,
    ) -> list[Envelope[Any]]:
        """Decode `piece` of `decoder`'s journal (at `offset`), which likely continues
        `producer`'s span, unlinked past clock `after` (`Sequencer.unlinked_span_clock`): the
        messages at its front that continue it are counted (`Sequencer.skip_continuation`),
        decoded for their UUIDs only, or where they may be kept (`_keeps_decoded`), decoded
        whole and kept for the span's replay. Returns the envelopes of the rest."""
        journal = decoder.journal
        n, begin, clock, end, envs, continuing = decoder.feed_continuing(
            piece, offset, producer, after, whole=self._keeps_decoded(seq, journal, producer)
        )
        if n:
            skipped = seq.skip_continuation(journal, producer, n, begin, clock, end)
            # unlinked_span_clock said the span takes them; else they would be lost.
            invariant(skipped, "a span's continuation was declined")
            if continuing is not None:
                self.decoded.add(journal, producer, seq.span_begin(journal, producer), continuing)
                self.gc_hold.acquire()
        return envs

    def _keeps_decoded(self, seq: Sequencer[Envelope[Any]], journal: str, producer: bytes) -> bool:
        """Whether to decode whole and keep (`DecodedSpans.add`) what continues `producer`'s
        span: if the content kept covers the span from its begin (else its replay reads the
        broker, and would not use them), and there is room (once the runs the producer left
        of a span no longer pending, rolled back, were dropped)."""
        retained = self._retained.get(journal)
        kept_from = None if retained is None else retained.begin
        span_begin = seq.span_begin(journal, producer)
        if kept_from is None or not 0 <= kept_from <= span_begin:
            return False
        decoded = self.decoded
        if decoded.room <= 0 and decoded.messages:
            decoded.drop_stale(journal, producer, span_begin)
        return decoded.room > 0

    def start(self, seq: Sequencer[Envelope[Any]], ack: Envelope[Any]) -> Replay:
        """Start the replay `seq` asks for, to commit the span `ack` ends, and hand it to
        `seq`."""
        required = seq.replay_required
        assert required is not None  # Asked for by the caller.
        read_ahead = self._read_ahead
        # The replayed producer's last delivered clock: the Replay keeps only later ones.
        producers = seq.checkpoint().producers
        last_ack = producers[JournalProducer(ack.journal, ack.producer)].last_ack
        decoder = read_ahead.new_decoder(read_ahead.specs[required.journal], required.begin)
        retained = self._retained.get(required.journal)
        pieces = None if retained is None else retained.pieces(required.begin, required.end)
        runs = self.decoded.take(required.journal, ack.producer, required.begin, required.end)
        if pieces is not None:
            segments: list[RetainedSegment] = list(pieces)
            if runs:
                assert retained is not None  # Else pieces is None.
                segments = self._segments(retained, required, runs)
                self.from_decoded += 1
            replay = Replay(required, ack.producer, last_ack, ack.clock, None, decoder, segments)
            self.from_memory += 1
        else:
            reader = read_ahead.new_reader(replay_request(required))
            replay = Replay(required, ack.producer, last_ack, ack.clock, reader, decoder)
        seq.replay(replay)
        self.count += 1
        return replay

    def _segments(
        self, retained: RetainedContent, required: ReplayRequired, runs: list[DecodedRun]
    ) -> list[RetainedSegment]:
        """What a replay of `required` is served from (`RetainedSegment`): the bytes before
        each run (decoded by the replay's decoder, then each stretch by one begun at its
        start), each run, and the bytes after the last."""
        read_ahead = self._read_ahead
        spec = read_ahead.specs[required.journal]
        out: list[RetainedSegment] = []
        at = required.begin
        for begin, run in [*((run.begin, run) for run in runs), (required.end, None)]:
            if at < begin:
                if out:  # A stretch of bytes after a run: a decoder from its start.
                    out.append(read_ahead.new_decoder(spec, at))
                pieces = retained.pieces(at, begin)
                assert pieces is not None  # Within the range the caller found kept.
                out.extend(pieces)
            if run is not None:
                out.append(run)
                at = run.end
        return out

    def clear(self) -> None:
        self._retained.clear()
        self.decoded.clear()
        self.gc_hold.release()
