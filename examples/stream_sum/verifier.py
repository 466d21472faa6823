"""Verification of final sums: each stream's sum arrives once, with the value its chunks give,
within a deadline (the sans-IO `SumVerifier`), read from the sums journal read-committed
(`read_sums`).

The chunker calls `expect` once a stream's final chunk has committed (the append, or the ACK
of its transaction, succeeded), with the sum it computed itself; the reader calls `observe`
with each committed `Sum`. Either may come first (a summer can publish a sum before the chunker
hears its append succeed). Everything wrong is a `Finding`:

- ``mismatch``: the sum's seq or value differs from the chunker's;
- ``duplicate sum``: a second committed sum for a stream (exactly-once output broken);
- ``late sum``: no sum within `deadline_s` of the stream's end (the pipeline did not recover);
  a sum that arrives later still has its value checked;
- ``unexpected sum``: a sum for a stream whose end never committed, still unexplained
  `deadline_s` after it arrived (a rolled-back or abandoned chunk was summed).

`forget` drops a stream whose chunks the chunker cannot vouch for (an append of it failed:
that failure is reported by the chunker instead). Verified streams are remembered (to catch
duplicates) as a set of IDs: one small entry per stream.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from broker.client.route_cache import JournalClient
from examples.stream_sum.messages import Sum
from gazette_consumer.sequencer.read_iter import ReadCommittedIter
from gazette_consumer.sequencer.types import SequencerCheckpoint

__all__ = ["Finding", "SumVerifier", "read_sums"]

# Back-off of the sums reader after it failed, doubling up to the cap, until it reads again.
reader_backoff_initial_s = 0.1
reader_backoff_max_s = 5.0
# Consecutive failures of the sums reader (no sum read in between) before it gives up.
reader_failures_max = 30


@dataclass(frozen=True)
class Finding:
    """Something that broke a promise: `kind` (a short name) and what exactly, with the time
    (monotonic) it was found."""

    kind: str
    detail: str
    at: float = field(default_factory=time.monotonic)

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"


@dataclass(frozen=True)
class _Expected:
    journal: str
    seq: int
    value: int
    completed_at: float


# Called with (journal, completed_at, verified_at) for each verified sum.
OnVerified = Callable[[str, float, float], None]


class SumVerifier:
    """See the module docstring. `clock` is monotonic seconds (tests pass their own)."""

    def __init__(
        self,
        deadline_s: float,
        *,
        on_verified: OnVerified | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.deadline_s = deadline_s
        self.findings: list[Finding] = []
        self.verified = 0
        self._on_verified = on_verified
        self._clock = clock
        self._expected: dict[str, _Expected] = {}
        self._late: dict[str, _Expected] = {}  # Reported late, still to be checked.
        self._observed: dict[str, tuple[Sum, float]] = {}
        self._done: set[str] = set()
        self._forgotten: set[str] = set()

    @property
    def outstanding(self) -> int:
        """Streams whose end committed and whose sum has not been seen yet."""
        return len(self._expected) + len(self._late)

    def outstanding_by_journal(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for e in (*self._expected.values(), *self._late.values()):
            out[e.journal] = out.get(e.journal, 0) + 1
        return out

    def expect(self, stream: str, journal: str, seq: int, value: int) -> None:
        now = self._clock()
        expected = _Expected(journal, seq, value, now)
        seen = self._observed.pop(stream, None)
        if seen is not None:
            self._match(stream, expected, seen[0], now)
        else:
            self._expected[stream] = expected

    def forget(self, stream: str) -> None:
        self._forgotten.add(stream)
        self._expected.pop(stream, None)
        self._late.pop(stream, None)
        self._observed.pop(stream, None)

    def observe(self, total: Sum) -> None:
        now = self._clock()
        stream = total.stream
        if stream in self._forgotten:
            return
        if stream in self._done or stream in self._observed:
            self._find(
                "duplicate sum",
                f"stream {stream}: a second committed sum (seq {total.seq}, value {total.value})",
            )
            return
        expected = self._expected.pop(stream, None) or self._late.pop(stream, None)
        if expected is None:
            self._observed[stream] = (total, now)
            return
        self._match(stream, expected, total, now)

    def check_deadlines(self) -> None:
        """Report expected sums not seen within the deadline, and sums still unexplained."""
        now = self._clock()
        late: dict[str, list[str]] = {}
        for stream, e in list(self._expected.items()):
            if now - e.completed_at > self.deadline_s:
                del self._expected[stream]
                self._late[stream] = e
                late.setdefault(e.journal, []).append(stream)
        for journal, streams in sorted(late.items()):
            # One finding per journal and check: an outage makes many sums late at once.
            first = self._late[streams[0]]
            self._find(
                "late sum",
                f"journal {journal}: {len(streams)} stream(s) without a sum"
                f" {self.deadline_s:.0f}s after their end committed (e.g. stream {streams[0]},"
                f" expected seq {first.seq} value {first.value})",
            )
        for stream, (total, seen_at) in list(self._observed.items()):
            if now - seen_at > self.deadline_s:
                del self._observed[stream]
                self._done.add(stream)
                self._find(
                    "unexpected sum",
                    f"stream {stream}: summed (seq {total.seq}, value {total.value}) but its"
                    " end never committed (a rolled-back or abandoned chunk was summed?)",
                )

    def _match(self, stream: str, expected: _Expected, total: Sum, now: float) -> None:
        self._done.add(stream)
        self.verified += 1
        if (total.seq, total.value) != (expected.seq, expected.value):
            self._find(
                "mismatch",
                f"stream {stream} (journal {expected.journal}): expected seq {expected.seq}"
                f" value {expected.value}, observed seq {total.seq} value {total.value}",
            )
            return
        if self._on_verified is not None:
            self._on_verified(expected.journal, expected.completed_at, now)

    def _find(self, kind: str, detail: str) -> None:
        self.findings.append(Finding(kind, detail, self._clock()))


async def read_sums(
    client: JournalClient, journal: str, offset: int, verifier: SumVerifier, on_error: OnError
) -> None:
    """Read committed Sums of `journal` from `offset` into `verifier`, until cancelled. A
    failed read is reported to `on_error` and resumed from the last checkpoint taken between
    transactions (so no sum is observed twice), after a back-off; after `reader_failures_max`
    failures in a row, the last error is raised."""
    checkpoint: SequencerCheckpoint | None = None
    delay = reader_backoff_initial_s
    failures = 0
    while True:
        try:
            async with ReadCommittedIter(
                client, {journal: offset}, message_type=Sum, checkpoint=checkpoint
            ) as it:
                while True:
                    envelope = await it.next()
                    verifier.observe(envelope.message)
                    delay, failures = reader_backoff_initial_s, 0
                    if not it.in_sequence:
                        checkpoint = it.checkpoint()
        except asyncio.CancelledError:
            raise
        except Exception as err:
            failures += 1
            if failures >= reader_failures_max:
                raise
            on_error(err)
            await asyncio.sleep(delay)
            delay = min(reader_backoff_max_s, delay * 2)


OnError = Callable[[BaseException], None]
