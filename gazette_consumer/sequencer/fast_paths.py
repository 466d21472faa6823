"""The Sequencer's fast entry points, for a reader's hot path (sans-IO).

Each does at once what the general path (classify.py) would do for a run of envelopes, or
declines, changing nothing: `commit_alone`, `commit_alone_run`, `commit_span_run`,
`queue_span` (with `_link_run` and `_skip_run`). See sequencer.py's docstring for the protocol
and the property tests that hold them to the general path.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from itertools import islice

from gazette_consumer.sequencer.classify import SequencerQueueing
from gazette_consumer.sequencer.ring import Partial
from gazette_consumer.sequencer.state import E, Emission
from gazette_consumer.sequencer.types import (
    FLAG_ACK_TXN,
    FLAG_CONTINUE_TXN,
    FLAG_OUTSIDE_TXN,
    Sequenced,
)


class SequencerFastPaths(SequencerQueueing[E]):
    """The fast entry points (see the module docstring)."""

    def commit_alone(self, env: E) -> bool:
        """Deliver `env` at once if it commits by itself, and say whether it did.

        True for what `queue_trusted(env)` would find an OUTSIDE_COMMIT with nothing to discard
        (an OUTSIDE_TXN message newer than its producer's last ACK, from a producer with no
        pending span), or a message without a UUID (clock 0): the Sequencer is left exactly as
        `queue_trusted(env)`, `step()` (returning `env`) and `step()` (returning False) would
        leave it, and the caller delivers `env` itself. Otherwise nothing changes, and the caller
        uses `queue_trusted`. Trusts `env` as `queue_trusted` does.
        """
        if self._emit is not None or env.flags != FLAG_OUTSIDE_TXN:
            return False
        journal, read_through = env.journal, self._read_through
        if env.begin < read_through.get(journal, 0):
            return False  # queue_trusted raises OffsetRegressionError.
        clock = env.clock
        if clock:
            key = (journal, env.producer)
            partial = self._partials.get(key)
            if partial is None:
                # As queue_trusted would create it, after the commit reset it to this clock.
                self._partials[key] = Partial(clock, -1)
            elif partial.begin != -1 or clock <= partial.min_clock:
                return False  # A pending span to discard, or a duplicate.
            else:
                partial.min_clock = partial.max_clock = clock
        # The envelope would take the head slot, and be unlinked from it once delivered: the
        # slot is used up all the same (which evicts its old entry), but left empty.
        ring = self._ring
        head = ring.head
        if ring.owners[head] is not None:
            ring.evict_at_head()
        head += 1  # The slot is used up, but left free.
        ring.head = 0 if head == len(ring.entries) else head
        read_through[journal] = env.end
        self._dequeued = None
        return True

    def commit_alone_run(self, envs: Sequence[E], length: int | None = None) -> int:
        """Deliver at once the longest run at the front of `envs` that `commit_alone` would
        deliver one by one, and return its length (0: nothing changed).

        A run is OUTSIDE_TXN messages of one journal and one producer, the first newer than the
        producer's last ACK (and the producer without a pending span), each newer than the one
        before and beginning at or after its end: for each, `commit_alone` would return True.
        The Sequencer is left exactly as those calls would leave it (producer state, ring head
        and the slots it passes, read-through offset), but in one call: what a reader saves per
        message. Messages without a UUID (clock 0) end a run (`commit_alone` takes them).
        Trusts `envs` as `queue_trusted` does.

        `length`, if given, is how many envelopes at the front of `envs` are already known to
        form such a run among themselves (a decoder measured it while building them:
        `ChunkDecoder.lead_run`), and is trusted as `envs` is; the run is then not checked
        again, only its first envelope against the Sequencer's state. 0 commits nothing.
        """
        if self._emit is not None or not envs or length == 0:
            return 0
        first = envs[0]
        journal, producer, clock = first.journal, first.producer, first.clock
        if first.flags != FLAG_OUTSIDE_TXN or not clock:
            return 0
        read_through = self._read_through
        if first.begin < read_through.get(journal, 0):
            return 0
        key = (journal, producer)
        partial = self._partials.get(key)
        if partial is not None and (partial.begin != -1 or clock <= partial.min_clock):
            return 0
        n = _run_length(envs, journal, producer) if length is None else min(length, len(envs))
        last = envs[n - 1]
        if partial is None:
            self._partials[key] = Partial(last.clock, -1)
        else:
            partial.min_clock = partial.max_clock = last.clock
        # Each message would have used up the head slot (evicting its entry) and left it free.
        self._ring.pass_slots(n)
        read_through[journal] = last.end
        self._dequeued = None
        return n

    def commit_alone_mixed(
        self, envs: Iterable[E], before: dict[tuple[str, bytes], int | None]
    ) -> int:
        """Deliver at once the longest run at the front of `envs` that `commit_alone` would
        deliver one by one, of any producers of one journal, and return its length (0: nothing
        changed): what `commit_alone_run` does for one producer, where producers alternate.

        Each message is OUTSIDE_TXN with a UUID (one without ends the run: `commit_alone` takes
        it), newer than its producer's last ACK (or than the message before it in the run), of
        a producer without a pending span, beginning at or after the end of the one before.
        The Sequencer is left exactly as those `commit_alone` calls would leave it. `before`
        is given, for each (journal, producer) of the run, the clock of its last ACK before the
        run, or None if the Sequencer had no state for it: what a reader returning the run one
        by one needs for its checkpoints (read_checkpoint.py). Trusts `envs` as `queue_trusted`
        does."""
        if self._emit is not None:
            return 0
        partials, outside = self._partials, FLAG_OUTSIDE_TXN
        journal: str | None = None
        through = 0
        n = 0
        for env in envs:
            clock = env.clock
            if env.flags != outside or not clock:
                break
            if journal is None:
                journal = env.journal
                through = self._read_through.get(journal, 0)
            elif env.journal is not journal and env.journal != journal:
                break
            if env.begin < through:
                break  # queue_trusted raises OffsetRegressionError.
            key = (journal, env.producer)
            partial = partials.get(key)
            if partial is None:
                # As commit_alone creates it (and it was absent before the run: it would exist
                # had the run committed one of this producer's messages already).
                before[key] = None
                partials[key] = Partial(clock, -1)
            elif partial.begin != -1 or clock <= partial.min_clock:
                break  # A pending span to discard, or a duplicate: queue_trusted's.
            else:
                if key not in before:
                    before[key] = partial.min_clock
                partial.min_clock = partial.max_clock = clock
            through = env.end
            n += 1
        if n:
            assert journal is not None
            # Each message would have used up the head slot (evicting its entry), left free.
            self._ring.pass_slots(n)
            self._read_through[journal] = through
            self._dequeued = None
        return n

    def commit_span_run(self, envs: Sequence[E], limit: int | None = None) -> int:
        """Commit at once a whole transaction at the front of `envs` — one producer's
        CONTINUE_TXN messages, clocks rising, then its ACK — and
        return how many envelopes that took (the ACK included; 0: nothing changed). The
        Sequencer is left as queueing each with `queue_trusted` and dequeuing them all (the
        ACK last, then None) would leave it: the caller delivers the messages itself. What a
        reader saves per transaction that fits in what it decoded.

        Declined (0) whenever one by one would do anything else: an emission in progress, a
        pending span of the producer, a duplicate or a message without a UUID, another
        producer's message or an OUTSIDE_TXN one before the ACK, an ACK below the messages'
        clocks (some roll back), offsets going back. (A transaction longer than the ring is
        taken too: one by one, its ACK would replay from the journal the messages `envs`
        holds, to the same end state.) `limit`, if given, is the most messages looked at
        before the ACK: a caller that finds longer transactions cheaper through the ring
        bounds what a declined look costs. Trusts `envs` as `queue_trusted` does."""
        if self._emit is not None or len(envs) < 2:
            return 0
        first = envs[0]
        clock = first.clock
        if first.flags != FLAG_CONTINUE_TXN or not clock:
            return 0
        journal, producer = first.journal, first.producer
        read_through = self._read_through
        if first.begin < read_through.get(journal, 0):
            return 0
        key = (journal, producer)
        partial = self._partials.get(key)
        if partial is not None and (
            partial.begin != -1 or clock <= partial.max_clock or partial.long_spans
        ):
            return 0  # (A predicted long span is replayed one by one: Partial.long_spans.)
        end = first.end
        n = 1
        for env in islice(envs, 1, None if limit is None else limit + 1):
            if env.begin < end or env.producer is not producer:
                return 0  # Of another producer (or not interned: one by one decides).
            if env.journal is not journal and env.journal != journal:
                return 0
            flags, next_clock = env.flags, env.clock
            if flags == FLAG_ACK_TXN:
                if next_clock < clock:
                    return 0  # Messages with larger clocks roll back.
                break
            if flags != FLAG_CONTINUE_TXN or next_clock <= clock:
                return 0
            clock, end = next_clock, env.end
            n += 1
        else:
            return 0  # No ACK yet.
        ack = envs[n]
        # Each envelope would have taken the head slot (evicting its entry), and every one of
        # them been delivered from it, leaving it free; but for a span longer than the ring,
        # whose message after the ring's length evicts its first and ends its linking (then
        # only the ACK takes a slot more).
        taken = n + 1
        self._ring.pass_slots(min(n, len(self._ring)) + 1)
        if partial is None:
            partial = self._partials[key] = Partial(ack.clock, -1)
        else:
            partial.reset(ack.clock)
        if n >= len(self._ring):
            # One by one, the span would have lost its start (at the ACK, if not before).
            partial.long_spans = True
        read_through[journal] = ack.end
        self._dequeued = None
        return taken

    def queue_span(self, pending: deque[E]) -> E | None:
        """Queue envelopes from the front of `pending` (trusted, as `queue_trusted`): at least
        one, then on until one commits, which is returned (the caller steps it, as after
        `queue_trusted`); or until `pending` is empty or an OUTSIDE_TXN envelope is next (for
        `commit_alone`), returning None.

        The same as queueing each with `queue_trusted` (an error propagates with the envelope
        popped), but a transaction's CONTINUE_TXN messages are linked into the ring inline.
        """
        read_through, partials, ring = self._read_through, self._partials, self._ring
        entries, owners, links, size = ring.entries, ring.owners, ring.links, len(ring.entries)
        # The partial of the last message linked inline, and whose it is: a transaction's
        # messages come in runs of one producer (interned by the decoder), looked up once.
        last_journal: str | None = None
        last_producer: bytes | None = None
        last_partial: Partial | None = None
        first = True
        while pending and (first or pending[0].flags != FLAG_OUTSIDE_TXN):
            first = False
            env = pending.popleft()
            clock = env.clock
            if env.flags == FLAG_CONTINUE_TXN and clock and self._emit is None:
                journal, producer = env.journal, env.producer
                if producer is last_producer and journal is last_journal:
                    partial = last_partial
                else:
                    partial = partials.get((journal, producer))
                # What _classify calls CONTINUE_BEGIN_SPAN or CONTINUE_EXTEND_SPAN, applied as
                # _apply does (max_clock >= min_clock always, so no ACK covers this clock).
                if (
                    partial is not None
                    and clock > partial.max_clock
                    and env.begin >= read_through.get(journal, 0)
                ):
                    self._dequeued = None
                    # SpanRing.add_at_head, inlined (it runs for every transactional message).
                    head = ring.head
                    if owners[head] is not None:
                        ring.evict_at_head()  # Perhaps of this span's first entry: see below.
                    if partial.begin == -1:
                        partial.begin = env.begin
                        linked = not partial.long_spans  # See Partial.long_spans.
                    else:
                        linked = partial.ring_start != -1
                    if not linked:
                        # The span lost its start (or is predicted to): replayed whole at its
                        # ACK, never linked.
                        partial.unlinked += 1
                        partial.max_clock = clock
                        read_through[journal] = env.end
                        last_journal, last_producer, last_partial = journal, producer, partial
                        if pending:
                            self._skip_run(pending, partial, env)
                        continue
                    entries[head] = env
                    owners[head] = partial
                    ring.occupied += 1
                    if partial.ring_stop == -1:
                        partial.ring_start = head
                    else:
                        links[partial.ring_stop] = head
                    partial.ring_stop = head
                    head += 1
                    ring.head = 0 if head == size else head
                    partial.max_clock = clock
                    read_through[journal] = env.end
                    last_journal, last_producer, last_partial = journal, producer, partial
                    if pending and head != size:
                        self._link_run(pending, partial, head)
                    continue
            elif (
                env.flags == FLAG_ACK_TXN
                and env.producer is last_producer
                and env.journal is last_journal
                and self._emit is None
                and self._commit_span_inline(env, last_partial)
            ):
                return env  # The ACK of the span just linked commits it.
            # May add or drop partials: look the next one up afresh.
            last_journal = last_producer = last_partial = None
            self.queue_trusted(env)
            if self._emit is not None:  # The outcome commits.
                return env
        return None

    def unlinked_span_clock(self, journal: str, producer: bytes) -> int | None:
        """The largest clock of `producer`'s pending span in `journal` if that span links
        nothing (it lost its start, was predicted long or restored: its ACK replays it whole),
        else None. Messages continuing it past that clock are only counted
        (`skip_continuation`): a reader may decode no more of them than their UUIDs."""
        partial = self._partials.get((journal, producer))
        if (
            self._emit is not None
            or partial is None
            or partial.begin == -1
            or partial.ring_start != -1
        ):
            return None
        return partial.max_clock

    def span_begin(self, journal: str, producer: bytes) -> int:
        """The offset at which `producer`'s pending span in `journal` began, or -1 if none is
        pending."""
        partial = self._partials.get((journal, producer))
        return -1 if partial is None else partial.begin

    def skip_continuation(
        self, journal: str, producer: bytes, count: int, begin: int, clock: int, end: int
    ) -> bool:
        """Queue `count` messages of `journal` from offset `begin` to `end`, that continue
        `producer`'s unlinked span (see `unlinked_span_clock`): CONTINUE_TXN messages of
        `producer`, clocks rising from above the span's largest to `clock`, offsets rising.
        Leaves the Sequencer as `queue_trusted` of each would (they are counted, not linked),
        without the envelopes; False, changing nothing, if the span is not (or no longer)
        unlinked, or `begin` is before the journal's read-through offset. Trusts the rest, as
        `queue_trusted` trusts an envelope: the caller read it from the messages' UUIDs."""
        if count < 1 or self.unlinked_span_clock(journal, producer) is None:
            return False
        read_through = self._read_through
        if begin < read_through.get(journal, 0):
            return False  # queue_trusted raises OffsetRegressionError.
        partial = self._partials[(journal, producer)]
        # As queue_trusted does for the first (the head slot is then free for the others).
        ring = self._ring
        if ring.owners[ring.head] is not None:
            ring.evict_at_head()
        partial.unlinked += count
        partial.max_clock = clock
        read_through[journal] = end
        self._dequeued = None
        return True

    def _commit_span_inline(self, ack: E, partial: Partial | None) -> bool:
        """Queue `ack`, the ACK of `partial`'s span whose messages were just linked, if it
        commits that span from the ring (what _classify calls ACK_COMMIT_RING), as
        queue_trusted and _apply would; else return False, having done only what queue_trusted
        does first whatever the outcome (evict the head slot), for it to take the ACK: a
        replay, a rollback, an old ACK."""
        if (
            partial is None
            or ack.clock <= partial.min_clock  # A rollback (or no UUID): queue_trusted's.
            or partial.begin == -1
            or ack.begin < self._read_through.get(ack.journal, 0)
        ):
            return False
        ring = self._ring
        # As queue_trusted does first, whatever comes of the ACK (then a no-op there).
        if ring.owners[ring.head] is not None:
            ring.evict_at_head()
        if not self._span_in_ring(ack, partial):
            return False  # The span needs a replay: queue_trusted's.
        self._dequeued = None
        ring.add_at_head(ack, partial)
        partial.max_clock = ack.clock
        self._emit = Emission(ack.producer, partial, None)
        return True

    def _link_run(self, pending: deque[E], partial: Partial, head: int) -> None:
        """Link the CONTINUE_TXN messages at the front of `pending` that continue `partial`'s
        span (just extended by the message before them in slot ``head - 1``: the same producer,
        clocks rising) into the free slots from `head` on, at once: what queue_span's loop
        would do for each, as slice assignments. Stops at the ring's end and at the first
        message that is not such a continuation (the loop takes it). Entries in the slots it
        takes are evicted first, oldest first, as linking one by one would evict them: a span
        longer than the ring keeps being linked a run at once once the ring is full, where
        declining would leave each message to the loop, and this to look at the whole run
        again for each (a transaction longer than the ring cost ~40x more per message)."""
        ring = self._ring
        entries, owners, size = ring.entries, ring.owners, len(ring.entries)
        first = entries[head - 1]
        assert first is not None  # The message just linked there.
        producer, clock, room = first.producer, first.clock, size - head
        if partial.ring_start >= head:
            # Up to the span's own first entry only: the message that would evict it is the
            # loop's (the span then loses its start, see SpanRing.evict_at_head).
            room = partial.ring_start - head
        run: list[E] = []
        for env in pending:
            if (
                env.flags != FLAG_CONTINUE_TXN
                or env.producer is not producer  # Interned by the decoder; else one by one.
                or env.clock <= clock
                or len(run) == room
            ):
                break
            run.append(env)
            clock = env.clock
        n = len(run)
        if not n:
            return
        stop = head + n
        # Evicting them all before linking any is the same: only this span's chain is linked
        # to, after its last entry (slot head - 1, outside the slots evicted).
        ring.pass_slots(n)
        entries[head:stop] = run
        owners[head:stop] = [partial] * n
        ring.links[head - 1 : stop - 1] = range(head, stop)  # Free slots' links are -1.
        ring.occupied += n
        partial.ring_stop = stop - 1
        ring.head = 0 if stop == size else stop
        last = run[-1]
        partial.max_clock = last.clock
        self._read_through[last.journal] = last.end
        for _ in range(n):
            pending.popleft()

    def _skip_run(self, pending: deque[E], partial: Partial, last: E) -> None:
        """Take at once the CONTINUE_TXN messages at the front of `pending` that continue the
        span of `partial` after `last` (just taken: the same producer, clocks rising), a span
        that lost its start: nothing of it is in the ring and nothing more is linked (its ACK
        replays it whole). What queue_span's loop would do for each (the head slot each would
        evict is free already), for a transaction longer than the ring. Stops at the first
        message that is not such a continuation (the loop takes it)."""
        journal, producer, clock, end = last.journal, last.producer, last.clock, last.end
        n = 0
        for env in pending:
            if (
                env.flags != FLAG_CONTINUE_TXN
                or env.producer is not producer  # Interned by the decoder; else one by one.
                or env.clock <= clock
                or env.begin < end
                or (env.journal is not journal and env.journal != journal)
            ):
                break
            clock, end = env.clock, env.end
            n += 1
        if not n:
            return
        for _ in range(n):
            pending.popleft()
        partial.unlinked += n
        partial.max_clock = clock
        self._read_through[journal] = end


def _run_length(envs: Sequence[Sequenced], journal: str, producer: bytes) -> int:
    """How many envelopes at the front of `envs` (whose first is OUTSIDE_TXN, of `journal` and
    `producer`, with a clock) form a run for `Sequencer.commit_alone_run`: each of the same
    kind, with a larger clock than the one before and beginning at or after its end."""
    # One loop testing everything, cheapest tests first: ~60-90 ns per envelope, where a pass
    # in C per field (map, attrgetter) costs 40-70 ns each on msgspec Structs. Producers and
    # journals of one decoder's envelopes are usually the same objects.
    first = envs[0]
    prev, end = first.clock, first.end
    n = 1
    for env in islice(envs, 1, None):
        clock = env.clock
        if (
            clock <= prev
            or env.flags != FLAG_OUTSIDE_TXN
            or env.begin < end
            or (env.producer is not producer and env.producer != producer)
            or (env.journal is not journal and env.journal != journal)
        ):
            return n
        prev, end = clock, env.end
        n += 1
    return n
