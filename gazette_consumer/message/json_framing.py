"""JSON lines framing (``application/x-ndjson``): one JSON document per line.

A frame is the document plus its terminating newline. JSON encoders never emit a raw newline
inside a document, so the newline alone delimits frames. msgspec does the encoding and decoding:
it is several times faster than the stdlib ``json`` here, and this is the hot path of a consumer.
``message_bytes_max`` bounds the document, excluding its newline.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from io import BytesIO
from itertools import accumulate, count
from operator import add as _ADD
from operator import attrgetter
from typing import Any, Final, Generic, Self, TypeVar
from uuid import UUID

import msgspec

from gazette_consumer.message.framing import (
    CONTENT_TYPE_JSON_LINES,
    MESSAGE_BYTES_MAX_DEFAULT,
    Frame,
    FrameRun,
    FrameTooLargeError,
    Framing,
    MessageDecodeError,
    MessageEncodeError,
    TruncatedFrameError,
    Unpacker,
    UnpackEvent,
    check_message_size,
)
from gazette_consumer.message.message import UUID_ATTRIBUTE, UUIDOf, message_uuid
from gazette_consumer.message.uuid import NIL_UUID

T = TypeVar("T")

_NEWLINE = b"\n"


class JSONMessage(msgspec.Struct, kw_only=True):
    """A ready-made base for JSON messages: subclass it and add fields.

    The UUID serializes under the key ``"UUID"``, as Gazette's Go examples name it, so that Go and
    Python producers and consumers can share journals. An unset UUID is the nil UUID (Go's zero
    value) rather than null, because Go's UUID type refuses to decode a JSON null.

    ``new_acknowledgement`` builds an instance with default field values; a subclass with required
    fields must override it.
    """

    uuid: UUID = msgspec.field(default=NIL_UUID, name="UUID")

    def get_uuid(self) -> UUID | None:
        return None if self.uuid == NIL_UUID else self.uuid

    def set_uuid(self, uuid: UUID) -> None:
        self.uuid = uuid

    def new_acknowledgement(self, journal: str) -> Self:
        try:
            return type(self)()
        except TypeError as err:
            raise TypeError(
                f"{type(self).__name__} has required fields, so it must override "
                f"new_acknowledgement (needed to acknowledge messages of journal {journal})"
            ) from err


# The C setter of JSONMessage's UUID slot (a member descriptor: msgspec fields are slots).
_UUID_SLOT: Final = JSONMessage.__dict__["uuid"]
_set_uuid_slot: Final[Callable[[Any, UUID], None]] = _UUID_SLOT.__set__


def uuid_slot_setter(kind: type) -> Callable[[Any, UUID], None] | None:
    """For a JSONMessage type whose `set_uuid` is the base one (it stores the UUID in the
    ``uuid`` field), the field's slot setter, which does the same without a Python call: a
    publisher sets one UUID per message. None for any other type (call its `set_uuid`).

    A frozen struct is excluded (its `set_uuid` raises, and the slot would not). msgspec's own
    attribute setting also starts tracking an untracked struct in the garbage collector when
    the value may hold references; the slot setter does not, which is safe for a UUID: it
    holds an int and an enum member, so it closes no reference cycle through the message."""
    if not (isinstance(kind, type) and issubclass(kind, JSONMessage)):
        return None
    if kind.set_uuid is not JSONMessage.set_uuid or kind.__struct_config__.frozen:
        return None
    if getattr(kind, "uuid", None) is not _UUID_SLOT:  # A subclass redefining the field.
        return None
    return _set_uuid_slot


def _uuid_only_decoder(
    message_type: type[JSONMessage],
) -> Callable[[Iterable[bytes]], Iterator[UUID]] | None:
    """A function decoding only the UUIDs of JSON payloads of `message_type` (their other
    fields skipped, not validated), lazily, or None if the type is not a JSON object keeping
    the base UUID field (an array-like or tagged struct)."""
    config = message_type.__struct_config__
    if config.array_like or config.tag is not None:
        return None
    uuid_field = next((f for f in msgspec.structs.fields(message_type) if f.name == "uuid"), None)
    if uuid_field is None:
        return None
    only = msgspec.defstruct(
        f"{message_type.__name__}UUIDOnly",
        [("uuid", UUID, msgspec.field(default=NIL_UUID, name=uuid_field.encode_name))],
        gc=False,  # Holds a UUID only: no cycle to collect.
    )
    decode = msgspec.json.Decoder(only).decode
    uuid_of = attrgetter("uuid")
    # Two maps in C: no Python frame per payload.
    return lambda payloads: map(uuid_of, map(decode, payloads))


class JSONDecoder(Generic[T]):
    """Decodes JSON frames into ``message_type`` (anything msgspec can decode into).

    `uuid_of` reads a decoded message's UUID for envelopes: the ``uuid`` attribute itself for a
    JSONMessage that keeps the base `get_uuid` (msgspec decoded it as a ``uuid.UUID``), else
    the general `message_uuid`. For such a type, `decode_uuids` decodes payloads' UUIDs only,
    lazily (the other fields skipped: about half a whole decode), which a reader uses for
    messages it only needs to sequence, not deliver (`ChunkDecoder.feed_continuing`); else it
    is None.
    """

    payloads_delimited: Final = True
    """`decode_payloads` takes lines with their newline (`JSONUnpacker.feed_run`'s
    `delimited`): JSON whitespace, so they decode as without it."""

    def __init__(self, message_type: type[T]) -> None:
        self._decoder: msgspec.json.Decoder[T] = msgspec.json.Decoder(message_type)
        self.uuid_of: UUIDOf = message_uuid
        self.decode_uuids: Callable[[Iterable[bytes]], Iterator[UUID]] | None = None
        if isinstance(message_type, type) and issubclass(message_type, JSONMessage):
            if message_type.get_uuid is JSONMessage.get_uuid:
                self.uuid_of = UUID_ATTRIBUTE
                self.decode_uuids = _uuid_only_decoder(message_type)

    def decode_payloads(self, payloads: list[bytes]) -> list[T]:
        """Decode the payloads of a `FrameRun` (lines without their newline) all at once.

        Raises on the first one that does not decode, without naming it: the caller then decodes
        the run's frames one by one with `decode`, which does.
        """
        return list(map(self._decoder.decode, payloads))

    def decode(self, frame: Frame) -> T:
        try:
            return self._decoder.decode(frame.data)
        except msgspec.DecodeError as err:  # ValidationError is a subclass.
            raise MessageDecodeError(
                frame.journal, frame.begin, frame.end, f"malformed JSON message: {err}"
            ) from err


class JSONUnpacker(Unpacker):
    def __init__(self, journal: str, offset: int, message_bytes_max: int) -> None:
        super().__init__(journal, offset, message_bytes_max)
        # Buffer index from which to resume the newline search: bytes before it were searched.
        self._search_from = 0
        # Offset where an over-long line began, while we discard it up to its newline.
        self._skip_begin: int | None = None

    def _scan(self, buf: bytearray, view: memoryview, begin: int, events: list[UnpackEvent]) -> int:
        journal, bytes_max = self.journal, self.message_bytes_max
        pos = 0
        newline = buf.find(_NEWLINE, self._search_from)
        while newline >= 0:
            end = newline + 1
            if self._skip_begin is not None:
                events.append(
                    FrameTooLargeError(
                        journal,
                        self._skip_begin,
                        begin + end,
                        "JSON line exceeds message_bytes_max",
                    )
                )
                self._skip_begin = None
            elif newline - pos > bytes_max:
                events.append(
                    FrameTooLargeError(
                        journal,
                        begin + pos,
                        begin + end,
                        f"JSON line of {newline - pos} bytes exceeds message_bytes_max {bytes_max}",
                    )
                )
            else:
                events.append(Frame(bytes(view[pos:end]), begin + pos, begin + end, journal))
            pos = end
            newline = buf.find(_NEWLINE, pos)

        # No newline in buf[pos:]. If it is already too long to be a message, stop buffering it:
        # remember where it began and drop bytes until its newline turns up.
        if self._skip_begin is None and len(buf) - pos > bytes_max:
            self._skip_begin = begin + pos
        if self._skip_begin is not None:
            pos = len(buf)
        self._search_from = len(buf) - pos
        return pos

    def feed_run(self, chunk: bytes, offset: int, *, delimited: bool = False) -> FrameRun | None:
        """`feed`, in one pass of C loops, when `chunk` completes only lines within bounds.

        `delimited` leaves each payload its newline (JSON whitespace, which msgspec skips):
        those lines are split by `BytesIO.readlines`, which finds newlines with `memchr`, where
        `bytes.split` tests byte by byte (~360 instructions a ~200-byte line against ~1,250)."""
        buf = self._buf
        if offset != self._buf_begin + len(buf) or self._skip_begin is not None:
            return None
        if chunk.rfind(_NEWLINE) < 0:
            # No frame ends here: `feed` buffers the chunk (searching only what is new), rather
            # than this copying a long line's buffer once per chunk.
            return None
        # What is buffered holds no newline (it was searched), so joining loses no frame.
        source = bytes(buf) + chunk if buf else bytes(chunk)
        if delimited:
            payloads = BytesIO(source).readlines()
            # The line after the last newline, if any (it has none): rfind found a newline.
            rest = b"" if payloads[-1].endswith(_NEWLINE) else payloads.pop()
            newline = 1
        else:
            payloads = source.split(_NEWLINE)
            rest = payloads.pop()
            newline = 0
        if not payloads:
            return None  # No newline yet: `feed` buffers the chunk.
        bytes_max = self.message_bytes_max
        # No line is longer than all of them (a piece is far below any sensible bound): only a
        # longer source is looked into, line by line.
        if len(source) > bytes_max and (
            len(rest) > bytes_max or max(map(len, payloads)) - newline > bytes_max
        ):
            return None  # `feed` reports (and skips) the over-long line.
        if delimited:
            offsets = list(accumulate(map(len, payloads), initial=self._buf_begin))
        else:
            # Frame i spans its payload and newline: offsets are the running sum of the
            # payloads' lengths, plus i newlines (`operator.add` is one C call; `(1).__add__`
            # took two).
            offsets = list(
                map(_ADD, accumulate(map(len, payloads), initial=self._buf_begin), count())
            )
        self._buf = bytearray(rest)
        self._buf_begin = offsets[-1]
        self._search_from = len(rest)
        return FrameRun(payloads, offsets, source)

    def _finish(self, buf: bytearray, begin: int, events: list[UnpackEvent]) -> None:
        end = begin + len(buf)
        if self._skip_begin is not None:
            events.append(
                FrameTooLargeError(
                    self.journal, self._skip_begin, end, "JSON line exceeds message_bytes_max"
                )
            )
        elif buf:
            events.append(TruncatedFrameError(self.journal, begin, end, "JSON line has no newline"))
        self._skip_begin = None
        self._search_from = 0


class JSONFraming(Framing):
    content_type = CONTENT_TYPE_JSON_LINES

    def __init__(self, *, message_bytes_max: int = MESSAGE_BYTES_MAX_DEFAULT) -> None:
        super().__init__(message_bytes_max=message_bytes_max)
        self._encoder = msgspec.json.Encoder()

    def marshal(self, message: object) -> bytes:
        try:
            encoded = self._encoder.encode(message)
        except (TypeError, ValueError, OverflowError) as err:
            raise MessageEncodeError(
                f"{type(message).__name__} message is not JSON-encodable: {err}"
            ) from err
        if len(encoded) > self.message_bytes_max:  # Checked inline: once per message published.
            check_message_size(self, message, len(encoded))
        return encoded + _NEWLINE

    def marshal_many(self, messages: Sequence[object]) -> bytes:
        """All frames in one msgspec call (`encode_lines`: each document and its newline); a
        batch that fails, or holds a document over the bound, is marshalled one by one for
        the error that names its message."""
        try:
            encoded = self._encoder.encode_lines(messages)
        except (TypeError, ValueError, OverflowError):
            encoded = None
        # Every document is within the bound if the whole batch (newlines included) is: only a
        # longer batch is looked into, line by line.
        if encoded is None or (
            len(encoded) > self.message_bytes_max
            and max(map(len, encoded.split(_NEWLINE))) > self.message_bytes_max
        ):
            return super().marshal_many(messages)  # Raises for the message that fails.
        return encoded

    def marshal_into(self, message: object, buf: bytearray) -> int:
        frame = self.marshal(message)
        buf += frame
        return len(frame)

    def new_unpacker(self, journal: str, offset: int) -> JSONUnpacker:
        return JSONUnpacker(journal, offset, self.message_bytes_max)

    def new_decoder(self, message_type: type[T]) -> JSONDecoder[T]:
        return JSONDecoder(message_type)
