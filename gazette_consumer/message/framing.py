"""Framings: how messages are laid out as bytes in a journal, and how they are found again.

A journal declares its framing through its ``content-type`` label. A Framing marshals one message
into one *frame*. A publisher appends whole frames only, so a frame never spans two appends and
offsets at append boundaries are always frame boundaries.

Reading is sans-IO: an ``Unpacker`` is fed chunks of journal bytes together with the offset they
start at, and returns *events*: a ``Frame`` (the frame's bytes and its [begin, end) offsets), or a
``FramingError`` describing a byte range that could not be framed and was skipped. Skipped ranges
are reported, never raised, so that one corrupt region cannot wedge a reader; the caller decides
whether to log or fail. A ``Decoder`` then turns a Frame into a message of the reader's type and
raises ``MessageDecodeError`` (naming journal and offset) if it cannot.

Every framing bounds the size of one message (``message_bytes_max``), both when marshalling and
when reading: an unpacker never buffers more than about one maximal frame, whatever it is fed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from itertools import pairwise
from typing import ClassVar, NamedTuple, Protocol, TypeVar

from gazette_consumer.message.message import Envelope

CONTENT_TYPE_LABEL = "content-type"
"""Name of the journal label that selects the framing."""

CONTENT_TYPE_JSON_LINES = "application/x-ndjson"
CONTENT_TYPE_PROTO_FIXED = "application/x-protobuf-fixed"
CONTENT_TYPE_CSV = "text/csv"

MESSAGE_BYTES_MAX_DEFAULT = 64 * 1024 * 1024
"""Default bound on one message's encoding. Large enough for any sensible message, yet it stops a
corrupt length prefix (up to 4 GiB) or a missing newline from making a reader buffer gigabytes."""

MESSAGE_BYTES_MAX_LIMIT = (1 << 32) - 1
"""No framing can exceed this: fixed frames carry the payload length as a uint32."""

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Frame(NamedTuple):
    """One frame: bytes [begin, end) of ``journal``, including any header or delimiter."""

    data: bytes
    begin: int
    end: int
    journal: str


class FrameRun(NamedTuple):
    """Consecutive frames of one journal, found in one pass (`Unpacker.feed_run`).

    ``payloads[i]`` is the message encoding of frame i (without the framing's header, and without
    its delimiter unless the run was asked for `delimited`), and the frame spans ``[offsets[i], offsets[i + 1])``. ``source`` holds the frames'
    bytes from offset ``offsets[0]`` on, to rebuild them as `Frame` values (`frames`).
    """

    payloads: list[bytes]
    offsets: list[int]
    source: bytes

    def frames(self, journal: str) -> list[Frame]:
        """The run's frames, exactly as `Unpacker.feed` would have returned them."""
        base, source = self.offsets[0], self.source
        return [
            Frame(source[begin - base : end - base], begin, end, journal)
            for begin, end in pairwise(self.offsets)
        ]


class FramingError(Exception):
    """A byte range [begin, end) of a journal that does not hold a readable message."""

    def __init__(self, journal: str, begin: int, end: int, reason: str) -> None:
        # All fields go to Exception.args so that the error pickles (Spark ships errors around).
        super().__init__(journal, begin, end, reason)
        self.journal = journal
        self.begin = begin
        self.end = end
        self.reason = reason

    def __str__(self) -> str:
        return f"journal {self.journal} offsets [{self.begin}, {self.end}): {self.reason}"


class FrameDesyncError(FramingError):
    """Bytes that are not at a frame boundary were skipped up to the next frame header."""


class FrameTooLargeError(FramingError):
    """A frame whose message exceeds message_bytes_max was skipped."""


class TruncatedFrameError(FramingError):
    """Input ended (or jumped ahead) in the middle of a frame; its partial bytes were dropped."""


class MessageDecodeError(FramingError):
    """A well-framed message could not be decoded into the reader's message type."""


UnpackEvent = Frame | FramingError


class MessageEncodeError(ValueError):
    """A message could not be marshalled by a framing."""


class MessageTooLargeError(MessageEncodeError):
    """A marshalled message exceeds the framing's message_bytes_max."""


class UnknownContentTypeError(LookupError):
    """No framing is registered for a journal's content-type."""


class FeedOffsetError(ValueError):
    """An unpacker was fed bytes at an offset it has already moved past."""


class FramingConfigError(ValueError):
    """A framing was configured with an invalid bound."""


class Decoder(Protocol[T_co]):
    """Decodes the frames of one message type. Decoders may keep state across frames."""

    def decode(self, frame: Frame) -> T_co: ...


def decode_envelope(decoder: Decoder[T], frame: Frame) -> Envelope[T]:
    """Decode ``frame`` and wrap the message in an Envelope with its offsets and UUID parts."""
    return Envelope.of(frame.journal, frame.begin, frame.end, decoder.decode(frame))


def check_message_size(framing: Framing, message: object, size: int) -> None:
    """Raise MessageTooLargeError if a message encoding of ``size`` bytes exceeds the bound."""
    if size > framing.message_bytes_max:
        raise MessageTooLargeError(
            f"{type(message).__name__} message encodes to {size} bytes, above "
            f"message_bytes_max {framing.message_bytes_max} of {framing.content_type} framing"
        )


class Unpacker(ABC):
    """Incrementally splits a journal's byte stream into frames.

    Subclasses implement ``_scan`` (find frames in the buffer) and ``_finish`` (report whatever is
    left when input ends). This base class owns the buffer and the offset bookkeeping.
    """

    def __init__(self, journal: str, offset: int, message_bytes_max: int) -> None:
        if offset < 0:
            raise FeedOffsetError(f"journal {journal}: offset {offset} must be >= 0")
        self.journal = journal
        self.message_bytes_max = message_bytes_max
        self._buf = bytearray()
        # Journal offset of self._buf[0].
        self._buf_begin = offset
        # Buffer length below which scanning cannot make progress (set when a frame's length is
        # known from its header), so that a large frame arriving in small chunks costs O(n).
        self._wanted = 0

    @property
    def offset(self) -> int:
        """The journal offset of the next byte this unpacker expects to be fed."""
        return self._buf_begin + len(self._buf)

    @property
    def buffered_bytes(self) -> int:
        """Bytes held back because they may begin a frame not yet complete."""
        return len(self._buf)

    def feed(self, chunk: bytes, offset: int) -> list[UnpackEvent]:
        """Add ``chunk``, which begins at journal ``offset``, and return the events it completes.

        An ``offset`` beyond the expected one means content was skipped (e.g. a journal whose
        early fragments were deleted): a frame in progress can no longer complete, so it is
        reported as truncated and reading resumes at the new offset. An ``offset`` before the
        expected one raises FeedOffsetError and changes nothing.
        """
        expected = self.offset
        if offset < expected:
            raise FeedOffsetError(
                f"journal {self.journal}: fed offset {offset}, but expected offset {expected}"
            )
        events: list[UnpackEvent] = []
        if offset > expected:
            events.extend(self.flush())
            self._buf_begin = offset
        if not chunk:
            return events

        self._buf += chunk
        if len(self._buf) < self._wanted:
            return events
        self._wanted = 0
        with memoryview(self._buf) as view:
            consumed = self._scan(self._buf, view, self._buf_begin, events)
        if consumed:
            del self._buf[:consumed]
            self._buf_begin += consumed
        return events

    def feed_run(self, chunk: bytes, offset: int, *, delimited: bool = False) -> FrameRun | None:
        """The fast path of `feed`, for framings that can split a chunk in one pass.

        If `chunk` (at `offset`) continues the input and completes only well-formed frames (no
        error to report), consume it exactly as `feed` would and return its frames as a
        `FrameRun`. Otherwise change nothing and return None: the caller calls `feed`. The base
        class always returns None. With `delimited`, a framing whose frames end in a delimiter
        may leave it on each payload (for a decoder that takes it: it may be cheaper to split).
        """
        return None

    def flush(self) -> list[UnpackEvent]:
        """Signal the end of input (e.g. the end of a bounded read).

        Returns errors for any incomplete frame or skipped run still pending; afterwards the
        unpacker expects a new frame at ``offset``.
        """
        events: list[UnpackEvent] = []
        self._finish(self._buf, self._buf_begin, events)
        self._buf_begin += len(self._buf)
        self._buf.clear()
        self._wanted = 0
        return events

    @abstractmethod
    def _scan(self, buf: bytearray, view: memoryview, begin: int, events: list[UnpackEvent]) -> int:
        """Append the events found in ``buf`` (which starts at offset ``begin``) and return
        how many leading bytes of it may be dropped."""

    @abstractmethod
    def _finish(self, buf: bytearray, begin: int, events: list[UnpackEvent]) -> None:
        """Append errors for what remains at end of input, and reset any scanning state."""


class Framing(ABC):
    """A message framing, registered under the journal content-type it implements."""

    content_type: ClassVar[str]

    def __init__(self, *, message_bytes_max: int = MESSAGE_BYTES_MAX_DEFAULT) -> None:
        if not 1 <= message_bytes_max <= MESSAGE_BYTES_MAX_LIMIT:
            raise FramingConfigError(
                f"message_bytes_max: {message_bytes_max} must be in [1, {MESSAGE_BYTES_MAX_LIMIT}]"
            )
        self.message_bytes_max = message_bytes_max

    def marshal(self, message: object) -> bytes:
        """Return the single frame of ``message``."""
        buf = bytearray()
        self.marshal_into(message, buf)
        return bytes(buf)

    def marshal_many(self, messages: Sequence[object]) -> bytes:
        """The frames of `messages`, in order, as one bytes object (what a publisher appends
        at once). Raises what `marshal` raises for the first message that fails. Framings
        with a bulk encoder override it."""
        return b"".join(map(self.marshal, messages))

    @abstractmethod
    def marshal_into(self, message: object, buf: bytearray) -> int:
        """Append the frame of ``message`` to ``buf`` and return its length.

        On error ``buf`` is left as it was, so a publisher can batch frames into one buffer.
        """

    @abstractmethod
    def new_unpacker(self, journal: str, offset: int) -> Unpacker:
        """An unpacker for ``journal``, whose first fed byte will be at ``offset``."""

    @abstractmethod
    def new_decoder(self, message_type: type[T]) -> Decoder[T]:
        """A decoder of frames into instances of ``message_type``."""

    def unpack(self, journal: str, offset: int, data: bytes) -> list[UnpackEvent]:
        """Unpack a complete byte range at once (feed, then flush)."""
        unpacker = self.new_unpacker(journal, offset)
        events = unpacker.feed(data, offset)
        events.extend(unpacker.flush())
        return events


_REGISTRY: dict[str, type[Framing]] = {}


def register_framing(framing_type: type[Framing]) -> None:
    """Register a Framing class under its content_type, replacing any previous one."""
    _REGISTRY[framing_type.content_type] = framing_type


def registered_content_types() -> list[str]:
    return sorted(_REGISTRY)


def framing_for_content_type(
    content_type: str, *, message_bytes_max: int = MESSAGE_BYTES_MAX_DEFAULT
) -> Framing:
    """A new Framing for a journal's ``content-type`` label value."""
    framing_type = _REGISTRY.get(content_type)
    if framing_type is None:
        raise UnknownContentTypeError(
            f"{CONTENT_TYPE_LABEL}: no message framing is registered for {content_type!r} "
            f"(registered: {', '.join(registered_content_types()) or 'none'})"
        )
    return framing_type(message_bytes_max=message_bytes_max)
