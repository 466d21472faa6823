"""content_wire: hand-built content messages are exactly protobuf's own encoding."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.protocol import protocol_pb2 as pb
from broker.protocol.content_wire import (
    encode_append_content,
    encode_replicate_content,
    passthrough_serializer,
)

INT64_MAX = (1 << 63) - 1


@given(content=st.binary(max_size=1 << 12), delta=st.integers(0, INT64_MAX))
def test_replicate_content_is_protobufs_encoding(content: bytes, delta: int) -> None:
    wire = encode_replicate_content(content, delta)
    assert wire == pb.ReplicateRequest(content=content, content_delta=delta).SerializeToString()
    parsed = pb.ReplicateRequest.FromString(wire)
    assert (parsed.content, parsed.content_delta) == (content, delta)


@given(content=st.binary(max_size=1 << 12))
def test_append_content_is_protobufs_encoding(content: bytes) -> None:
    assert encode_append_content(content) == pb.AppendRequest(content=content).SerializeToString()


@pytest.mark.parametrize("size", [127, 128, 16383, 16384, 1 << 20])
def test_length_varint_boundaries(size: int) -> None:
    content = bytes(range(256)) * (size // 256) + b"\x07" * (size % 256)
    view = memoryview(bytearray(b"--" + content + b"--"))[2:-2]  # A slice, not a copy.
    assert encode_append_content(view) == pb.AppendRequest(content=content).SerializeToString()
    assert pb.ReplicateRequest.FromString(encode_replicate_content(view, 5)).content == content


@pytest.mark.parametrize("delta", [-1, 1 << 63])
def test_a_delta_outside_int64_is_refused(delta: int) -> None:
    with pytest.raises(ValueError, match=r"^varint: must be in \[0, 2\^63\)"):
        encode_replicate_content(b"x", delta)


def test_passthrough_serializer_sends_bytes_as_they_are() -> None:
    serialize = passthrough_serializer(pb.AppendRequest.SerializeToString)
    encoded = encode_append_content(b"abc")
    assert serialize(encoded) is encoded
    request = pb.AppendRequest(journal="a/b")
    assert serialize(request) == request.SerializeToString()
