"""ACK_TXN messages older than their producer's last ACK: counted, and logged (rate-limited).

Such an ACK rolls back its producer's pending span and keeps the bound (classify.py says why
we keep it where Gazette lowers it): the transaction it closes is dropped, as is everything
the producer writes until its clock passes its last ACK. That is right for its commonest
cause, a re-appended copy of transactions already delivered (an append whose answer was
lost, appended again), and loses data for the other, a producer that kept its ProducerID
while its clock went back. The Sequencer cannot tell the two apart when it drops the ACK:
it keeps a producer's last ACK only (as Gazette's does), and a copy's older ACK, like the
messages before it, looks exactly like a regressed producer's. So both are counted, under a
name that says what is seen, not what caused it; a count that keeps rising for one journal
while no broker failed over (no appends were retried) points at a producer whose clock went
back, and the log line names it.

- ``gazette_sequencer_older_acks_total{journal}``: such ACKs, each a transaction dropped
  (a copy's, or a regressed producer's). The regressed producer's messages dropped with it
  are not counted: below the bound they are what any duplicate is.

Logged as a warning (a copy is benign, and common after a broker failed over: an error per
failover would cry wolf), naming the journal, the producer and both clocks, at most once per
(journal, producer) every `OLDER_ACK_LOG_INTERVAL_S` per Sequencer, with the number of
lines held back meanwhile. Every Sequencer reading the journal counts the ACK (a Spark query's
planner and its partition readers each do). Imported on the first such ACK (classify.py), so that the
Sequencer's import pulls in no Prometheus client.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

import structlog
from prometheus_client import Counter

from gazette_consumer.message.clock import CLOCK_SEQUENCE_BITS, clock_span

__all__ = [
    "LOGGED_PRODUCERS_MAX",
    "OLDER_ACKS",
    "OLDER_ACK_LOG_INTERVAL_S",
    "OncePer",
    "note_older_ack",
]

OLDER_ACK_LOG_INTERVAL_S: Final = 60.0
"""At most one log line per (journal, producer) and Sequencer in this many seconds."""

LOGGED_PRODUCERS_MAX: Final = 1024
"""Producers a Sequencer remembers having logged (bounds its memory): past it, lines for
producers not remembered are held back until the interval frees room."""

OLDER_ACKS: Final = Counter(
    "gazette_sequencer_older_acks_total",
    "ACK_TXN messages older than their producer's last ACK, each a transaction dropped: a"
    " re-appended copy of transactions already delivered, or a producer that kept its"
    " ProducerID while its clock went back (not told apart), by journal.",
    ["journal"],
)

_log = structlog.get_logger(__name__)


class OncePer:
    """Allows one event per key every `interval_s` (of `clock`), remembering `keys_max` keys
    at most, and counts those it holds back."""

    def __init__(
        self,
        interval_s: float = OLDER_ACK_LOG_INTERVAL_S,
        keys_max: int = LOGGED_PRODUCERS_MAX,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval_s = interval_s
        self.keys_max = keys_max
        self._clock = clock
        self._last: dict[object, tuple[float, int]] = {}  # key -> (allowed at, held back since)

    def allow(self, key: object) -> int | None:
        """None if an event of `key` is held back; else how many were since the last one
        allowed."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last[0] < self.interval_s:
            self._last[key] = (last[0], last[1] + 1)
            return None
        if last is None and len(self._last) >= self.keys_max:
            cutoff = now - self.interval_s
            self._last = {k: v for k, v in self._last.items() if v[0] > cutoff}
            if len(self._last) >= self.keys_max:
                return None  # Counted by the caller's metric; logged once room is freed.
        self._last[key] = (now, 0)
        return 0 if last is None else last[1]


def note_older_ack(
    limit: OncePer, journal: str, producer: bytes, clock: int, last_ack: int
) -> None:
    """Count an ACK_TXN of `producer` at `clock`, older than its last ACK `last_ack`, and log
    it unless `limit` holds the line back."""
    OLDER_ACKS.labels(journal).inc()
    held_back = limit.allow((journal, producer))
    if held_back is None:
        return
    _log.warning(
        "ACK_TXN older than its producer's last ACK: its transaction is dropped, and so is"
        " what the producer writes until its clock passes that ACK (a re-appended copy of"
        " transactions already delivered, or a producer that kept its ProducerID while its"
        " clock went back: the two look alike here)",
        journal=journal,
        producer=producer.hex(),
        clock=clock,
        last_ack=last_ack,
        behind_s=_seconds_between(clock, last_ack),
        held_back=held_back,
        log_interval_s=limit.interval_s,
    )


def _seconds_between(older: int, newer: int) -> float:
    """How far clock `older` is behind clock `newer`, in seconds (of the producer's clock)."""
    return ((newer >> CLOCK_SEQUENCE_BITS) - (older >> CLOCK_SEQUENCE_BITS)) / _UNITS_PER_S


_UNITS_PER_S: Final = clock_span(1) >> CLOCK_SEQUENCE_BITS
