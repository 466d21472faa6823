"""Decoded messages a read-committed reader keeps for its replays, within a message budget
(sans-IO).

A transaction longer than the Sequencer's ring is replayed whole at its ACK (replay.py). Where
the reader still holds the range's bytes (retained.py), the replay decodes them again: each of
the transaction's messages is then decoded twice (its UUID on the first read, whole at the
replay), framed twice, and filtered message by message, where an at-least-once reader decodes it
once. `DecodedSpans` keeps instead the envelopes of the messages that continue such a span, as
the first read decoded them whole (`ChunkDecoder.feed_continuing(whole=True)`), at most
`messages_max` in all; the replay hands them over as they are (no decode, no framing pass, no
read), and decodes from the bytes only what lies between them (the span's first piece, other
producers' messages, the ACK's piece).

Each run kept is one producer's CONTINUE_TXN envelopes, contiguous in the journal, clocks
rising (what the first read counted as the span's continuation), so a replay keeps a slice of it
found by bisection rather than testing each message (`Replay`). Runs that touch are merged: a
transaction continued piece after piece is one run.

What this costs: the envelopes (with their messages and UUIDs: two objects the garbage
collector tracks per message) live from the first read to the ACK, a transaction's length, where
otherwise they die young. Round nine of docs/benchmarks.md measured it: young collections found
them alive and every older generation's collection scanned them again (11-15 % of a shard's
CPU). So while a reader keeps messages, it holds the collector's young collections off
(`broker.gc_tuning.YoungCollectionHold`, by TRACKED_OBJECTS_PER_KEPT_MESSAGE per message of its
budget): they then die at the replay, by reference counts, unscanned (round ten).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from gazette_consumer.message.message import Envelope

REPLAY_DECODED_MESSAGES_MAX_DEFAULT: Final = 1 << 16
"""Decoded messages a reader keeps for its replays, across its source journals (see the module
docstring): a one-second transaction of the benchmark's ~200-byte messages is ~40k, and each
such message kept is ~600 bytes in memory (envelope, message, UUID): ~40 MB at most."""
REPLAY_DECODED_MESSAGES_MAX: Final = 1 << 22
"""Upper bound on what a reader may be configured to keep (`messages_max`)."""
TRACKED_OBJECTS_PER_KEPT_MESSAGE: Final = 2
"""Objects the garbage collector tracks per message kept: the message (a msgspec Struct holding
a `uuid.UUID` is tracked) and its UUID; the `Envelope` is not (gc=False). What a reader defers
young collections by while it keeps messages (`broker.gc_tuning.YoungCollectionHold`)."""


class DecodedRun:
    """Envelopes of one producer's span, contiguous in one journal from `begin` to `end`,
    CONTINUE_TXN, clocks rising."""

    __slots__ = ("begin", "end", "envelopes")

    def __init__(self, envelopes: list[Envelope[Any]]) -> None:
        self.envelopes = envelopes
        self.begin = envelopes[0].begin
        self.end = envelopes[-1].end


class DecodedSpans:
    """The runs kept per (journal, producer), oldest first, `messages` in all, at most
    `messages_max`."""

    __slots__ = ("_runs", "messages", "messages_max")

    def __init__(self, messages_max: int) -> None:
        self.messages_max = messages_max
        self.messages = 0
        self._runs: dict[tuple[str, bytes], list[DecodedRun]] = {}

    @property
    def room(self) -> int:
        """Messages that may still be kept."""
        return self.messages_max - self.messages

    def add(
        self, journal: str, producer: bytes, span_begin: int, envelopes: list[Envelope[Any]]
    ) -> None:
        """Keep `envelopes` (one producer's continuation of its span that began at
        `span_begin`: see the class docstring), or as many of the first of them as the budget
        allows. Runs kept of an older span of the producer (rolled back, or replayed from the
        broker) are dropped first."""
        self.drop_stale(journal, producer, span_begin)
        runs = self._runs.get((journal, producer))
        room = self.messages_max - self.messages
        if room < len(envelopes):
            if room <= 0:
                return
            envelopes = envelopes[:room]
        self.messages += len(envelopes)
        if runs is None:
            self._runs[(journal, producer)] = [DecodedRun(envelopes)]
            return
        last = runs[-1]
        if last.end == envelopes[0].begin:  # Touching: nothing of the journal in between.
            last.envelopes += envelopes
            last.end = envelopes[-1].end
        else:
            runs.append(DecodedRun(envelopes))

    def drop_stale(self, journal: str, producer: bytes, span_begin: int) -> None:
        """Drop the runs of `producer` in `journal` kept for a span older than the one that
        began at `span_begin` (-1: none is pending)."""
        runs = self._runs.get((journal, producer))
        if runs is not None and (span_begin == -1 or runs[0].begin < span_begin):
            self._drop((journal, producer))

    def take(self, journal: str, producer: bytes, begin: int, end: int) -> list[DecodedRun]:
        """The runs kept of `producer` in `journal` within `[begin, end)`, in order; none of the
        producer's is kept any more."""
        runs = self._drop((journal, producer))
        return [run for run in runs if begin <= run.begin and run.end <= end]

    def trim(self, journal: str, span_begin: Callable[[bytes], int]) -> None:
        """Drop the runs of `journal` whose producer's pending span (`span_begin`: its begin,
        -1 if none) is not the one they were kept for."""
        for key in [k for k in self._runs if k[0] == journal]:
            self.drop_stale(journal, key[1], span_begin(key[1]))

    def clear(self) -> None:
        self._runs.clear()
        self.messages = 0

    def _drop(self, key: tuple[str, bytes]) -> list[DecodedRun]:
        runs = self._runs.pop(key, None)
        if runs is None:
            return []
        self.messages -= sum(len(run.envelopes) for run in runs)
        return runs
