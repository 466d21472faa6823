"""The Sequencer's general path: queue an envelope, classify it, apply the outcome (sans-IO).

`queue_uncommitted` (validating) and `queue_trusted` take one envelope; `_classify` decides its
`QueueOutcome` from the producer's `Partial` without changing anything, and `_apply` carries it
out (linking it into the ring, starting an emission, asking for a replay). Everything else in
the Sequencer is held to leave the state exactly as this path would.
"""

from __future__ import annotations

from typing import Final

import structlog

from gazette_consumer.sequencer.ring import Partial
from gazette_consumer.sequencer.state import (
    E,
    Emission,
    OffsetRegressionError,
    SequencerState,
    SequencerStateError,
)
from gazette_consumer.sequencer.types import (
    FLAG_ACK_TXN,
    FLAG_CONTINUE_TXN,
    FLAG_OUTSIDE_TXN,
    QueueOutcome,
    ReplayRequired,
    SeqEnvelope,
    check_envelope,
)

_log = structlog.get_logger(__name__)


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


class SequencerQueueing(SequencerState[E]):
    """Queueing, one envelope at a time: the general path (see the module docstring)."""

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
                # Most often a copy: an append batch holding several of this producer's
                # transactions was committed, its answer lost (its primary died), and the
                # client appended it again. Gazette lowers the bound to the older clock here
                # (for an upstream that restored an older checkpoint), which delivers the
                # copy's later transactions a second time. Producers never reuse clocks (a
                # restarted one has a new ProducerID, or clocks from the wall clock above its
                # last), so the bound is kept: the pending span is discarded (what the older
                # ACK says), nothing at or below the bound is delivered again (_apply). One
                # that does go back loses what it writes until its clock passes the bound:
                # counted and logged (older_acks.py), as a copy is, which looks the same.
                self._older_ack(env, partial)
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

    def _older_ack(self, env: E, partial: Partial) -> None:
        """Count and log (rate-limited) an ACK_TXN older than its producer's last ACK."""
        # Imported here, on the first one: the Sequencer's import pulls in no Prometheus client.
        from gazette_consumer.sequencer.older_acks import OncePer, note_older_ack

        if self._older_ack_log is None:
            self._older_ack_log = OncePer()
        note_older_ack(self._older_ack_log, env.journal, env.producer, env.clock, partial.min_clock)

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
            # An older ACK never lowers a known bound (_classify); a presumed one it may.
            partial.reset(
                env.clock
                if partial.presumed or env.clock > partial.min_clock
                else partial.min_clock
            )
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
            self._emit = Emission(env.producer, partial, replay)

    def _commit_untracked(self, env: E) -> QueueOutcome:
        """A zero clock means no usable UUID: deliver it, keeping no producer state for it."""
        partial = Partial(0, env.begin)
        self._ring.add_at_head(env, partial)
        self._emit = Emission(env.producer, partial, None, tracked=False)
        return _OUTSIDE_COMMIT
