"""Sequencer: turns read-uncommitted messages into read-committed ones (sans-IO).

Journal appends are at-least-once and producers write transactions as CONTINUE_TXN messages
closed by an ACK_TXN, so a journal read in order holds duplicates, pending messages that may yet
roll back, and the messages of many producers interleaved. The Sequencer is fed that stream one
envelope at a time and hands back exactly the committed messages, each once, in per-producer order.

Per (journal, producer) it keeps a `_Partial`: the clock of the last delivered ACK (`min_clock`,
exclusive), the largest clock of the pending span (`max_clock`), and the offset at which that
span began. Messages are de-duplicated by clock alone: a producer's clock ticks with every UUID it
generates, so anything not larger than what was already seen is a re-append.

Committed messages are normally served from a fixed ring of recently queued envelopes, in which
the envelopes of one producer's span are linked together. A span that began before what the ring
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
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import structlog

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
    SequencerCheckpoint,
    SequencerError,
)

RING_SIZE_MAX = 1 << 20
"""Upper bound on `ring_size`: the ring is preallocated, so it bounds the Sequencer's memory."""

_log = structlog.get_logger(__name__)


class SequencerStateError(SequencerError, RuntimeError):
    """A method was called out of protocol order; nothing was changed."""


class OffsetRegressionError(SequencerError, ValueError):
    """An envelope begins before the journal's read-through offset; nothing was changed."""


class ReplayMismatchError(SequencerError, ValueError):
    """A replayed envelope lies outside the `ReplayRequired` range it was asked for."""


def _invariant(condition: bool, what: str) -> None:
    # Not `assert`: these guard exactly-once delivery and must survive `python -O`.
    if not condition:
        raise AssertionError(f"sequencer invariant violated: {what}")


class _Partial:
    """Sequencing state of one JournalProducer, and the ring entries of its pending span."""

    __slots__ = ("begin", "max_clock", "min_clock", "ring_start", "ring_stop")

    def __init__(self, min_clock: int, begin: int) -> None:
        self.min_clock = min_clock  # Exclusive: clocks up to here are delivered or acked.
        self.max_clock = min_clock  # Inclusive: largest clock of the pending span.
        self.begin = begin  # Offset to replay the pending span from, or -1.
        self.ring_start = -1  # First ring index of the span's linked entries, or -1.
        self.ring_stop = -1  # Last ring index of the span's linked entries, or -1.

    def reset(self, clock: int) -> None:
        """Forget any pending span; `clock` becomes the last acknowledged clock."""
        self.min_clock = self.max_clock = clock
        self.begin = self.ring_start = self.ring_stop = -1


@dataclass(slots=True)
class _Emit:
    """A committed sequence being dequeued."""

    jp: JournalProducer
    partial: _Partial
    tracked: bool  # False for a zero-clock envelope, which has no per-producer state.
    replay_required: ReplayRequired | None  # Set until the caller calls replay().
    replay_range: ReplayRequired | None = None
    replay: Iterator[SeqEnvelope] | None = None
    done: bool = False  # The committing envelope was returned: the next step() ends it.


class Sequencer:
    """Sequences read-uncommitted envelopes into read-committed ones. See the module docstring."""

    def __init__(self, ring_size: int, checkpoint: SequencerCheckpoint | None = None) -> None:
        if isinstance(ring_size, bool) or not isinstance(ring_size, int):
            raise ValueError(f"ring_size: must be an int (got {ring_size!r})")
        if not 1 <= ring_size <= RING_SIZE_MAX:
            raise ValueError(f"ring_size: must be in [1, {RING_SIZE_MAX}] (got {ring_size})")
        if checkpoint is None:
            checkpoint = SequencerCheckpoint()

        self._ring: list[SeqEnvelope | None] = [None] * ring_size
        # _next[i] links ring entry i to the next entry of the same span, or is -1.
        self._next: list[int] = [-1] * ring_size
        self._head = 0  # Next ring index to write.
        self._read_through: dict[str, int] = dict(checkpoint.read_through)
        self._partials: dict[JournalProducer, _Partial] = {}
        for jp, state in checkpoint.producers.items():
            # max_clock is not checkpointed: a restored pending span only needs its begin, and
            # any re-appended duplicate of it is filtered by clock when it is delivered.
            self._partials[jp] = _Partial(state.last_ack, state.begin)
        self._emit: _Emit | None = None
        self._dequeued: SeqEnvelope | None = None

    # -- queueing ------------------------------------------------------------------------------

    def queue_uncommitted(self, env: SeqEnvelope) -> QueueOutcome:
        """Apply the next envelope read from `env.journal`, and say what it did.

        If the outcome `commits`, the caller must `step()` until it returns False before
        queueing again (and first `replay()` if `replay_required` is set).
        """
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
        self._evict_at_head()
        self._dequeued = None

        jp = JournalProducer(env.journal, env.producer)
        if env.clock == 0:
            return self._commit_untracked(jp, env)

        partial = self._partials.get(jp)
        if partial is None:
            # First sight of this producer: everything before this clock is presumed seen.
            partial = _Partial(env.clock - 1, -1)
            self._partials[jp] = partial

        outcome = self._classify(env, partial)
        self._apply(outcome, jp, env, partial)
        return outcome

    def _classify(self, env: SeqEnvelope, partial: _Partial) -> QueueOutcome:
        """Decide the outcome of `env`, without changing any state."""
        clock = env.clock
        if env.flags == FLAG_CONTINUE_TXN:
            if clock <= partial.min_clock:
                return QueueOutcome.CONTINUE_ALREADY_ACKED
            if clock <= partial.max_clock:
                return QueueOutcome.CONTINUE_TXN_CLOCK_LARGER
            if partial.begin == -1:
                return QueueOutcome.CONTINUE_BEGIN_SPAN
            return QueueOutcome.CONTINUE_EXTEND_SPAN

        if env.flags == FLAG_ACK_TXN:
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
                return QueueOutcome.ACK_ROLLBACK
            if clock == partial.min_clock:
                # A re-sent ACK of the last delivered transaction: the producer restarted, and
                # whatever it began since is abandoned.
                return QueueOutcome.ACK_ROLLBACK
            if partial.begin == -1:
                return QueueOutcome.ACK_EMPTY
            if self._span_in_ring(env, partial):
                return QueueOutcome.ACK_COMMIT_RING
            return QueueOutcome.ACK_COMMIT_REPLAY

        if env.flags != FLAG_OUTSIDE_TXN:
            # Reserved flag bits may be used by newer producers; Gazette's readers fall back to
            # treating such messages as committed, and so do we.
            _log.error(
                "unexpected UUID flags; treating as OUTSIDE_TXN",
                journal=env.journal,
                producer=env.producer.hex(),
                flags=env.flags,
            )
        if clock <= partial.min_clock:
            return QueueOutcome.OUTSIDE_ALREADY_ACKED
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
        return QueueOutcome.OUTSIDE_COMMIT

    def _span_in_ring(self, ack: SeqEnvelope, partial: _Partial) -> bool:
        """True if the ring still holds the pending span from its beginning.

        Entries are evicted oldest first, so the span's first linked entry starting at the span's
        begin offset means no part of it was lost. With no linked entries, the ACK itself (about
        to be linked) must start at `begin`: that happens after a restart whose checkpoint was
        taken right before the ACK, with nothing of the span left to deliver but the ACK.
        """
        if partial.ring_start == -1:
            return partial.begin == ack.begin
        first = self._ring[partial.ring_start]
        _invariant(first is not None, "a linked ring entry is empty")
        assert first is not None  # For the type checker; checked just above.
        return partial.begin == first.begin

    def _apply(
        self, outcome: QueueOutcome, jp: JournalProducer, env: SeqEnvelope, partial: _Partial
    ) -> None:
        """Carry out `outcome`. A committing outcome defers the read-through offset to the end of
        dequeue, so that a checkpoint taken meanwhile re-reads the committing envelope."""
        if outcome in _IGNORED:
            self._read_through[env.journal] = env.end
        elif outcome in (QueueOutcome.CONTINUE_BEGIN_SPAN, QueueOutcome.CONTINUE_EXTEND_SPAN):
            if outcome is QueueOutcome.CONTINUE_BEGIN_SPAN:
                partial.begin = env.begin
            self._add_at_head(env, partial)
            partial.max_clock = env.clock
            self._read_through[env.journal] = env.end
        elif outcome is QueueOutcome.ACK_ROLLBACK:
            partial.reset(env.clock)
            self._read_through[env.journal] = env.end
        else:
            self._add_at_head(env, partial)
            if outcome is QueueOutcome.ACK_EMPTY:
                partial.begin = env.begin
            elif outcome is QueueOutcome.OUTSIDE_COMMIT:
                # The message commits alone; a pending span before it is dropped.
                partial.begin = env.begin
                partial.ring_start = partial.ring_stop
            # Commit through this clock only: pending messages with larger clocks roll back.
            partial.max_clock = env.clock
            replay = None
            if outcome is QueueOutcome.ACK_COMMIT_REPLAY:
                first = self._ring[partial.ring_start]
                assert first is not None  # The ACK was just linked.
                replay = ReplayRequired(env.journal, partial.begin, first.begin)
            self._emit = _Emit(jp, partial, tracked=True, replay_required=replay)

    def _commit_untracked(self, jp: JournalProducer, env: SeqEnvelope) -> QueueOutcome:
        """A zero clock means no usable UUID: deliver it, keeping no producer state for it."""
        partial = _Partial(0, env.begin)
        self._add_at_head(env, partial)
        self._emit = _Emit(jp, partial, tracked=False, replay_required=None)
        return QueueOutcome.OUTSIDE_COMMIT

    # -- dequeuing -----------------------------------------------------------------------------

    @property
    def replay_required(self) -> ReplayRequired | None:
        """The range the caller must `replay()` before `step()`, or None."""
        return None if self._emit is None else self._emit.replay_required

    def replay(self, envelopes: Iterable[SeqEnvelope]) -> None:
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
    def dequeued(self) -> SeqEnvelope | None:
        """The committed envelope the last `step()` returned True for, else None."""
        return self._dequeued

    def step(self) -> bool:
        """Advance to the next committed envelope (`dequeued`); False once none remain.

        The envelope becomes consumed as far as `checkpoint()` is concerned.
        """
        emit = self._emit
        if emit is None or emit.done:
            self._emit = None
            self._dequeued = None
            return False
        if emit.replay_required is not None:
            r = emit.replay_required
            raise SequencerStateError(
                f"step: replay() {r.journal} [{r.begin}, {r.end}) first, as replay_required asks"
            )
        env, final = self._next_committed(emit)
        partial = emit.partial
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
        return True

    def _next_committed(self, emit: _Emit) -> tuple[SeqEnvelope, bool]:
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
            if env.producer != emit.jp.producer or env.clock == 0:
                continue
            if partial.min_clock < env.clock <= partial.max_clock:
                return env, False

        # A span links each ring entry at most once, so a longer walk means corrupted links.
        for _ in range(len(self._ring)):
            index = partial.ring_start
            _invariant(index != -1, "ring ran out before the committing envelope")
            env_or_none = self._ring[index]
            _invariant(env_or_none is not None, "a linked ring entry is empty")
            assert env_or_none is not None  # For the type checker; checked just above.
            partial.ring_start = self._next[index]
            if partial.ring_start == -1:
                # The committing envelope was linked last, and commits regardless of the clock
                # filter: it was checked against min_clock when queued.
                return env_or_none, True
            # Skipped: larger clocks the ACK rolls back, and (after a replay) re-appended
            # duplicates of what the replay already delivered.
            if partial.min_clock < env_or_none.clock <= partial.max_clock:
                return env_or_none, False
        raise AssertionError("sequencer invariant violated: a span's ring links form a cycle")

    @staticmethod
    def _check_replayed(emit: _Emit, env: SeqEnvelope) -> None:
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

    def checkpoint(self, horizon_clock: int = 0) -> SequencerCheckpoint:
        """Snapshot read-through offsets and producer states, to construct a Sequencer from.

        Producers with no pending span whose last ACK is older than `horizon_clock` are pruned
        first (0 prunes nothing): their state would otherwise grow without bound. Should such a
        producer's duplicates be read later, they are delivered again, so the horizon must
        comfortably exceed how long a producer may go quiet.
        """
        if isinstance(horizon_clock, bool) or not isinstance(horizon_clock, int):
            raise ValueError(f"horizon_clock: must be an int (got {horizon_clock!r})")
        if not 0 <= horizon_clock <= CLOCK_MAX:
            raise ValueError(f"horizon_clock: must be in [0, {CLOCK_MAX}] (got {horizon_clock})")
        stale = [
            jp for jp, p in self._partials.items() if p.begin == -1 and p.min_clock < horizon_clock
        ]
        for jp in stale:
            del self._partials[jp]
        return SequencerCheckpoint(
            read_through=self._read_through,
            producers={
                jp: ProducerState(last_ack=p.min_clock, begin=p.begin)
                for jp, p in self._partials.items()
            },
        )

    def has_pending(self, since: Mapping[str, int]) -> bool:
        """True if a pending span began at or after the given per-journal offsets.

        Consumers pass the offsets of their previous checkpoint: a span begun since hints that
        its ACK is coming soon, and is worth waiting for before committing a transaction.
        """
        return any(
            p.begin != -1 and p.begin >= since.get(jp.journal, 0)
            for jp, p in self._partials.items()
        )

    # -- the ring ------------------------------------------------------------------------------

    def _evict_at_head(self) -> None:
        """Free the ring slot about to be written, unlinking it from a span that still uses it."""
        env = self._ring[self._head]
        if env is None:
            return
        partial = self._partials.get(JournalProducer(env.journal, env.producer))
        # Entries are evicted oldest first, so a span still linking this entry starts with it.
        if partial is not None and partial.ring_start == self._head:
            following = self._next[self._head]
            _invariant(
                (partial.ring_start == partial.ring_stop) == (following == -1),
                "a span's last linked entry must end its chain",
            )
            if following == -1:
                partial.ring_start = partial.ring_stop = -1
            else:
                partial.ring_start = following
        self._ring[self._head] = None
        self._next[self._head] = -1

    def _add_at_head(self, env: SeqEnvelope, partial: _Partial) -> None:
        """Write `env` at the head of the ring, linked at the end of `partial`'s span."""
        self._ring[self._head] = env
        self._next[self._head] = -1
        if partial.ring_stop == -1:
            partial.ring_start = self._head
        else:
            self._next[partial.ring_stop] = self._head
        partial.ring_stop = self._head
        self._head = (self._head + 1) % len(self._ring)


_IGNORED = frozenset(
    {
        QueueOutcome.OUTSIDE_ALREADY_ACKED,
        QueueOutcome.CONTINUE_ALREADY_ACKED,
        QueueOutcome.CONTINUE_TXN_CLOCK_LARGER,
    }
)
