"""The wire encoding of content chunks, built and read without a protobuf message.

Every appended byte crosses the broker inside a content message: an AppendRequest from the client,
and a ReplicateRequest to each peer. Through a protobuf message, each chunk is copied into the
message and copied again by serialization, and a primary serializes the same ReplicateRequest
once per peer. Content messages carry nothing but the content (and the replication delta), so
their encoding is written here directly, in one copy, and the same bytes are sent to every peer
(gRPC calls opened with ``passthrough_serializer`` send them as they are).

The output is byte-for-byte what protobuf's SerializeToString produces for the same message
(fields in number order, proto3 defaults omitted); the tests prove it.

Receiving is the mirror image. gRPC hands a handler's deserializer the message's bytes; parsing
them into a protobuf message copies the content, and reading ``message.content`` copies it
again. ``decode_append_request`` and ``decode_replicate_request`` (the deserializers the broker
registers for Append and Replicate, see ``broker/service_handlers.py``) recognise the canonical
encoding of a content-only message and return a ``ContentChunk``: a view of the content inside
the received bytes, no copy. Anything else is parsed by protobuf as before. A ContentChunk
stands in for the message it encodes: handlers that know it read ``content`` (a memoryview) and
``content_delta``; any other attribute is read from the message, parsed on first use, so code
unaware of the fast path (interceptors, a malformed first message) sees exactly what protobuf
would have produced.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from broker.protocol import protocol_pb2 as pb

# Both AppendRequest.content and ReplicateRequest.content are field 4 (length-delimited), and
# ReplicateRequest.content_delta is field 5 (varint): tag = field number << 3 | wire type.
_CONTENT_TAG: Final = bytes([4 << 3 | 2])
_CONTENT_DELTA_TAG: Final = bytes([5 << 3 | 0])
# Varints of int64 values take at most ten bytes.
_INT64_MAX: Final = (1 << 63) - 1

BytesLike = bytes | bytearray | memoryview


def _varint(value: int) -> bytes:
    if not 0 <= value <= _INT64_MAX:
        raise ValueError(f"varint: must be in [0, 2^63) (got {value})")
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _content_field(content: BytesLike) -> list[BytesLike]:
    # proto3 omits a field holding its default (empty content: the commit marker).
    return [_CONTENT_TAG, _varint(len(content)), content] if len(content) else []


def encode_append_content(content: BytesLike) -> bytes:
    """The encoding of ``AppendRequest(content=content)``."""
    return b"".join(_content_field(content))


def encode_replicate_content(content: BytesLike, content_delta: int) -> bytes:
    """The encoding of ``ReplicateRequest(content=content, content_delta=content_delta)``."""
    parts = _content_field(content)
    delta = _varint(content_delta)  # Checked even when zero.
    if content_delta:
        parts += (_CONTENT_DELTA_TAG, delta)
    return b"".join(parts)


def passthrough_serializer(serialize: Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    """A gRPC request serializer that sends ``bytes`` as they are (already encoded, e.g. by the
    functions above) and serializes anything else with ``serialize``."""

    def serializer(message: Any) -> bytes:
        if isinstance(message, bytes):
            return message
        return serialize(message)

    return serializer


# --- Receiving ---------------------------------------------------------------------------------

# Longest varint of a 64-bit value.
_VARINT_BYTES_MAX: Final = 10


class ContentChunk:
    """A received content-only message: ``content`` is a view of the received bytes (``wire``).
    Any other attribute is that of the full message (``message()``), parsed when first asked."""

    __slots__ = ("_message", "_message_type", "content", "content_delta", "wire")

    def __init__(
        self, wire: bytes, content: memoryview, content_delta: int, message_type: Any
    ) -> None:
        self.wire = wire
        self.content = content
        self.content_delta = content_delta
        self._message_type = message_type
        self._message: Any = None

    def message(self) -> Any:
        """The protobuf message of ``wire`` (an AppendRequest or a ReplicateRequest)."""
        if self._message is None:
            self._message = self._message_type.FromString(self.wire)
        return self._message

    def __getattr__(self, name: str) -> Any:
        # Only called for attributes not in __slots__: fields and methods of the message.
        return getattr(self.message(), name)

    def __repr__(self) -> str:
        return f"ContentChunk<{len(self.content)} bytes, delta {self.content_delta}>"


def _read_varint(data: bytes, at: int) -> tuple[int, int] | None:
    """(value, next position) of the varint at ``at``; None if it is cut short or too long."""
    value, shift, end = 0, 0, min(len(data), at + _VARINT_BYTES_MAX)
    while at < end:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
    return None


def _content_only(data: bytes, delta_allowed: bool) -> tuple[memoryview, int] | None:
    """(content, content_delta) if ``data`` is the canonical encoding of a message carrying
    nothing but a non-empty content field (and, if allowed, a non-zero content_delta after it).
    None for anything else, which is then protobuf's to parse."""
    if len(data) < 2 or data[0] != _CONTENT_TAG[0]:
        return None
    length = _read_varint(data, 1)
    if length is None or length[0] == 0:
        return None
    size, start = length
    end = start + size
    if end == len(data):
        return memoryview(data)[start:end], 0
    if not delta_allowed or end >= len(data) or data[end] != _CONTENT_DELTA_TAG[0]:
        return None
    delta = _read_varint(data, end + 1)
    # A value of 2^63 or more is a negative int64 on the wire: protobuf's to read (and the
    # spool's to refuse). Zero is never encoded by a canonical writer.
    if delta is None or delta[1] != len(data) or not 0 < delta[0] <= _INT64_MAX:
        return None
    return memoryview(data)[start:end], delta[0]


def decode_append_request(data: bytes) -> pb.AppendRequest | ContentChunk:
    """The Append RPC's request deserializer (see the module docstring)."""
    chunk = _content_only(data, delta_allowed=False)
    if chunk is None:
        return pb.AppendRequest.FromString(data)
    return ContentChunk(data, chunk[0], 0, pb.AppendRequest)


def decode_replicate_request(data: bytes) -> pb.ReplicateRequest | ContentChunk:
    """The Replicate RPC's request deserializer (see the module docstring)."""
    chunk = _content_only(data, delta_allowed=True)
    if chunk is None:
        return pb.ReplicateRequest.FromString(data)
    return ContentChunk(data, chunk[0], chunk[1], pb.ReplicateRequest)
