"""Where a `ReadCommittedIter`'s replays read from (its asyncio shell's part): the content it
keeps for them (`RetainedContent`, retained.py), or a bounded read of the broker (replay.py)."""

from __future__ import annotations

from typing import Any

from broker.protocol.validate import ValidationError
from gazette_consumer.message.message import Envelope
from gazette_consumer.sequencer.read_ahead import Chunk, ReadAhead
from gazette_consumer.sequencer.replay import Replay, replay_request
from gazette_consumer.sequencer.retained import REPLAY_RETAINED_BYTES_MAX, RetainedContent
from gazette_consumer.sequencer.sequencer import Sequencer
from gazette_consumer.sequencer.types import JournalProducer


class Replays:
    """The replays of one iterator: each source journal's content kept for them (at most
    `retained_bytes_max` bytes per journal; 0 keeps nothing), and each replay started from it
    or from the broker. Counts both."""

    def __init__(self, read_ahead: ReadAhead, retained_bytes_max: int) -> None:
        if (
            isinstance(retained_bytes_max, bool)
            or not isinstance(retained_bytes_max, int)
            or not 0 <= retained_bytes_max <= REPLAY_RETAINED_BYTES_MAX
        ):
            raise ValidationError(
                f"must be an int in [0, {REPLAY_RETAINED_BYTES_MAX}] (got {retained_bytes_max!r})",
                "replay_retained_bytes_max",
            )
        self._read_ahead = read_ahead
        self.retained_bytes_max = retained_bytes_max
        self._retained: dict[str, RetainedContent] = {}
        self.count = 0
        """Replays started."""
        self.from_memory = 0
        """Of `count`, those served from the content kept."""

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
        if pieces is not None:
            replay = Replay(required, ack.producer, last_ack, ack.clock, None, decoder, pieces)
            self.from_memory += 1
        else:
            reader = read_ahead.new_reader(replay_request(required))
            replay = Replay(required, ack.producer, last_ack, ack.clock, reader, decoder)
        seq.replay(replay)
        self.count += 1
        return replay

    def clear(self) -> None:
        self._retained.clear()
