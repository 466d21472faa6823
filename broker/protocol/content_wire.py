"""The wire encoding of content chunks, built without a protobuf message.

Every appended byte crosses the broker inside a content message: an AppendRequest from the client,
and a ReplicateRequest to each peer. Through a protobuf message, each chunk is copied into the
message and copied again by serialization, and a primary serializes the same ReplicateRequest
once per peer. Content messages carry nothing but the content (and the replication delta), so
their encoding is written here directly, in one copy, and the same bytes are sent to every peer
(gRPC calls opened with ``passthrough_serializer`` send them as they are).

The output is byte-for-byte what protobuf's SerializeToString produces for the same message
(fields in number order, proto3 defaults omitted); the tests prove it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

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
