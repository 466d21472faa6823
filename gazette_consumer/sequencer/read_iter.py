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
                      replay_decoded_messages_max: int = REPLAY_DECODED_MESSAGES_MAX_DEFAULT)
    async next() -> Envelope        try_next() -> Envelope | None      __aiter__
    checkpoint(horizon_clock=0) -> SequencerCheckpoint                has_pending(since) -> bool
    in_sequence: bool               replays: int    replays_from_memory: int
    replays_from_decoded: int
    sources: Mapping[str, int]
    async close()                   (also an async context manager)

One background reader per source journal (a blocking `RetryReader`, all in one TaskGroup
owned by the iterator: read_ahead.py) queues the chunks it reads, at most `read_channel_size` chunks ahead in
all. The caller's task decodes each chunk as it takes it (a piece of it at a time, see
`decode.py`), feeds its envelopes to a `Sequencer` and returns what it dequeues: committed
messages in per-producer order, without head-of-line blocking between producers. ACK messages
are consumed, never returned. Messages without a UUID are returned as they are read
(at-least-once). When an ACK commits a span that left the ring, the span is replayed from its
journal by a separate bounded read (`replay.py`); or, if the iterator still holds the range's
chunks (it keeps each journal's from its earliest pending span on, at most
`replay_retained_bytes_max` bytes of them: `retained.py`), decoded again from memory.
Such a span links nothing in the ring (`Sequencer.unlinked_span_clock`), so where a decoded
piece continues it (a piece after one that ended inside it), the messages at the piece's front
that do are decoded for their UUIDs only and counted (`ChunkDecoder.feed_continuing`,
`Sequencer.skip_continuation`): each message of a long transaction is decoded whole once, by
its replay. (A message so counted that does not decode whole is reported by the replay, or
never if its transaction rolls back.) Or, within `replay_decoded_messages_max` (decoded.py),
they are decoded whole and kept, and the replay hands them over as they are.

Chunks wait in the channel as bytes and are decoded only when their messages are needed (see
DECODE_PIECE_BYTES), so that decoded messages live from their decoding to their return, not
through the read-ahead too: objects that live long are what make Python's garbage collector
scan the whole heap, and a reader allocates several per message. A run of one producer's
OUTSIDE_TXN messages with rising clocks is committed at once (`Sequencer.commit_alone_run`)
and returned one by one: at the front of a decoded piece the decoder measured the run while
building its envelopes (`ChunkDecoder.lead_run`); further in, wherever two such messages of one
producer come next. Any other OUTSIDE_TXN message (or one without a UUID) goes through the
Sequencer's `commit_alone` fast path; a transaction's messages are queued a span at a time
(`queue_span`), and when its ACK commits them from the ring they are taken at once too
(`Sequencer.dequeue_all`) and returned one by one, `in_sequence` until the last; a whole
transaction in what was decoded (its messages, then its ACK) is committed at once without the
ring (`Sequencer.commit_span_run`) and returned the same way.

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
returned, and every call after. Unreadable content is skipped and logged.

To know `in_sequence`, the iterator steps the Sequencer one message past the one it returns,
within that message's sequence; `checkpoint()` accounts for the message held back.

Cancellation: `next()` may be cancelled at any await without losing a message: a message leaves
the iterator only when returned. One task reads the iterator at a time; after `close()`, calls
raise `ReadIterClosedError` (a `next()` waiting in another task too) and iteration ends.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from itertools import islice
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from broker.client.route_cache import JournalClient
from broker.protocol.validate import ValidationError
from gazette_consumer.message.framing import MESSAGE_BYTES_MAX_DEFAULT, Framing
from gazette_consumer.message.message import Envelope
from gazette_consumer.sequencer.decode import MessageTypeSource
from gazette_consumer.sequencer.decoded import REPLAY_DECODED_MESSAGES_MAX_DEFAULT
from gazette_consumer.sequencer.read_ahead import Chunk, ReadAhead, source_offsets
from gazette_consumer.sequencer.read_channel import ReadChannel
from gazette_consumer.sequencer.read_uncommitted import ReadUncommittedIter
from gazette_consumer.sequencer.replay import Replay
from gazette_consumer.sequencer.replays import Replays
from gazette_consumer.sequencer.retained import REPLAY_RETAINED_BYTES_MAX_DEFAULT
from gazette_consumer.sequencer.sequencer import Sequencer
from gazette_consumer.sequencer.types import (
    FLAG_ACK_TXN,
    FLAG_CONTINUE_TXN,
    FLAG_OUTSIDE_TXN,
    JournalProducer,
    ProducerState,
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
DECODE_PIECE_BYTES: Final = 16 << 10
"""A chunk is decoded this much at a time, as its messages are needed: the messages decoded and
not yet returned are then a few dozen, not a chunk's worth. Decoding makes several objects per
message for the garbage collector to track; kept this few, they are freed before a collection
sees them (every 700 net allocations), where a whole chunk's would be promoted into the old
generation and soon cost a scan of the whole heap. Measured: read-committed 50% faster."""


SPAN_RUN_LOOK_MAX: Final = 32
"""Messages of a transaction looked at for its ACK, to commit it at once (`commit_span_run`)
before linking it into the ring: a longer one most often continues in the next piece, and the
look would be wasted; through the ring it costs a little more per transaction. The iterator
stops looking after a longer transaction, until a shorter one comes through the ring."""

REPLAY_RUN_MIN: Final = 2
"""Replayed messages held beyond which they are taken as a run (`Sequencer.dequeue_replayed`)
rather than stepped one by one."""

_NO_RUN: Final[list[Any]] = []  # Never appended to: `_run_all` when no run is held.


def _run_next(pending: deque[Envelope[Any]]) -> bool:
    """True if the next two pending messages may begin a run (`Sequencer.commit_alone_run`):
    OUTSIDE_TXN messages of one producer. Checked before committing the first alone, so that
    a run later in a piece is not taken one message at a time: a cheap test, where trying the
    run costs more than `commit_alone` when the producers alternate message by message."""
    if len(pending) < 2:
        return False
    first, second = pending[0], pending[1]
    return bool(
        first.flags == FLAG_OUTSIDE_TXN
        and first.clock  # Without a UUID: commit_alone's, never a run's.
        and second.flags == FLAG_OUTSIDE_TXN
        and first.producer == second.producer
    )


class ReadIterClosedError(RuntimeError):
    """The iterator was closed."""


class ReadCommittedIter:
    """Read-committed Envelopes of several journals. See the module docstring."""

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
        )
        # Per journal: offset through which every queued envelope was consumed (with content
        # skipped in between). Checkpoints take the larger of it and the Sequencer's offset.
        self._floors = dict(self._offsets)
        self._pending: deque[Envelope[Any]] = deque()  # Of the chunk being consumed.
        # The journal of the chunk being consumed, and the offset reading resumes from once
        # `_pending` is consumed (past content skipped after its last envelope).
        self._chunk_through: tuple[str, int] | None = None
        # A message of a consumed chunk did not decode: raised once `_pending` is consumed.
        self._decode_error: Exception | None = None
        self._chunk: Chunk | None = None  # Taken from the channel, not wholly decoded yet.
        self._chunk_lead_run: int | None = None  # Of the piece decoded last (_decode_piece).
        self._replay: Replay | None = None
        # Per journal, the producer of the CONTINUE_TXN message that ended its last decoded
        # piece: the next piece may continue its transaction (see `_decode_piece`).
        self._continuing: dict[str, bytes] = {}
        # Where replays read from: the content kept for them, or the broker.
        self._replays = Replays(
            self._read_ahead, replay_retained_bytes_max, replay_decoded_messages_max
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

    def try_next(self) -> Envelope[Any] | None:
        """The next committed message if one is at hand without waiting, else None."""
        run = self._run
        if run:
            # The fastest path: a message of a run committed at once (nothing held once
            # closed). `in_sequence` holds until the run's last is returned.
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
                if not _run_next(pending) and self._commit_alone(pending[0]):
                    return pending.popleft()
            elif self._replay is None and not self._seq.emitting and self._read_ahead.started:
                # Nothing held anywhere: the next piece, and its leading run at once if it
                # starts with one (the common case, once per piece), without the general
                # stepping below; what `_step_to_message` would do, in fewer steps.
                self._run_all = _NO_RUN  # Returned: not kept alive here (see DECODE_PIECE_BYTES).
                envs = self._decode_piece()
                if envs is None:
                    return None
                length = self._seq.commit_alone_run(envs, self._chunk_lead_run)
                if length:
                    if length < len(envs):
                        pending.extend(islice(envs, length, None))
                        del envs[length:]
                    self._run_all, self._run = envs, envs[:0:-1]
                    self._span_through = None
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
            self._run_all = _NO_RUN  # Returned: not kept alive here (see DECODE_PIECE_BYTES).
            pending = self._pending
            if pending:
                # A run further into a piece (after another producer's messages or a
                # transaction): committed at once, as a piece's leading run is.
                if _run_next(pending) and (run := seq.commit_alone_run(pending)):
                    return self._hold_run([pending.popleft() for _ in range(run)], None)
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
            envs = self._decode_piece()
            if envs is None:
                return False
            # Commit the piece's leading run of one producer's OUTSIDE_TXN messages at once
            # (the decoder measured it), returning the first now and the rest from `_run`; the
            # rest go one by one.
            run = seq.commit_alone_run(envs, self._chunk_lead_run)
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

    def _hold_run(self, envs: list[Envelope[Any]], span_through: int | None) -> bool:
        """Hold `envs`, committed at once, to return one by one: the first in `_ahead` (with
        nothing to look past), the rest from `_run`. `span_through`: for one ACK's messages,
        the offset of their journal read up to the ACK, where checkpoints within the run stand
        (`in_sequence` holds until the last; see `checkpoint`); None for messages that each
        commit alone."""
        self._run_all, self._run = envs, envs[:0:-1]
        self._span_through = span_through
        self._ahead, self._ahead_after = envs[0], None
        return True

    def _decode_piece(self) -> list[Envelope[Any]] | None:
        """Decode the next piece of the next chunk (see DECODE_PIECE_BYTES), once every
        envelope queued before it was consumed; None if no chunk is at hand. Its leading run,
        as the decoder measured it, is left in `_chunk_lead_run`."""
        if self._chunk_through is not None:
            # Every envelope of the chunk was consumed: skipped content after the last one
            # may be checkpointed as read too.
            journal, through = self._chunk_through
            floors = self._floors
            if through > floors[journal]:
                floors[journal] = through
            self._chunk_through = None
        if self._decode_error is not None:
            raise self._decode_error  # Every call from now on.
        chunk = self._chunk
        if chunk is None:
            chunk = self._chunk = self._channel.get_nowait()
            if chunk is None:
                return None
            if self._replays.retained_bytes_max:
                self._replays.retain(chunk, self._seq)
        decoder, at, journal = chunk.decoder, chunk.at, chunk.journal
        piece = chunk.content[at : at + DECODE_PIECE_BYTES]
        chunk.at = at + len(piece)
        if chunk.at == len(chunk.content):
            self._chunk = None
        offset = chunk.offset + at
        producer = self._continuing.get(journal)
        after = None if producer is None else self._seq.unlinked_span_clock(journal, producer)
        if after is None:
            envs = decoder.feed(piece, offset)
        else:
            # The piece likely continues a transaction that is only counted now and replayed
            # whole at its ACK: see `Replays.feed_continuing`.
            assert producer is not None
            envs = self._replays.feed_continuing(self._seq, decoder, piece, offset, producer, after)
        if envs:
            last = envs[-1]
            if last.flags == FLAG_CONTINUE_TXN and decoder.decodes_uuids:
                self._continuing[journal] = last.producer
            elif producer is not None:
                del self._continuing[journal]
        self._chunk_through = (journal, decoder.through)
        self._decode_error = decoder.error
        self._chunk_lead_run = decoder.lead_run
        return envs

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

    def checkpoint(self, horizon_clock: int = 0) -> SequencerCheckpoint:
        """Offsets read through and producer states, consistent with the messages returned so
        far. `horizon_clock` prunes idle producers (see `Sequencer.checkpoint`)."""
        run_all, left = self._run_all, len(self._run)
        # The last returned message of a run some of which is not returned yet.
        held = run_all[len(run_all) - left - 1] if left else None
        keep = None if held is None else (held.journal, held.producer)
        seq_cp = self._seq.checkpoint(horizon_clock, keep=keep)
        read_through = dict(self._floors)
        for journal, offset in seq_cp.read_through.items():
            read_through[journal] = max(read_through.get(journal, 0), offset)
        producers = seq_cp.producers
        if held is not None:
            # Where committing the run's messages one by one, through `held`, would stand.
            journal = held.journal
            producers = dict(producers)
            jp = JournalProducer(journal, held.producer)
            span_through = self._span_through
            if span_through is not None:
                # Within one ACK's messages: its journal read up to the ACK, and the producer's
                # span pending from the message after `held` (a restart replays it from there
                # when it reads the ACK again). Never pruned: a pending span is not.
                read_through[journal] = max(self._floors.get(journal, 0), span_through)
                producers[jp] = ProducerState(last_ack=held.clock, begin=held.end)
            elif held.clock < horizon_clock:
                read_through[journal] = max(self._floors.get(journal, 0), held.end)
                producers.pop(jp, None)  # Pruned, as Sequencer.checkpoint would prune it.
            else:
                read_through[journal] = max(self._floors.get(journal, 0), held.end)
                producers[jp] = ProducerState(last_ack=held.clock, begin=-1)
        ahead, after = self._ahead, self._ahead_after
        if ahead is not None and after is not None and not left:
            # Where stepping `after` (non-final, of the same producer) left the state.
            producers = dict(producers)
            producers[JournalProducer(ahead.journal, ahead.producer)] = ProducerState(
                last_ack=after.clock, begin=after.end
            )
        return SequencerCheckpoint(read_through=read_through, producers=producers)

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
