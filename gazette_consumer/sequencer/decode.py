"""Chunks of journal content in, Envelopes out: the decoding core of the read iterators (sans-IO).

A `ChunkDecoder` follows one journal's byte stream as a Reader hands it out, in chunks tagged
with the offset they begin at. Each chunk goes through the journal's framing (`Unpacker.feed`)
and each complete frame through the reader's message decoder, in one synchronous pass: the cost
of a chunk is paid once, not once per message or per byte, and no await sits between messages.

What the framing could not make sense of (garbage in fixed framing, over-long JSON lines, a
frame cut short by an offset jump) was skipped by the unpacker, which resynchronised at the next
frame it found; here each skipped range is logged as an error naming journal and offsets, and
reading goes on. A well-framed message that does not decode (malformed JSON, a protobuf that
does not parse, an invalid UUID) cannot be skipped silently: it is a `MessageDecodeError`
naming journal and offsets, and the decoder stops there (see `ChunkDecoder.error`).

Fast path: a reader spends most of its time here, so where the framing can split a chunk into a
`FrameRun` in one pass (JSON lines) and the decoder can decode a run's payloads at once, a chunk
of well-formed frames costs a few C loops and one Python loop building the envelopes
(`EnvelopeBuilder`), with no per-frame validation beyond what the framing and the UUID layout
already guarantee. Anything unusual in a run (a payload that does not decode, a UUID the fast
path does not take) sends the whole run down the general path, frame by frame, which finds and
reports it exactly as if there were no fast path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import structlog

from broker.protocol import labels
from broker.protocol import protocol_pb2 as pb
from gazette_consumer.message.framing import (
    MESSAGE_BYTES_MAX_DEFAULT,
    Decoder,
    Frame,
    FrameRun,
    Framing,
    FramingError,
    MessageDecodeError,
    UnknownContentTypeError,
    framing_for_content_type,
)
from gazette_consumer.message.message import Envelope, EnvelopeBuilder, message_uuid
from gazette_consumer.message.uuid import ProducerID
from gazette_consumer.sequencer.types import FLAG_CONTINUE_TXN, SeqEnvelope

MessageTypeFor = Callable[[pb.JournalSpec], type[Any]]
"""Picks the message type of a journal from its spec (Gazette's NewMessageFunc)."""

MessageTypeSource = type[Any] | MessageTypeFor
"""A message type for every journal, or a function of the journal's spec returning one."""

_log = structlog.get_logger(__name__)


def framing_of(
    spec: pb.JournalSpec, *, message_bytes_max: int = MESSAGE_BYTES_MAX_DEFAULT
) -> Framing:
    """The framing named by the journal's `content-type` label.

    Raises `UnknownContentTypeError` naming the journal if the label is missing or names no
    registered framing.
    """
    content_type = labels.value_of(spec.labels, labels.CONTENT_TYPE)
    try:
        return framing_for_content_type(content_type, message_bytes_max=message_bytes_max)
    except UnknownContentTypeError as err:
        raise UnknownContentTypeError(f"journal {spec.name}: {err}") from None


class MessageTypeError(TypeError):
    """The message type function (a shard's `Application.new_message`) raised, or returned
    something other than a class, for a journal: the error names both."""


def message_type_of(source: MessageTypeSource, spec: pb.JournalSpec) -> type[Any]:
    """Resolve a `MessageTypeSource` for `spec`: a class is used as is, anything else is called
    (what it raises, or a value that is not a class, is a MessageTypeError naming the function
    and the journal: it would otherwise read as an error of the reader's own)."""
    if isinstance(source, type):
        return source
    name = getattr(source, "__qualname__", None) or repr(source)
    try:
        message_type = source(spec)
    except Exception as err:
        raise MessageTypeError(
            f"journal {spec.name}: the message type function {name} raised"
            f" {type(err).__name__}: {err}"
        ) from err
    if not isinstance(message_type, type):
        raise MessageTypeError(
            f"journal {spec.name}: message type function {name} returned {message_type!r},"
            " not a type"
        )
    return message_type


def to_seq_envelope(env: Envelope[Any]) -> SeqEnvelope:
    """The Sequencer's view of `env`, carrying `env` itself as the opaque message."""
    return SeqEnvelope(env.journal, env.begin, env.end, env.producer, env.clock, env.flags, env)


class ChunkDecoder:
    """Decodes one journal's content, fed in order, into Envelopes. Not thread-safe.

    Call order: `feed(content, offset)` for each chunk (offsets may jump forward, never back),
    then `flush()` at the end of a bounded read. After a call that set `error`, the envelopes it
    returned precede the undecodable message; the caller delivers them, then raises `error`.
    Further calls raise it again.
    """

    def __init__(self, journal: str, offset: int, framing: Framing, decoder: Decoder[Any]) -> None:
        self.journal = journal
        self._unpacker = framing.new_unpacker(journal, offset)
        self._decoder = decoder
        self.through = offset
        """Where reading may resume: the end of the last decoded envelope or skipped range."""
        self.skipped_bytes = 0
        """Bytes skipped as unreadable so far (each skipped range was logged)."""
        self.error: MessageDecodeError | None = None
        """The message the decoder stopped at, if any."""
        # The fast path, if the decoder has one (see the module docstring).
        self._decode_payloads: Callable[[list[bytes]], list[Any]] | None = getattr(
            decoder, "decode_payloads", None
        )
        # The decoder takes payloads with their delimiter (cheaper to split, see `feed_run`).
        self._delimited: bool = getattr(decoder, "payloads_delimited", False)
        self._builder = EnvelopeBuilder(getattr(decoder, "uuid_of", message_uuid))
        # Decodes payloads' UUIDs only, if the decoder can (see `feed_continuing`).
        self._decode_uuids: Callable[[list[bytes]], Iterable[Any]] | None = (
            getattr(decoder, "decode_uuids", None) if self._decode_payloads is not None else None
        )
        self.lead_run: int | None = None
        """How many envelopes at the front of the last call's list form a run of one
        producer's OUTSIDE_TXN messages with rising clocks (`EnvelopeBuilder.lead_run`), for
        `Sequencer.commit_alone_run`; None if not measured (the general path)."""

    @property
    def offset(self) -> int:
        """The offset of the next byte the decoder expects to be fed."""
        return self._unpacker.offset

    def feed(self, content: bytes, offset: int) -> list[Envelope[Any]]:
        """Decode the frames `content` (which begins at `offset`) completes."""
        if self.error is not None:
            raise self.error
        expected = self._unpacker.offset
        if offset > expected:
            # Content was removed from the journal (or a read of the head resolved past it):
            # what lay in between is gone, and any frame begun before the jump with it.
            _log.warning(
                "source journal offset jump", journal=self.journal, to=offset, **{"from": expected}
            )
        self.lead_run = None
        if self._decode_payloads is not None:
            run = self._unpacker.feed_run(content, offset, delimited=self._delimited)
            if run is not None:
                return self._decode_run(run)
        return self._decode(self._unpacker.feed(content, offset))

    @property
    def decodes_uuids(self) -> bool:
        """True if `feed_continuing` can skip whole decodes (the decoder decodes UUIDs alone)."""
        return self._decode_uuids is not None

    def feed_continuing(
        self,
        content: bytes,
        offset: int,
        producer: bytes,
        after_clock: int,
        *,
        whole: bool = False,
    ) -> tuple[int, int, int, int, list[Envelope[Any]], list[Envelope[Any]] | None]:
        """`feed`, for content expected to continue `producer`'s transaction past `after_clock`
        (a span a reader only sequences, and delivers later from a replay): the frames at the
        front that do (CONTINUE_TXN of `producer`, clocks rising: `EnvelopeBuilder.continuation`)
        have their UUIDs decoded only, and are returned as a count, the first one's begin, the
        last one's clock and end; the rest as `feed` returns them; and None. (0, ...,
        `after_clock`, ..., envelopes, None) when no frame does, or where the fast path does
        not apply.

        With `whole`, every frame is decoded whole instead, and the envelopes of the frames
        counted are returned too (last): a reader keeps them to replay the span without a
        second decode (replays.py). Should a frame not decode whole, the content is counted as
        without `whole`.

        A frame counted was not decoded whole: were it not decodable, the replay that delivers
        it reports it (`MessageDecodeError`), or nothing does if its transaction rolls back,
        as such a message is never delivered."""
        if self.error is not None:
            raise self.error
        decode_uuids = self._decode_uuids
        run = None
        if decode_uuids is not None and offset == self._unpacker.offset:
            run = self._unpacker.feed_run(content, offset, delimited=self._delimited)
        if run is None:
            return 0, offset, after_clock, offset, self.feed(content, offset), None
        assert decode_uuids is not None  # Else no run was taken.
        self.lead_run = None
        payloads, offsets = run.payloads, run.offsets
        if whole:
            decoded = self._decode_continuing(run, ProducerID(producer), after_clock)
            if decoded is not None:
                return decoded
        n, clock = self._builder.continuation(
            decode_uuids(payloads), ProducerID(producer), after_clock
        )
        begin, end = offsets[0], offsets[n]
        if n:
            self.through = end
        if n == len(payloads):
            return n, begin, clock, end, [], None
        if n:
            run = FrameRun(payloads[n:], offsets[n:], run.source[end - begin :])
        return n, begin, clock, end, self._decode_run(run), None

    def _decode_continuing(
        self, run: FrameRun, producer: ProducerID, after_clock: int
    ) -> tuple[int, int, int, int, list[Envelope[Any]], list[Envelope[Any]] | None] | None:
        """`feed_continuing(whole=True)` of `run`; None, changing nothing, if a frame does not
        decode whole or the fast path does not take it."""
        assert self._decode_payloads is not None  # Else there is no UUID-only decode either.
        try:
            messages = self._decode_payloads(run.payloads)
            envelopes = self._builder.build(self.journal, run.offsets, messages, any_flags=True)
        except Exception:  # Whatever it was, the UUID-only path leaves it to the replay.
            return None
        if envelopes is None:
            return None
        offsets = run.offsets
        builder = self._builder
        if (
            envelopes
            and builder.lead_span == len(envelopes)
            and builder.lead_flags == FLAG_CONTINUE_TXN
            and envelopes[0].clock > after_clock
            and ((first := envelopes[0].producer) is producer or first == producer)
        ):
            # The whole piece continues the span (the usual case in a long transaction's
            # middle), as the builder measured it: what `continuation_of` would count, without
            # its loop over the envelopes.
            self.through = envelopes[-1].end
            return len(envelopes), offsets[0], envelopes[-1].clock, offsets[-1], [], envelopes
        n, clock = continuation_of(envelopes, producer, after_clock)
        if envelopes:
            self.through = envelopes[-1].end
        if not n:
            self.lead_run = self._builder.lead_run
            return 0, offsets[0], after_clock, offsets[0], envelopes, None
        # The rest's leading run is measured by whoever commits it (not by the builder, whose
        # run started at the front).
        return n, offsets[0], clock, offsets[n], envelopes[n:], envelopes[:n]

    def flush(self) -> list[Envelope[Any]]:
        """End of input: report (log) a frame left incomplete. Returns envelopes, if any."""
        if self.error is not None:
            raise self.error
        self.lead_run = None
        return self._decode(self._unpacker.flush())

    def _decode_run(self, run: FrameRun) -> list[Envelope[Any]]:
        assert self._decode_payloads is not None  # Only called when the decoder has it.
        try:
            messages = self._decode_payloads(run.payloads)
            envelopes = self._builder.build(self.journal, run.offsets, messages)
        except Exception:  # Whatever it was, the general path names it (or raises it).
            envelopes = None
        if envelopes is None:
            return self._decode(run.frames(self.journal))
        # Offsets are contiguous and the journal one (the framing's run): the builder's
        # producer, flags and clock checks are all a run needs.
        self.lead_run = self._builder.lead_run
        if envelopes:
            self.through = envelopes[-1].end
        return envelopes

    def _decode(self, events: Sequence[Frame | FramingError]) -> list[Envelope[Any]]:
        out: list[Envelope[Any]] = []
        decode, journal = self._decoder.decode, self.journal
        for event in events:
            if type(event) is Frame:
                try:
                    out.append(Envelope.of(journal, event.begin, event.end, decode(event)))
                except MessageDecodeError as err:
                    self.error = err
                    break
                except (ValueError, TypeError) as err:
                    # An invalid UUID, or a message type that rejected the content: the message
                    # is as undecodable as malformed JSON, and is reported the same way.
                    self.error = MessageDecodeError(journal, event.begin, event.end, str(err))
                    break
                self.through = event.end
            else:
                assert isinstance(event, FramingError)
                self._skipped(event)
        return out

    def _skipped(self, err: FramingError) -> None:
        self.skipped_bytes += err.end - err.begin
        self.through = max(self.through, err.end)
        _log.error(
            "skipped unreadable journal content",
            journal=err.journal,
            begin=err.begin,
            end=err.end,
            kind=type(err).__name__,
            reason=err.reason,
        )


def new_chunk_decoder(
    spec: pb.JournalSpec,
    offset: int,
    message_type: MessageTypeSource,
    *,
    framing: Framing | None = None,
    message_bytes_max: int = MESSAGE_BYTES_MAX_DEFAULT,
) -> ChunkDecoder:
    """A ChunkDecoder of `spec`'s journal from `offset`, with `framing` or the spec's own."""
    if framing is None:
        framing = framing_of(spec, message_bytes_max=message_bytes_max)
    decoder = framing.new_decoder(message_type_of(message_type, spec))
    return ChunkDecoder(spec.name, offset, framing, decoder)


def continuation_of(
    envelopes: Sequence[Envelope[Any]], producer: ProducerID, after_clock: int
) -> tuple[int, int]:
    """How many envelopes at the front of `envelopes` continue `producer`'s transaction past
    `after_clock` (CONTINUE_TXN, of `producer`, each clock larger than the one before), and the
    last one's clock (`after_clock` if none does): `EnvelopeBuilder.continuation`, of envelopes
    decoded whole."""
    n, clock, continue_txn = 0, after_clock, FLAG_CONTINUE_TXN
    for env in envelopes:
        next_clock = env.clock
        if (
            env.flags != continue_txn
            or next_clock <= clock
            or (env.producer is not producer and env.producer != producer)
        ):
            break
        clock = next_clock
        n += 1
    return n, clock
