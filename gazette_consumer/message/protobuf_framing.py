"""Fixed protobuf framing (``application/x-protobuf-fixed``).

Each frame is an 8-byte header, the magic word ``66 33 93 36`` and the payload length as a
little-endian uint32, followed by the payload (usually a serialized protobuf message). The magic
word exists to detect de-synchronization: if a reader finds anything else where a header should
be, it scans forward to the next magic word, reports the skipped run as one FrameDesyncError, and
carries on. A length above ``message_bytes_max`` is treated the same way, as corruption rather
than as a frame to buffer, since a random length could otherwise demand gigabytes.

Messages are protobuf messages (anything with ``SerializeToString``, decoded with the message
class's ``FromString``), or raw ``bytes`` payloads.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Generic, TypeVar, cast

from google.protobuf.message import DecodeError as ProtoDecodeError
from google.protobuf.message import EncodeError as ProtoEncodeError

from gazette_consumer.message.framing import (
    CONTENT_TYPE_PROTO_FIXED,
    Frame,
    FrameDesyncError,
    Framing,
    MessageDecodeError,
    MessageEncodeError,
    TruncatedFrameError,
    Unpacker,
    UnpackEvent,
    check_message_size,
)

T = TypeVar("T")

MAGIC_WORD = b"\x66\x33\x93\x36"
HEADER_BYTES = 8
_LENGTH = struct.Struct("<I")


def encode_header(payload_length: int) -> bytes:
    return MAGIC_WORD + _LENGTH.pack(payload_length)


def _payload_of(message: object) -> bytes:
    if isinstance(message, bytes | bytearray | memoryview):
        return bytes(message)
    serialize = getattr(message, "SerializeToString", None)
    if serialize is None:
        raise MessageEncodeError(
            f"{type(message).__name__} is not fixed-frameable "
            "(must be bytes or have SerializeToString)"
        )
    try:
        payload = serialize()
    except ProtoEncodeError as err:
        raise MessageEncodeError(f"{type(message).__name__} failed to serialize: {err}") from err
    return cast(bytes, payload)


class FixedDecoder(Generic[T]):
    """Decodes fixed frames into ``message_type`` (a protobuf message class, or ``bytes``)."""

    def __init__(self, message_type: type[T]) -> None:
        parse: Callable[[bytes], T] | None
        if message_type is bytes:
            parse = cast(Callable[[bytes], T], bytes)
        else:
            parse = getattr(message_type, "FromString", None)
        if parse is None:
            raise TypeError(
                f"{message_type.__name__} cannot be decoded from fixed frames "
                "(must be bytes or a protobuf message class with FromString)"
            )
        self._parse = parse

    def decode(self, frame: Frame) -> T:
        data = frame.data
        if len(data) < HEADER_BYTES or data[:4] != MAGIC_WORD:
            raise MessageDecodeError(
                frame.journal, frame.begin, frame.end, "frame does not begin with the magic word"
            )
        (length,) = _LENGTH.unpack_from(data, 4)
        if length != len(data) - HEADER_BYTES:
            raise MessageDecodeError(
                frame.journal,
                frame.begin,
                frame.end,
                f"header length {length} != payload length {len(data) - HEADER_BYTES}",
            )
        try:
            return self._parse(data[HEADER_BYTES:])
        except (ProtoDecodeError, ValueError) as err:
            raise MessageDecodeError(
                frame.journal, frame.begin, frame.end, f"malformed protobuf message: {err}"
            ) from err


class FixedUnpacker(Unpacker):
    def __init__(self, journal: str, offset: int, message_bytes_max: int) -> None:
        super().__init__(journal, offset, message_bytes_max)
        # Offset where the current run of de-synchronized bytes began, while scanning for magic.
        self._desync_begin: int | None = None

    def _scan(self, buf: bytearray, view: memoryview, begin: int, events: list[UnpackEvent]) -> int:
        pos, size = 0, len(buf)
        while pos < size:
            if self._desync_begin is not None:
                found = buf.find(MAGIC_WORD, pos)
                if found < 0:
                    # Keep the last 3 bytes: they may be the start of a magic word whose rest
                    # has not arrived yet. Everything before is dropped but stays in the run.
                    return max(pos, size - (len(MAGIC_WORD) - 1))
                events.append(
                    FrameDesyncError(
                        self.journal,
                        self._desync_begin,
                        begin + found,
                        "skipped bytes not at a fixed-frame boundary",
                    )
                )
                self._desync_begin = None
                pos = found

            available = size - pos
            if available < HEADER_BYTES:
                # A partial header: wait for the rest, unless it already cannot be a magic word.
                prefix = view[pos : pos + min(available, len(MAGIC_WORD))]
                if MAGIC_WORD.startswith(prefix):
                    break
                self._desync_begin, pos = begin + pos, pos + 1
                continue
            if not buf.startswith(MAGIC_WORD, pos):
                self._desync_begin, pos = begin + pos, pos + 1
                continue
            (length,) = _LENGTH.unpack_from(buf, pos + 4)
            if length > self.message_bytes_max:
                # Corrupt, or a stray magic word inside garbage: not a frame we will buffer.
                self._desync_begin, pos = begin + pos, pos + 1
                continue
            end = pos + HEADER_BYTES + length
            if end > size:
                self._wanted = end - pos  # Don't rescan until the whole frame is here.
                break
            events.append(Frame(bytes(view[pos:end]), begin + pos, begin + end, self.journal))
            pos = end
        return pos

    def _finish(self, buf: bytearray, begin: int, events: list[UnpackEvent]) -> None:
        end = begin + len(buf)
        if self._desync_begin is not None:
            events.append(
                FrameDesyncError(
                    self.journal,
                    self._desync_begin,
                    end,
                    "skipped bytes not at a fixed-frame boundary",
                )
            )
        elif buf:
            events.append(
                TruncatedFrameError(self.journal, begin, end, "input ended inside a fixed frame")
            )
        self._desync_begin = None


class FixedFraming(Framing):
    content_type = CONTENT_TYPE_PROTO_FIXED

    def marshal_into(self, message: object, buf: bytearray) -> int:
        payload = _payload_of(message)
        check_message_size(self, message, len(payload))
        buf += encode_header(len(payload))
        buf += payload
        return HEADER_BYTES + len(payload)

    def new_unpacker(self, journal: str, offset: int) -> FixedUnpacker:
        return FixedUnpacker(journal, offset, self.message_bytes_max)

    def new_decoder(self, message_type: type[T]) -> FixedDecoder[T]:
        return FixedDecoder(message_type)
