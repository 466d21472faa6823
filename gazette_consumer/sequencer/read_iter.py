"""ReadCommittedIter: the committed messages of several journals, each exactly once.

    it = ReadCommittedIter(
        client,                       # broker.client.JournalClient
        {"a/one": 0, "a/two": 0},     # sources: journal -> offset (or (journal, offset) pairs)
        message_type=MyMessage,       # a class, or a function of the JournalSpec returning one
        ring_size=8192,               # Sequencer ring entries
        checkpoint=None,              # SequencerCheckpoint to resume from
        read_channel_size=16,         # chunks read ahead, across all journals
    )
    try:
        while True:                   # one consumer transaction per turn
            env = await it.next()     # Envelope of a committed message
            ...
            # Drain what is ready without awaiting; never stop inside one ACK's messages.
            while (env := it.try_next()) is not None or it.in_sequence:
                env = env or await it.next()
                ...
            checkpoint = it.checkpoint()
    finally:
        await it.close()

Signature::

    ReadCommittedIter(client: JournalClient,
                      sources: Mapping[str, int] | Sequence[tuple[str, int]],
                      *, message_type: type | Callable[[JournalSpec], type],
                      ring_size: int = RING_SIZE_DEFAULT,
                      checkpoint: SequencerCheckpoint | None = None,
                      read_channel_size: int = READ_CHANNEL_SIZE_DEFAULT,
                      framing: Framing | None = None,
                      registry: StoreRegistry | None = None,
                      message_bytes_max: int = MESSAGE_BYTES_MAX_DEFAULT,
                      on_idle: Callable[[], None] | None = None,
                      replay_retained_bytes_max: int = REPLAY_RETAINED_BYTES_MAX_DEFAULT,
                      replay_decoded_messages_max: int = REPLAY_DECODED_MESSAGES_MAX_DEFAULT,
                      verify_journal: Verify | None = None)
    async next() -> Envelope        try_next() -> Envelope | None      __aiter__
    checkpoint(horizon=0) -> SequencerCheckpoint                has_pending(since) -> bool
    fingerprint(journal, offset) -> bytes | None
    in_sequence: bool               take_sequence(limit) -> list[Envelope]
    replays: int    replays_from_memory: int    replays_from_decoded: int
    sources: Mapping[str, int]
    async close()                   (also an async context manager)

One background reader per source journal reads ahead (read_ahead.py); the caller's task
decodes the chunks a piece at a time (read_pieces.py), feeds the envelopes to a `Sequencer` and
returns what it dequeues: committed messages in per-producer order, each once, without
head-of-line blocking between producers. ACKs are consumed, never returned; messages without a
UUID are returned as read (at-least-once). A span that left the ring is replayed (replay.py,
replays.py). How it stays fast (runs committed at once, pieces, replays from memory) is in
docs/design/read-committed.md.

`checkpoint()` is consistent with what was *returned*: per source journal the offset from which
reading resumes (past every returned message, consumed ACK and skipped unreadable content), and
the Sequencer's producer states. A new iterator built from it (same sources) returns exactly
the messages this one had not returned yet. To keep the messages of one ACK in one consumer
transaction, close a transaction only after a message for which `in_sequence` was False (and
see `has_pending` for whether waiting a little longer for an ACK is worthwhile).

`on_idle`, if given, is called (synchronously) whenever `next()` is about to wait because
everything read so far was consumed: content that delivers nothing (a duplicate, an ACK, a
rolled-back or still pending transaction) moves `checkpoint()` without a message being
returned, and a consumer learns of that progress this way.

Errors: a reader that fails (a journal that does not exist or has no known content type, a
non-retriable read error, a message that does not decode: `MessageDecodeError` naming journal
and offsets) fails `next()`/`try_next()` with its error, once the messages read before it were
returned, and every call after. Unreadable content is skipped and logged. `verify_journal`, if
given, is each read-ahead reader's RetryReader `verify` (awaited with a journal's name and the
etcd revision of the answer it checks): what it raises fails the iterator the same way (a shard checks there
that the journal was not created again: gazette_consumer/source_revisions.py).

Cancellation: `next()` may be cancelled at any await without losing a message: a message leaves
the iterator only when returned. One task reads the iterator at a time; after `close()`, calls
raise `ReadIterClosedError` (a `next()` waiting in another task too, and `checkpoint()`: take
the checkpoint before closing) and iteration ends.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from itertools import chain, islice
from operator import length_hint
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from broker.client.retry_reader import Verify
from broker.client.route_cache import JournalClient
from broker.protocol.validate import ValidationError
from gazette_consumer.message.framing import MESSAGE_BYTES_MAX_DEFAULT, Framing
from gazette_consumer.message.message import Envelope
from gazette_consumer.sequencer.decode import MessageTypeSource
from gazette_consumer.sequencer.decoded import REPLAY_DECODED_MESSAGES_MAX_DEFAULT
from gazette_consumer.sequencer.read_ahead import Chunk, ReadAhead, source_offsets
from gazette_consumer.sequencer.read_channel import ReadChannel
from gazette_consumer.sequencer.read_checkpoint import checkpoint_of
from gazette_consumer.sequencer.read_pieces import ChunkPieces
from gazette_consumer.sequencer.read_runs import (
    REPLAY_RUN_MIN,
    SPAN_RUN_LOOK_MAX,
    alone_next,
    run_next,
)
from gazette_consumer.sequencer.read_tails import ReadTails
from gazette_consumer.sequencer.read_uncommitted import ReadUncommittedIter
from gazette_consumer.sequencer.replay import Replay
from gazette_consumer.sequencer.replays import Replays
from gazette_consumer.sequencer.retained import REPLAY_RETAINED_BYTES_MAX_DEFAULT
from gazette_consumer.sequencer.sequencer import Sequencer
from gazette_consumer.sequencer.types import (
    FLAG_ACK_TXN,
    FLAG_CONTINUE_TXN,
    SequencerCheckpoint,
)

if TYPE_CHECKING:
    from broker.fragment.stores.registry import StoreRegistry

__all__ = [
    "READ_CHANNEL_SIZE_DEFAULT",
    "READ_CHANNEL_SIZE_MAX",
    "RING_SIZE_DEFAULT",
    "ReadCommittedIter",
    "ReadIterClosedError",
    "ReadUncommittedIter",
]

RING_SIZE_DEFAULT: Final = 8192
"""Sequencer ring entries: spans committed within this many messages need no replay."""
READ_CHANNEL_SIZE_DEFAULT: Final = 16
"""Chunks (a Read chunk is at most 128 KiB) read ahead of the caller, across all source journals,
held undecoded: with the ring and DECODE_PIECE_BYTES, what bounds the iterator's memory."""
READ_CHANNEL_SIZE_MAX: Final = 4096
_NO_RUN: Final[list[Any]] = []  # Never appended to: `_run_all` when no run is held.
_NEVER: Final = object()  # Never returned by `_next_at_hand`: its callable iterator never ends.


class ReadIterClosedError(RuntimeError):
    """The iterator was closed."""


class ReadCommittedIter:
    """Read-committed Envelopes of several journals. See the module docstring."""

    try_next: Callable[[], Envelope[Any] | None]
    """The next committed message if one is at hand without waiting, else None.

    An attribute, not a method: while a run of messages that each commit alone is held, a
    callable made in C (`_hold_alone`) that returns them without a Python frame (the per-message
    cost of a reader's loop), then calls `_next_at_hand`; else `_next_at_hand` itself. A caller
    may keep whichever it read, across runs: each returns what the other would."""

    def __init__(
        self,
        client: JournalClient,
        sources: Mapping[str, int] | Sequence[tuple[str, int]],
        *,
        message_type: MessageTypeSource,
        ring_size: int = RING_SIZE_DEFAULT,
        checkpoint: SequencerCheckpoint | None = None,
        read_channel_size: int = READ_CHANNEL_SIZE_DEFAULT,
        framing: Framing | None = None,
        registry: StoreRegistry | None = None,
        message_bytes_max: int = MESSAGE_BYTES_MAX_DEFAULT,
        on_idle: Callable[[], None] | None = None,
        replay_retained_bytes_max: int = REPLAY_RETAINED_BYTES_MAX_DEFAULT,
        replay_decoded_messages_max: int = REPLAY_DECODED_MESSAGES_MAX_DEFAULT,
        verify_journal: Verify | None = None,
    ) -> None:
        if isinstance(read_channel_size, bool) or not isinstance(read_channel_size, int):
            raise ValidationError(
                f"must be an int (got {read_channel_size!r})", "read_channel_size"
            )
        if not 1 <= read_channel_size <= READ_CHANNEL_SIZE_MAX:
            raise ValidationError(
                f"must be in [1, {READ_CHANNEL_SIZE_MAX}] (got {read_channel_size})",
                "read_channel_size",
            )
        self._offsets = source_offsets(sources, checkpoint)
        # Decoded Envelopes are queued as they are: they have what the Sequencer reads.
        self._seq: Sequencer[Envelope[Any]] = Sequencer(ring_size, checkpoint)
        self._commit_alone = self._seq.commit_alone  # Bound once: called per message.
        self._channel: ReadChannel[Chunk] = ReadChannel(read_channel_size)
        self._read_ahead = ReadAhead(
            client,
            self._offsets,
            self._channel,
            message_type=message_type,
            framing=framing,
            registry=registry,
            message_bytes_max=message_bytes_max,
            verify_journal=verify_journal,
        )
        # Per journal: offset through which every queued envelope was consumed (with content
        # skipped in between). Checkpoints take the larger of it and the Sequencer's offset.
        self._floors = dict(self._offsets)
        self._pending: deque[Envelope[Any]] = deque()  # Of the piece being consumed.
        self._replay: Replay | None = None
        # Where replays read from: the content kept for them, or the broker.
        self._replays = Replays(
            self._read_ahead, replay_retained_bytes_max, replay_decoded_messages_max
        )
        # The chunks read ahead, decoded a piece at a time once `_pending` is consumed.
        self._tails = ReadTails()
        self._pieces = ChunkPieces(
            self._channel, self._replays, self._seq, self._floors, self._tails
        )
        # A committed message stepped out of the Sequencer but not returned yet: looking one
        # message ahead is what tells `in_sequence`. `_ahead_after` is the returned message it
        # follows in its sequence, for checkpoints taken while it is held (None only while
        # `_ahead` is about to be returned within `try_next`).
        self._ahead: Envelope[Any] | None = None
        self._ahead_after: Envelope[Any] | None = None
        # A run of messages the Sequencer committed at once (`commit_alone_run`): `_run_all`
        # in journal order, and `_run` its messages not returned yet, in reverse (returned by
        # `pop()`, the cheapest step per message); checkpoints stand where the last returned
        # one left them.
        self._run_all: list[Envelope[Any]] = _NO_RUN
        self._run: list[Envelope[Any]] = []
        # A run of messages that each commit alone (`_span_through` None) is held instead as an
        # iterator over `_run_all` (past its first), which `try_next` reads in C; None if not
        # held or once found exhausted.
        self._alone: Iterator[Envelope[Any]] | None = None
        # For such a run of several producers' messages: each one's last ACK before it (see
        # `Sequencer.commit_alone_mixed`), for checkpoints within it; else None.
        self._run_before: dict[tuple[str, bytes], int | None] | None = None
        # Bound once (calling `_next_at_hand` through an attribute would bind it per call), and
        # what `try_next` is when no such run is held. `_after_alone` calls it per `next()` and
        # never ends: what `try_next` goes on to in C once the run it hands out is exhausted.
        self._at_hand = self._next_at_hand
        self._after_alone = iter(self._at_hand, _NEVER)
        self.try_next = self._at_hand
        # Set if the run is one ACK's messages (`_take_span`): the offset of their journal the
        # Sequencer had read through before the ACK, where checkpoints taken within the run
        # stand. None for a run of messages that each commit alone.
        self._span_through: int | None = None
        # Whether to look for a whole transaction in what is decoded (`commit_span_run`): not
        # after one taken from the ring was longer than the look (SPAN_RUN_LOOK_MAX).
        self._span_runs = True
        self._closed = False
        self._on_idle = on_idle
        self.in_sequence = False
        """True if more messages committed by the same ACK as the one just returned follow; they
        come next (from `try_next()`, or `next()` if they must be replayed). A consumer
        transaction should not close in between, so that one ACK's messages commit together.
        An attribute, not a property: a transaction loop reads it per message. It is
        `_ahead is not None or (_span_through is not None and bool(_run))`, set wherever
        `try_next` changes those (`_sequence_state`)."""

    @property
    def replays(self) -> int:
        """Committed spans replayed from their journal because they had left the ring."""
        return self._replays.count

    @property
    def replays_from_memory(self) -> int:
        """Of `replays`, those served from the content kept (`replay_retained_bytes_max`)."""
        return self._replays.from_memory

    @property
    def replays_from_decoded(self) -> int:
        """Of `replays_from_memory`, those handed messages kept decoded (decoded.py)."""
        return self._replays.from_decoded

    @property
    def sources(self) -> Mapping[str, int]:
        """The offset each source journal was (or will be) read from."""
        return dict(self._offsets)

    # -- reading -------------------------------------------------------------------------------

    async def next(self) -> Envelope[Any]:
        """The next committed message, waiting for one as long as it takes."""
        while True:
            env = self.try_next()
            if env is not None:
                return env
            replay, wanted = self._replay, self._replay_wanted()
            if replay is None or not wanted:
                if self._on_idle is not None:
                    # Everything read so far is consumed, perhaps without a message to return
                    # (duplicates, ACKs, rolled-back or pending transactions): `checkpoint()`
                    # may have moved, and a consumer reports that progress.
                    self._on_idle()
                await self._channel.wait()
                continue
            try:
                await replay.fill(wanted)
            except asyncio.CancelledError:
                # close() from another task cancels the replay's RPC under us; a cancellation
                # of this task itself is propagated as is.
                task = asyncio.current_task()
                if self._closed and task is not None and not task.cancelling():
                    raise ReadIterClosedError("the iterator was closed") from None
                raise
            except Exception as err:
                if self._closed:
                    raise ReadIterClosedError("the iterator was closed") from err
                raise

    def _next_at_hand(self) -> Envelope[Any] | None:
        """What `try_next` returns, in Python: the next committed message if one is at hand
        without waiting, else None."""
        alone = self._alone
        if alone is not None:
            # Called by a `try_next` read before the run was held, or once the run is
            # exhausted (by `_after_alone`): `try_next` is the Python path again from now on.
            env = next(alone, None)
            if env is not None:
                return env
            self._alone = None
            self.try_next = self._at_hand
        run = self._run
        if run:
            # A message of one ACK's run, committed at once (nothing held once closed; runs of
            # messages that each commit alone are `_alone`'s). `in_sequence` holds until the
            # run's last is returned.
            popped = run.pop()
            if not run:
                self.in_sequence = self._ahead is not None
            return popped
        if self._closed:
            raise ReadIterClosedError("the iterator was closed")
        env = self._ahead
        if env is None:
            # The fast path: the next read message commits by itself (an OUTSIDE_TXN message,
            # or one without a UUID), with no sequence in progress: nothing to look past.
            pending = self._pending
            if pending:
                if not alone_next(pending) and self._commit_alone(pending[0]):
                    return pending.popleft()
            elif self._replay is None and not self._seq.emitting and self._read_ahead.started:
                # Nothing held anywhere: the next piece, and its leading run at once if it
                # starts with one (the common case, once per piece), without the general
                # stepping below; what `_step_to_message` would do, in fewer steps.
                self._run_all = _NO_RUN  # Returned: not kept alive here (see read_pieces.py).
                envs = self._pieces.next()
                if envs is None:
                    return None
                length = self._seq.commit_alone_run(envs, self._pieces.lead_run)
                if length:
                    if length < len(envs):
                        pending.extend(islice(envs, length, None))
                        del envs[length:]
                    self._hold_alone(envs)
                    return envs[0]
                pending.extend(envs)
            self._read_ahead.start()
            if not self._step_to_message():
                return None
            env = self._ahead
            assert env is not None  # Held by _step_to_message.
        elif self._replay is not None and self._replay_wanted():
            return None  # Looking past the held message needs a replay read: next() does it.
        # Step past `env` within its sequence: to the next message committed by the same ACK
        # (held in `_ahead`, making `in_sequence` True), or to the sequence's end (consuming its
        # ACK). Never needs a read: the replay, if any, was checked to hold one more envelope.
        self._ahead = None
        seq, replay = self._seq, self._replay
        if replay is not None and replay.held > REPLAY_RUN_MIN:
            # A replay's messages after `env`, taken at once as a run returned after it (all
            # the replay holds but one, which the look past the run's last takes below).
            if envs := seq.dequeue_replayed(replay.held - 1):
                self._run_all, self._run = [env, *envs], envs[::-1]
                self._run_before = None
                self._span_through = seq.read_through(replay.required.journal)
        dequeue = seq.dequeue
        while (after := dequeue()) is not None:  # At most past the ACK, which ends it.
            if after.flags != FLAG_ACK_TXN:
                # Stepping a message within a sequence moves its producer's state past it; a
                # checkpoint taken while it is held must stand where `env` left it (or, behind
                # a run of a replay's messages, where the run's last will).
                self._ahead, self._ahead_after = after, self._run_all[-1] if self._run else env
                self.in_sequence = True
                return env
        self._replay = None
        self.in_sequence = self._sequence_state()
        return env

    def take_sequence(self, limit: int) -> list[Envelope[Any]]:
        """The next messages `try_next` would return, at most `limit`, taken at once: only
        those of one upstream ACK's run that more of the same sequence follows (`in_sequence`
        stays True after each, and after the last taken), none otherwise. What spares the
        transaction loop a `try_next`, a clock read and an `in_sequence` read per message inside
        a long ACK's messages, where no transaction may close (txn_driver.py). The run's last
        is left to `try_next`, which tells where the sequence ends."""
        run = self._run
        count = min(limit, len(run) - 1)
        if count <= 0 or self._span_through is None or not self.in_sequence:
            return []
        taken = run[: -count - 1 : -1]
        del run[-count:]
        return taken

    def _sequence_state(self) -> bool:
        """What `in_sequence` is, from the state it summarises. (`try_next` sets it only where
        that state changes: its other returns, a message committed alone, the first of a run
        of such messages, or no message, leave that state as they found it.)"""
        return self._ahead is not None or (self._span_through is not None and bool(self._run))

    def _replay_wanted(self) -> int:
        """How many replayed envelopes must be read before stepping on (0: none). Stepping to a
        message and looking past it takes two; looking past a held message, one."""
        replay = self._replay
        if replay is None:
            return 0
        wanted = 1 if self._ahead is not None else 2
        return 0 if replay.fill_nowait(wanted) else wanted

    def _step_to_message(self) -> bool:
        """Step the Sequencer to its next committed message (held in `_ahead`), queueing read
        envelopes as needed. False if none is at hand without waiting."""
        seq = self._seq
        while True:
            if self._replay_wanted():
                return False
            env = seq.dequeue()
            if env is not None:
                if env.flags == FLAG_ACK_TXN:
                    continue  # Consumed by the Sequencer; its offset counts as read.
                # Returned at once, with a look-ahead (in try_next) that needs no read (see
                # _replay_wanted).
                self._ahead, self._ahead_after = env, None
                return True
            self._replay = None  # Whatever was dequeued is done, any replay with it.
            self._run_all = _NO_RUN  # Returned: not kept alive here (see read_pieces.py).
            pending = self._pending
            if pending:
                # A run further into a piece (after another producer's messages or a
                # transaction): committed at once, as a piece's leading run is.
                if run_next(pending) and (run := seq.commit_alone_run(pending)):
                    return self._hold_run([pending.popleft() for _ in range(run)], None)
                if alone_next(pending):
                    # Producers alternating: their run committed in one pass all the same.
                    before: dict[tuple[str, bytes], int | None] = {}
                    if (run := seq.commit_alone_mixed(pending, before)) > 1:
                        return self._hold_run([pending.popleft() for _ in range(run)], None, before)
                    if run:
                        self._ahead, self._ahead_after = pending.popleft(), None
                        return True
                if seq.commit_alone(pending[0]):
                    env = pending.popleft()
                    self._ahead, self._ahead_after = env, None  # Nothing to look past.
                    return True
                if (
                    self._span_runs
                    and pending[0].flags == FLAG_CONTINUE_TXN
                    and (n := seq.commit_span_run(pending, SPAN_RUN_LOOK_MAX))
                ):
                    # A whole transaction, its ACK included, committed at once: returned as
                    # `_take_span` returns one taken from the ring.
                    taken = [pending.popleft() for _ in range(n)]
                    taken.pop()  # The ACK: consumed, never returned.
                    return self._hold_run(taken, taken[-1].end)  # Read to the ACK.
                committing = seq.queue_span(pending)
                if committing is not None:
                    if seq.replay_required is not None:
                        self._start_replay(committing)
                    elif self._take_span(committing):
                        return True
                continue
            envs = self._pieces.next()
            if envs is None:
                return False
            # Commit the piece's leading run of one producer's OUTSIDE_TXN messages at once
            # (the decoder measured it), returning the first now and the rest from `_run`; the
            # rest go one by one.
            run = seq.commit_alone_run(envs, self._pieces.lead_run)
            if run:
                if run < len(envs):
                    pending.extend(islice(envs, run, None))
                    del envs[run:]
                return self._hold_run(envs, None)
            pending.extend(envs)

    def _take_span(self, committing: Envelope[Any]) -> bool:
        """Take at once what `committing` (just queued) commits, as the ring holds it all: a
        run to return one by one, its first held in `_ahead`. False if it commits no message
        (an ACK of nothing left to deliver)."""
        seq = self._seq
        through = seq.read_through(committing.journal)
        envs = seq.dequeue_all()
        if envs and envs[-1].flags == FLAG_ACK_TXN:
            envs.pop()  # Consumed, never returned.
        if not envs:
            return False
        # Look for whole transactions in what is decoded only while they are short.
        self._span_runs = len(envs) <= SPAN_RUN_LOOK_MAX
        # A message committing alone (after its producer's pending span was dropped) is a run
        # of its own.
        return self._hold_run(envs, through if committing.flags == FLAG_ACK_TXN else None)

    def _hold_run(
        self,
        envs: list[Envelope[Any]],
        span_through: int | None,
        before: dict[tuple[str, bytes], int | None] | None = None,
    ) -> bool:
        """Hold `envs`, committed at once, to return one by one: the first in `_ahead` (with
        nothing to look past), the rest from `_run`. `span_through`: for one ACK's messages,
        the offset of their journal read up to the ACK, where checkpoints within the run stand
        (`in_sequence` holds until the last; see `checkpoint`); None for messages that each
        commit alone (`before`: of several producers, see `_run_before`)."""
        if span_through is None:
            self._hold_alone(envs, before)
        else:
            self._run_all, self._run = envs, envs[:0:-1]
            self._span_through = span_through
            self._run_before = None
        self._ahead, self._ahead_after = envs[0], None
        return True

    def _hold_alone(
        self,
        envs: list[Envelope[Any]],
        before: dict[tuple[str, bytes], int | None] | None = None,
    ) -> None:
        """Hold `envs`, messages that each commit alone (committed at once), whose first the
        caller returns: the rest are handed out by `try_next` made a C callable over them
        (the `__next__` of a `chain` of their iterator and `_after_alone`, which never ends),
        ~300 instructions a message fewer than a Python call (cachegrind, bench_messages.py's
        read loop). Nothing else is kept per message: `in_sequence`
        stays False through such a run (nothing is held ahead of it, no ACK's messages are in
        it), and checkpoints count what the iterator has not handed out (`length_hint`)."""
        self._run_all = envs
        self._span_through = None
        self._run_before = before
        if len(envs) > 1:
            alone = iter(envs)
            next(alone)  # The caller's.
            self._alone = alone
            self.try_next = chain(alone, self._after_alone).__next__

    def _start_replay(self, env: Envelope[Any]) -> None:
        """Serve the replay the Sequencer asks for, to commit the span `env` (an ACK) ends."""
        self._replay = self._replays.start(self._seq, env)

    def __aiter__(self) -> AsyncIterator[Envelope[Any]]:
        return self

    async def __anext__(self) -> Envelope[Any]:
        if self._closed:
            raise StopAsyncIteration
        return await self.next()

    # -- checkpoints ---------------------------------------------------------------------------

    def checkpoint(self, horizon: int = 0) -> SequencerCheckpoint:
        """Offsets read through and producer states, consistent with the messages returned so
        far. `horizon` prunes idle producers (see `Sequencer.checkpoint`). Raises
        ReadIterClosedError after `close()`, which drops what was read but not returned: a
        checkpoint then would be past messages the caller never saw."""
        if self._closed:
            raise ReadIterClosedError(
                "checkpoint() after close(): the iterator dropped the messages it held"
                " undelivered, so a checkpoint now would skip them; take it before closing"
            )
        return checkpoint_of(
            self._seq,
            self._floors,
            self._run_all,
            self._run_left(),
            self._span_through,
            self._ahead,
            self._ahead_after,
            horizon,
            self._run_before,
        )

    def seed_tail(self, journal: str, offset: int, content: bytes) -> None:
        """`content` is `journal`'s bytes at `offset`, just below where this iterator resumes
        reading it: held for `fingerprint` (read_tails.py). Call before the first `next()`."""
        self._tails.seed(journal, offset, content)

    def fingerprint(self, journal: str, offset: int) -> bytes | None:
        """The digest of the bytes this iterator consumed just below `offset` of `journal`
        (read_tails.py), or None if it does not hold them all."""
        return self._tails.fingerprint(journal, offset)

    def _run_left(self) -> int:
        """How many messages of the run held (`_run_all`) are not returned yet."""
        alone = self._alone
        return len(self._run) if alone is None else length_hint(alone)

    def has_pending(self, since: Mapping[str, int]) -> bool:
        """True if a transaction begun at or after the `since` offsets awaits its ACK (a reason
        for a consumer to wait a little before committing). See `Sequencer.has_pending`. (A
        transaction whose committed messages are still being returned counts as delivered:
        `in_sequence` holds the consumer's transaction open meanwhile.)"""
        return self._seq.has_pending(since)

    async def close(self) -> None:
        """Stop the readers (awaiting them) and any replay. Idempotent. A `next()` waiting in
        another task raises `ReadIterClosedError`."""
        self._closed = True
        self._run_all, self._run = _NO_RUN, []
        alone, self._alone = self._alone, None
        if alone is not None:
            deque(alone, maxlen=0)  # Exhausted: a `try_next` kept by a caller hands out no more.
        self.try_next = self._at_hand
        self.in_sequence = self._sequence_state()
        self._replays.clear()
        self._channel.wake()
        await self._read_ahead.stop()
        replay, self._replay = self._replay, None
        if replay is not None:
            await replay.close()

    async def __aenter__(self) -> ReadCommittedIter:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
