"""Sequencer: turns read-uncommitted messages into read-committed ones (sans-IO).

Journal appends are at-least-once and producers write transactions as CONTINUE_TXN messages
closed by an ACK_TXN, so a journal read in order holds duplicates, pending messages that may yet
roll back, and the messages of many producers interleaved. The Sequencer is fed that stream one
envelope at a time and hands back exactly the committed messages, each once, in per-producer order.

Per (journal, producer) it keeps a `Partial` (ring.py): the clock of the last delivered ACK
(`min_clock`, exclusive), the largest clock of the pending span (`max_clock`), and the offset at
which that span began. Messages are de-duplicated by clock alone: a producer's clock ticks with every UUID it
generates, so anything not larger than what was already seen is a re-append.

Committed messages are normally served from a fixed ring of recently queued envelopes, in which
the envelopes of one producer's span are linked together (`SpanRing`, ring.py). A span that began before what the ring
still holds (long transactions, busy journals, a restart from a checkpoint) is re-read instead:
the Sequencer names the byte range (`ReplayRequired`) and the caller supplies those envelopes
through `replay()`. Either way no producer waits on another: an ACK delivers its span at once,
however many other producers have spans pending around it.

Protocol, for the caller:

    outcome = seq.queue_uncommitted(env)
    if seq.replay_required is not None:
        r = seq.replay_required
        seq.replay(read_uncommitted(r.journal, r.begin, r.end))
    while seq.step():
        consume(seq.dequeued)

An envelope returned by `step()` counts as consumed for `checkpoint()`: a checkpoint taken after
it resumes with the next one. Checkpointing only between `queue_uncommitted` calls keeps the
messages of one ACK within one consumer transaction, as Gazette's consumers do.

Entry points: `queue_uncommitted` validates what it is given (a `SeqEnvelope` was validated when
built). The others trust it, for envelopes that are valid by construction (the message layer's
decoders derive them from the framing and the UUID layout), and are what a reader uses:

- `queue_trusted(env)`: `queue_uncommitted` without the validation;
- `commit_alone(env)`: the commonest case, an OUTSIDE_TXN message that commits by itself, in one
  call and without touching the ring: what `queue_trusted` and two `step()`s would do; or it
  declines, changing nothing;
- `commit_alone_run(envs)`: `commit_alone` for the longest run at the front of a decoded
  piece that it would deliver one by one (one producer's OUTSIDE_TXN messages, clocks
  rising), in one call;
- `queue_span(pending)`: `queue_trusted` for each envelope of a deque, up to one that commits
  (a transaction's messages are linked into the ring without per-message outcomes, a
  producer's run of them into free slots at once);
- `dequeue()`: `step()` returning the envelope stepped to;
- `dequeue_all()`: every envelope `dequeue()` would return for the emission in progress, in
  one call (not while a replay serves it);
- `commit_span_run(envs)`: a whole transaction at the front of `envs` (one producer's
  CONTINUE_TXN messages, then its ACK) committed at once, without the ring.

They leave the Sequencer exactly as the general protocol above would (a property test holds
them to it), so a caller may mix them freely.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import islice
from typing import Final, Generic, TypeVar

import structlog

from gazette_consumer.sequencer.ring import Partial, SpanRing, invariant
from gazette_consumer.sequencer.types import (
    CLOCK_MAX,
    FLAG_ACK_TXN,
    FLAG_CONTINUE_TXN,
    FLAG_OUTSIDE_TXN,
    JournalProducer,
    ProducerState,
    QueueOutcome,
    ReplayRequired,
    SeqEnvelope,
    Sequenced,
    SequencerCheckpoint,
    SequencerError,
    check_envelope,
)

E = TypeVar("E", bound=Sequenced)
"""The type of envelopes a Sequencer is given, and hands back when they are dequeued."""

RING_SIZE_MAX = 1 << 20
"""Upper bound on `ring_size`: the ring is preallocated, so it bounds the Sequencer's memory."""

_log = structlog.get_logger(__name__)


class SequencerStateError(SequencerError, RuntimeError):
    """A method was called out of protocol order; nothing was changed."""


class OffsetRegressionError(SequencerError, ValueError):
    """An envelope begins before the journal's read-through offset; nothing was changed."""


class ReplayMismatchError(SequencerError, ValueError):
    """A replayed envelope lies outside the `ReplayRequired` range it was asked for."""


class _Emit(Generic[E]):
    """A committed sequence being dequeued."""

    __slots__ = (
        "done",
        "partial",
        "producer",
        "replay",
        "replay_range",
        "replay_required",
        "tracked",
    )

    def __init__(
        self,
        producer: bytes,
        partial: Partial,
        replay_required: ReplayRequired | None,
        *,
        tracked: bool = True,
    ) -> None:
        self.producer = producer
        self.partial = partial
        self.tracked = tracked  # False for a zero-clock envelope, which has no producer state.
        self.replay_required = replay_required  # Set until the caller calls replay().
        self.replay_range: ReplayRequired | None = None
        self.replay: Iterator[E] | None = None
        self.done = False  # The committing envelope was returned: the next step() ends it.


# Enum members as module constants: reading one through its class costs ~80 ns, per message.
_OUTSIDE_ALREADY_ACKED: Final = QueueOutcome.OUTSIDE_ALREADY_ACKED
_OUTSIDE_COMMIT: Final = QueueOutcome.OUTSIDE_COMMIT
_CONTINUE_ALREADY_ACKED: Final = QueueOutcome.CONTINUE_ALREADY_ACKED
_CONTINUE_TXN_CLOCK_LARGER: Final = QueueOutcome.CONTINUE_TXN_CLOCK_LARGER
_CONTINUE_BEGIN_SPAN: Final = QueueOutcome.CONTINUE_BEGIN_SPAN
_CONTINUE_EXTEND_SPAN: Final = QueueOutcome.CONTINUE_EXTEND_SPAN
_ACK_ROLLBACK: Final = QueueOutcome.ACK_ROLLBACK
_ACK_EMPTY: Final = QueueOutcome.ACK_EMPTY
_ACK_COMMIT_RING: Final = QueueOutcome.ACK_COMMIT_RING
_ACK_COMMIT_REPLAY: Final = QueueOutcome.ACK_COMMIT_REPLAY


class Sequencer(Generic[E]):
    """Sequences read-uncommitted envelopes into read-committed ones. See the module docstring.

    Generic in the envelopes it is given (`SeqEnvelope`, or anything `Sequenced`), which it
    hands back unchanged when they are dequeued.
    """

    def __init__(self, ring_size: int, checkpoint: SequencerCheckpoint | None = None) -> None:
        if isinstance(ring_size, bool) or not isinstance(ring_size, int):
            raise ValueError(f"ring_size: must be an int (got {ring_size!r})")
        if not 1 <= ring_size <= RING_SIZE_MAX:
            raise ValueError(f"ring_size: must be in [1, {RING_SIZE_MAX}] (got {ring_size})")
        if checkpoint is None:
            checkpoint = SequencerCheckpoint()

        self._ring: SpanRing[E] = SpanRing(ring_size)
        self._read_through: dict[str, int] = dict(checkpoint.read_through)
        # Keyed by (journal, producer): a tuple is cheaper to build than a JournalProducer,
        # and one is looked up per queued envelope.
        self._partials: dict[tuple[str, bytes], Partial] = {}
        for jp, state in checkpoint.producers.items():
            # max_clock is not checkpointed: a restored pending span only needs its begin, and
            # any re-appended duplicate of it is filtered by clock when it is delivered.
            self._partials[(jp.journal, jp.producer)] = Partial(state.last_ack, state.begin)
        self._emit: _Emit[E] | None = None
        self._dequeued: E | None = None

    # -- queueing ------------------------------------------------------------------------------

    def queue_uncommitted(self, env: E) -> QueueOutcome:
        """Apply the next envelope read from `env.journal`, and say what it did.

        If the outcome `commits`, the caller must `step()` until it returns False before
        queueing again (and first `replay()` if `replay_required` is set). Raises
        `InvalidEnvelopeError` for an envelope with a field out of its domain (a `SeqEnvelope`
        was checked when built), changing nothing.
        """
        if type(env) is not SeqEnvelope:
            check_envelope(env)
        return self.queue_trusted(env)

    def queue_trusted(self, env: E) -> QueueOutcome:
        """`queue_uncommitted`, for an envelope whose fields are valid by construction (built by
        the message layer's decoders): nothing about it is checked but the protocol order and
        its offset."""
        if self._emit is not None:
            raise SequencerStateError(
                "queue_uncommitted: committed messages remain to dequeue; "
                "step() until it returns False first"
            )
        read_through = self._read_through.get(env.journal, 0)
        if env.begin < read_through:
            raise OffsetRegressionError(
                f"envelope.begin: {env.journal} was read through {read_through}, "
                f"but the envelope begins at {env.begin}"
            )
        ring = self._ring
        if ring.owners[ring.head] is not None:
            ring.evict_at_head()
        self._dequeued = None

        if env.clock == 0:
            return self._commit_untracked(env)

        key = (env.journal, env.producer)
        partial = self._partials.get(key)
        if partial is None:
            # First sight of this producer: everything before this clock is presumed seen.
            partial = self._partials[key] = Partial(env.clock - 1, -1)
            partial.presumed = True

        outcome = self._classify(env, partial)
        self._apply(outcome, env, partial)
        return outcome

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
        self._emit = _Emit(ack.producer, partial, None)
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

    def _classify(self, env: E, partial: Partial) -> QueueOutcome:
        """Decide the outcome of `env`, without changing any state."""
        clock, flags = env.clock, env.flags
        if flags == FLAG_CONTINUE_TXN:
            if clock <= partial.min_clock:
                return _CONTINUE_ALREADY_ACKED
            if clock <= partial.max_clock:
                return _CONTINUE_TXN_CLOCK_LARGER
            if partial.begin == -1:
                return _CONTINUE_BEGIN_SPAN
            return _CONTINUE_EXTEND_SPAN

        if flags == FLAG_ACK_TXN:
            if clock < partial.min_clock and partial.presumed:
                # The reader started inside this producer's span (its bound is presumed from
                # the first clock seen): the ACK rolls back a transaction begun before that
                # start, of which only the tail was seen. Nothing regressed: no error.
                return _ACK_ROLLBACK
            if clock < partial.min_clock:
                # An upstream consumer restored a checkpoint older than its furthest progress and
                # is re-sending its ACKs. Gazette accepts the older clock as the new bound rather
                # than risk dropping genuinely new messages: exactly-once degrades to
                # at-least-once for the messages in between.
                _log.error(
                    "ACK_TXN older than the last ACK (loss of exactly-once semantics)",
                    journal=env.journal,
                    producer=env.producer.hex(),
                    clock=clock,
                    last_ack=partial.min_clock,
                )
                return _ACK_ROLLBACK
            if clock == partial.min_clock:
                # A re-sent ACK of the last delivered transaction: the producer restarted, and
                # whatever it began since is abandoned.
                return _ACK_ROLLBACK
            if partial.begin == -1:
                return _ACK_EMPTY
            if self._span_in_ring(env, partial):
                return _ACK_COMMIT_RING
            return _ACK_COMMIT_REPLAY

        if flags != FLAG_OUTSIDE_TXN:
            # Reserved flag bits may be used by newer producers; Gazette's readers fall back to
            # treating such messages as committed, and so do we.
            _log.error(
                "unexpected UUID flags; treating as OUTSIDE_TXN",
                journal=env.journal,
                producer=env.producer.hex(),
                flags=flags,
            )
        if clock <= partial.min_clock:
            return _OUTSIDE_ALREADY_ACKED
        # (A restored checkpoint taken just before this message was dequeued records its own
        # offset as `begin`: that is no mixed use.)
        if partial.begin not in (-1, env.begin):
            _log.error(
                "OUTSIDE_TXN after a pending CONTINUE_TXN span, which is discarded "
                "(mixed committed and uncommitted publishing to one journal?)",
                journal=env.journal,
                producer=env.producer.hex(),
                clock=clock,
            )
        return _OUTSIDE_COMMIT

    def _span_in_ring(self, ack: E, partial: Partial) -> bool:
        """True if the ring still holds the pending span from its beginning.

        Entries are evicted oldest first, so the span's first linked entry starting at the span's
        begin offset means no part of it was lost. With no linked entries, the ACK itself (about
        to be linked) must start at `begin`: that happens after a restart whose checkpoint was
        taken right before the ACK, with nothing of the span left to deliver but the ACK.
        """
        if partial.ring_start == -1:
            return partial.begin == ack.begin
        return partial.begin == self._ring.first(partial).begin

    def _apply(self, outcome: QueueOutcome, env: E, partial: Partial) -> None:
        """Carry out `outcome`. A committing outcome defers the read-through offset to the end of
        dequeue, so that a checkpoint taken meanwhile re-reads the committing envelope."""
        # Identity tests: QueueOutcome hashes in Python, so set membership costs more.
        if outcome is _CONTINUE_EXTEND_SPAN or outcome is _CONTINUE_BEGIN_SPAN:
            if outcome is _CONTINUE_BEGIN_SPAN:
                partial.begin = env.begin
                if partial.long_spans:
                    partial.unlinked += 1  # Predicted long: see Partial.long_spans.
                else:
                    self._ring.add_at_head(env, partial)
            elif partial.ring_start != -1:
                self._ring.add_at_head(env, partial)
            else:
                # The span lost its start (SpanRing.evict_at_head; or it was restored from a
                # checkpoint, or predicted long): its ACK replays it whole from `begin`, so it
                # links nothing more.
                partial.unlinked += 1
            partial.max_clock = env.clock
            self._read_through[env.journal] = env.end
        elif (
            outcome is _OUTSIDE_ALREADY_ACKED
            or outcome is _CONTINUE_ALREADY_ACKED
            or outcome is _CONTINUE_TXN_CLOCK_LARGER
        ):
            self._read_through[env.journal] = env.end
        elif outcome is _ACK_ROLLBACK:
            partial.reset(env.clock)
            self._read_through[env.journal] = env.end
        else:
            self._ring.add_at_head(env, partial)
            if outcome is _ACK_EMPTY:
                partial.begin = env.begin
            elif outcome is _OUTSIDE_COMMIT:
                # The message commits alone; a pending span before it is dropped.
                partial.begin = env.begin
                partial.ring_start = partial.ring_stop
            # Commit through this clock only: pending messages with larger clocks roll back.
            partial.max_clock = env.clock
            replay = None
            if outcome is _ACK_COMMIT_REPLAY:
                if partial.long_spans and partial.unlinked < len(self._ring):
                    partial.long_spans = False  # Predicted long, it was not: link the next.
                # The ACK was just linked: the span links one entry at least.
                replay = ReplayRequired(env.journal, partial.begin, self._ring.first(partial).begin)
            self._emit = _Emit(env.producer, partial, replay)

    def _commit_untracked(self, env: E) -> QueueOutcome:
        """A zero clock means no usable UUID: deliver it, keeping no producer state for it."""
        partial = Partial(0, env.begin)
        self._ring.add_at_head(env, partial)
        self._emit = _Emit(env.producer, partial, None, tracked=False)
        return _OUTSIDE_COMMIT

    # -- dequeuing -----------------------------------------------------------------------------

    @property
    def emitting(self) -> bool:
        """True while committed envelopes may be waiting to be dequeued (an emission is in
        progress): `dequeue()` must come before anything queued later."""
        return self._emit is not None

    @property
    def replay_required(self) -> ReplayRequired | None:
        """The range the caller must `replay()` before `step()`, or None."""
        return None if self._emit is None else self._emit.replay_required

    def replay(self, envelopes: Iterable[E]) -> None:
        """Supply the envelopes of the `replay_required` range, in journal order.

        They are read lazily by `step()`, so a reader over the journal may be passed directly.
        The whole range must be supplied: envelopes outside it raise `ReplayMismatchError`, but
        a range cut short cannot be told from one that holds fewer messages.
        """
        emit = self._emit
        if emit is None or emit.replay_required is None:
            raise SequencerStateError("replay: no replay is required")
        emit.replay_range, emit.replay_required = emit.replay_required, None
        emit.replay = iter(envelopes)

    @property
    def dequeued(self) -> E | None:
        """The committed envelope the last `step()` returned True for, else None."""
        return self._dequeued

    def step(self) -> bool:
        """Advance to the next committed envelope (`dequeued`); False once none remain.

        The envelope becomes consumed as far as `checkpoint()` is concerned.
        """
        return self.dequeue() is not None

    def dequeue(self) -> E | None:
        """`step()`, returning the envelope stepped to (`dequeued`), or None for False."""
        emit = self._emit
        if emit is None or emit.done:
            self._emit = None
            self._dequeued = None
            return None
        if emit.replay_required is not None:
            r = emit.replay_required
            raise SequencerStateError(
                f"step: replay() {r.journal} [{r.begin}, {r.end}) first, as replay_required asks"
            )
        partial = emit.partial
        if emit.replay is not None:
            env, final = self._next_committed(emit)
        else:
            ring = self._ring
            index = partial.ring_start
            following = ring.links[index] if index != -1 else -1
            env_or_none = ring.entries[index] if following != -1 else None
            if env_or_none is not None and (
                partial.min_clock < env_or_none.clock <= partial.max_clock
            ):
                # The commonest step, a message inside the span: SpanRing.next_committed's
                # first turn, inlined (it runs for every transactional message read).
                partial.ring_start = following
                ring.entries[index] = ring.owners[index] = None
                ring.links[index] = -1
                ring.occupied -= 1
                partial.min_clock = env_or_none.clock
                partial.begin = env_or_none.end
                self._dequeued = env_or_none
                return env_or_none
            env, final = ring.next_committed(partial)
        if final:
            if emit.tracked:
                partial.reset(env.clock)
            # Only now step past the committing envelope; see _apply.
            self._read_through[env.journal] = env.end
            emit.done = True
        else:
            # Tighten the state to what's left, so a checkpoint taken now resumes after `env`.
            partial.min_clock = env.clock
            partial.begin = env.end
        self._dequeued = env
        return env

    def dequeue_all(self) -> list[E]:
        """Every envelope `dequeue()` would return, in order, until the emission in progress
        ends (its committing envelope last: the ACK, or a message that commits alone), leaving
        the Sequencer as those calls and the one returning None after them would (`dequeued`
        None); what a reader saves per transactional message.
        Empty, changing nothing, when there is no emission, or it is served by a replay (use
        `dequeue()` then)."""
        emit = self._emit
        if emit is None or emit.done or emit.replay is not None or emit.replay_required:
            return []
        partial, ring = emit.partial, self._ring
        entries, owners, links = ring.entries, ring.owners, ring.links
        min_clock, max_clock = partial.min_clock, partial.max_clock
        out: list[E] = []
        index, freed = partial.ring_start, 0
        # SpanRing.next_committed, all turns in one loop: delivered are the committing
        # envelope, linked last, and the clocks the commit covers, each past the one before.
        for _ in range(len(entries)):  # A span links each slot at most once.
            # SpanRing.next_committed's invariants, as inline tests (checked per message).
            if index == -1:
                invariant(False, "ring ran out before the committing envelope")
            env = entries[index]
            if env is None:
                invariant(False, "a linked ring entry is empty")
            assert env is not None  # For the type checker; checked just above.
            following = links[index]
            entries[index] = owners[index] = None
            links[index] = -1
            freed += 1
            if following == -1:
                out.append(env)
                break
            if min_clock < env.clock <= max_clock:
                out.append(env)
                min_clock = env.clock
            index = following
        else:
            raise AssertionError("sequencer invariant violated: a span's ring links form a cycle")
        ring.occupied -= freed
        partial.ring_start = -1
        if emit.tracked:
            partial.reset(env.clock)
        self._read_through[env.journal] = env.end
        # And the call after them, which returns None: the emission is over.
        self._emit = self._dequeued = None
        return out

    def dequeue_replayed(self, limit: int) -> list[E]:
        """The envelopes `dequeue()` would return, in order, while the emission in progress
        is served by its replay, taking `limit` envelopes at most from the replay iterator,
        in one call: never the committing one (it is the ring's), so the emission goes on
        (`dequeue()` returns what follows). Leaves the Sequencer as those `dequeue()` calls
        would (`dequeued` the last returned); with an iterator that ends within `limit`, as
        the first `dequeue()` to find it ended would, up to the ring's part. Empty, changing
        nothing, if no replay serves the emission (or `replay()` is due first). What a reader
        saves per replayed message: a transaction longer than the ring is replayed whole."""
        emit = self._emit
        if emit is None or emit.done or emit.replay is None or limit < 1:
            return []
        partial, producer, replay = emit.partial, emit.producer, emit.replay
        min_clock, max_clock = partial.min_clock, partial.max_clock
        out: list[E] = []
        taken = 0
        for env in islice(replay, limit):
            taken += 1
            self._check_replayed(emit, env)
            # As _next_committed: other producers' messages, duplicates and clocks the commit
            # rolls back are skipped, and zero clocks (min_clock is never negative).
            if min_clock < env.clock <= max_clock and (
                env.producer is producer or env.producer == producer
            ):
                out.append(env)
                min_clock = env.clock
        if taken < limit:
            emit.replay = None  # Ended: the ring's part follows.
        if out:
            last = out[-1]
            partial.min_clock, partial.begin = last.clock, last.end
            self._dequeued = last
        return out

    def read_through(self, journal: str) -> int:
        """The offset of `journal` through which envelopes were queued and stepped past (what
        `checkpoint()` reports for it; 0 if none was)."""
        return self._read_through.get(journal, 0)

    def _next_committed(self, emit: _Emit[E]) -> tuple[E, bool]:
        """The next envelope to deliver, and whether it is the committing (last) one."""
        partial = emit.partial
        while emit.replay is not None:
            env = next(emit.replay, None)
            if env is None:
                emit.replay = None  # Continue with the part the ring still holds.
                break
            self._check_replayed(emit, env)
            # A replayed range holds other producers' messages, duplicates and messages outside
            # the committed clock range; zero-clock ones were delivered when first read.
            if env.producer != emit.producer or env.clock == 0:
                continue
            if partial.min_clock < env.clock <= partial.max_clock:
                return env, False

        return self._ring.next_committed(partial)

    @staticmethod
    def _check_replayed(emit: _Emit[E], env: E) -> None:
        r = emit.replay_range
        assert r is not None  # Set together with emit.replay.
        if env.journal != r.journal:
            raise ReplayMismatchError(
                f"replayed envelope.journal: expected {r.journal} (got {env.journal})"
            )
        if env.begin < r.begin or env.end > r.end:
            raise ReplayMismatchError(
                f"replayed envelope [{env.begin}, {env.end}): outside the required range "
                f"[{r.begin}, {r.end}) of {r.journal}"
            )

    # -- checkpoints ---------------------------------------------------------------------------

    def checkpoint(
        self, horizon_clock: int = 0, *, keep: tuple[str, bytes] | None = None
    ) -> SequencerCheckpoint:
        """Snapshot read-through offsets and producer states, to construct a Sequencer from.

        Producers with no pending span whose last ACK is older than `horizon_clock` are pruned
        first (0 prunes nothing): their state would otherwise grow without bound. Should such a
        producer's duplicates be read later, they are delivered again, so the horizon must
        comfortably exceed how long a producer may go quiet. `keep` names a (journal, producer)
        never pruned: a reader holding messages `commit_alone_run` delivered ahead of its caller
        accounts for that producer itself.
        """
        if isinstance(horizon_clock, bool) or not isinstance(horizon_clock, int):
            raise ValueError(f"horizon_clock: must be an int (got {horizon_clock!r})")
        if not 0 <= horizon_clock <= CLOCK_MAX:
            raise ValueError(f"horizon_clock: must be in [0, {CLOCK_MAX}] (got {horizon_clock})")
        stale = [
            key
            for key, p in self._partials.items()
            if p.begin == -1 and p.min_clock < horizon_clock and key != keep
        ]
        for key in stale:
            del self._partials[key]
        return SequencerCheckpoint(
            read_through=self._read_through,
            producers={
                JournalProducer(journal, producer): ProducerState(p.min_clock, p.begin)
                for (journal, producer), p in self._partials.items()
            },
        )

    def has_pending(self, since: Mapping[str, int]) -> bool:
        """True if a pending span began at or after the given per-journal offsets.

        Consumers pass the offsets of their previous checkpoint: a span begun since hints that
        its ACK is coming soon, and is worth waiting for before committing a transaction.
        """
        return any(
            p.begin != -1 and p.begin >= since.get(journal, 0)
            for (journal, _), p in self._partials.items()
        )


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
