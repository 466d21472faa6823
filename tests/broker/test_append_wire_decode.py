"""content_wire's receive side: the Append and Replicate deserializers agree with protobuf's
parser on every input (a ContentChunk for exactly the canonical content-only messages, the
parsed message for everything else, protobuf's error for malformed bytes), a ContentChunk reads
like the message it encodes, and the broker registers the deserializers for exactly those two
methods."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.protocol import protocol_pb2 as pb
from broker.protocol import protocol_pb2_grpc as pbg
from broker.protocol.content_wire import (
    ContentChunk,
    decode_append_request,
    decode_replicate_request,
    encode_append_content,
    encode_replicate_content,
)
from broker.service_handlers import add_journal_service, journal_method_handlers

INT64_MAX = (1 << 63) - 1
DECODERS: list[tuple[Any, Any]] = [
    (decode_append_request, pb.AppendRequest),
    (decode_replicate_request, pb.ReplicateRequest),
]


def assert_same_as_protobuf(decode: Any, message_type: Any, data: bytes) -> Any:
    """decode(data) reads exactly as protobuf's parse of data (or fails as it does)."""
    try:
        expected = message_type.FromString(data)
    except DecodeError:
        with pytest.raises(DecodeError):
            decode(data)
        return None
    got = decode(data)
    if isinstance(got, ContentChunk):
        assert bytes(got.content) == expected.content
        assert got.content_delta == getattr(expected, "content_delta", 0)
        assert got.message() == expected
        # Content alone: nothing else is set.
        assert expected.ListFields()[0][0].name == "content"
        assert {f.name for f, _ in expected.ListFields()} <= {"content", "content_delta"}
    else:
        assert type(got) is message_type
        assert got == expected
    return got


contents = st.binary(min_size=0, max_size=3000)
deltas = st.one_of(st.just(0), st.integers(1, INT64_MAX), st.integers(-(1 << 63), -1))


@settings(max_examples=300, deadline=None)
@given(
    content=contents, delta=deltas, acknowledge=st.booleans(), journal=st.sampled_from(["", "a/b"])
)
def test_replicate_requests_decode_as_protobuf_parses_them(
    content: bytes, delta: int, acknowledge: bool, journal: str
) -> None:
    req = pb.ReplicateRequest(content=content, content_delta=delta, acknowledge=acknowledge)
    if journal:
        req.proposal.journal = journal
    got = assert_same_as_protobuf(
        decode_replicate_request, pb.ReplicateRequest, req.SerializeToString()
    )
    # The fast path takes exactly the messages the pipeline sends for content.
    fast = bool(content) and delta >= 0 and not acknowledge and not journal
    assert isinstance(got, ContentChunk) == fast


@settings(max_examples=300, deadline=None)
@given(content=contents, offset=st.integers(0, 5), journal=st.sampled_from(["", "a/b"]))
def test_append_requests_decode_as_protobuf_parses_them(
    content: bytes, offset: int, journal: str
) -> None:
    req = pb.AppendRequest(content=content, offset=offset, journal=journal)
    got = assert_same_as_protobuf(decode_append_request, pb.AppendRequest, req.SerializeToString())
    assert isinstance(got, ContentChunk) == (bool(content) and not offset and not journal)


@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=64))
def test_arbitrary_bytes_decode_as_protobuf_parses_them(data: bytes) -> None:
    for decode, message_type in DECODERS:
        assert_same_as_protobuf(decode, message_type, data)


@settings(max_examples=300, deadline=None)
@given(content=st.binary(min_size=1, max_size=300), cut=st.integers(0, 400), flip=st.integers())
def test_damaged_content_messages_decode_as_protobuf_parses_them(
    content: bytes, cut: int, flip: int
) -> None:
    # Truncated and bit-flipped encodings of real content messages: near the fast path's
    # boundaries, where a hand-written reader would go wrong.
    for wire, (decode, message_type) in zip(
        [encode_append_content(content), encode_replicate_content(content, 5)],
        DECODERS,
        strict=True,
    ):
        assert_same_as_protobuf(decode, message_type, wire[: cut % (len(wire) + 1)])
        damaged = bytearray(wire)
        damaged[flip % len(damaged)] ^= 1 << (flip % 8)
        assert_same_as_protobuf(decode, message_type, bytes(damaged))


@pytest.mark.parametrize(
    "wire",
    [
        b"\x22\x83\x00abc",  # A length in a non-canonical (padded) varint.
        b"\x22\x03abc\x22\x02de",  # Content twice: protobuf keeps the last.
        b"\x22\x03abc\x28\x00",  # A zero delta written out.
        b"\x22\x03abc\x28\x05\x28\x06",  # The delta twice.
        b"\x28\x05\x22\x03abc",  # Fields out of order.
        b"\x22\x03abc\x28" + b"\xff" * 9 + b"\x01",  # A negative delta (ten-byte varint).
        b"\x22\x03abc\x30\x01",  # An acknowledge flag after the content.
        b"\x22\x03ab",  # Cut short.
        b"\x22" + b"\xff" * 10 + b"\x01",  # An overlong length.
    ],
)
def test_hand_made_encodings_decode_as_protobuf_parses_them(wire: bytes) -> None:
    for decode, message_type in DECODERS:
        assert_same_as_protobuf(decode, message_type, wire)


def test_a_content_chunk_is_a_view_of_the_received_bytes() -> None:
    wire = encode_replicate_content(b"x" * 100_000, 42)
    chunk = decode_replicate_request(wire)
    assert isinstance(chunk, ContentChunk)
    assert chunk.wire is wire
    assert chunk.content.obj is wire  # No copy.
    assert (len(chunk.content), chunk.content_delta) == (100_000, 42)


def test_a_content_chunk_reads_like_its_message() -> None:
    chunk = decode_replicate_request(encode_replicate_content(b"abc", 7))
    assert isinstance(chunk, ContentChunk)
    # Fields and methods other than content come from the parsed message.
    assert not chunk.HasField("header")
    assert not chunk.HasField("proposal")
    assert chunk.acknowledge is False
    assert chunk.message() == pb.ReplicateRequest(content=b"abc", content_delta=7)
    assert chunk.message() is chunk.message()  # Parsed once.
    append = decode_append_request(encode_append_content(b"abc"))
    assert isinstance(append, ContentChunk)
    assert append.journal == ""
    assert append.SerializeToString() == encode_append_content(b"abc")
    with pytest.raises(AttributeError):
        _ = append.no_such_field


def test_the_broker_registers_its_deserializers_for_append_and_replicate_only() -> None:
    handlers = journal_method_handlers(pbg.JournalServicer())
    assert handlers["Append"].request_deserializer is decode_append_request
    assert handlers["Replicate"].request_deserializer is decode_replicate_request
    assert handlers["Read"].request_deserializer == pb.ReadRequest.FromString
    assert handlers["Append"].request_streaming and not handlers["Append"].response_streaming
    assert handlers["Replicate"].request_streaming and handlers["Replicate"].response_streaming
    expected = {"List", "Apply", "Read", "Append", "Replicate", "ListFragments"}
    assert expected <= set(handlers)


class _Echo(pbg.JournalServicer):  # type: ignore[misc]
    """Answers each Append with what it received: the types and content of its messages."""

    async def Append(self, requests: Any, context: Any) -> pb.AppendResponse:
        kinds, content = [], b""
        async for req in requests:
            kinds.append("chunk" if isinstance(req, ContentChunk) else "message")
            content += bytes(req.content)
        return pb.AppendResponse(
            registers=pb.LabelSet(labels=[pb.Label(name="k", value=",".join(kinds))]),
            commit=pb.Fragment(journal=content.decode()),
        )


async def test_a_served_append_receives_content_chunks() -> None:
    server = grpc.aio.server()
    add_journal_service(_Echo(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = pbg.JournalStub(channel).Append()
            for req in [
                pb.AppendRequest(journal="a/b"),
                pb.AppendRequest(content=b"hello "),
                pb.AppendRequest(content=b"world"),
                pb.AppendRequest(),
            ]:
                await call.write(req)
            await call.done_writing()
            resp = await call
    finally:
        await server.stop(0)
    assert resp.registers.labels[0].value == "message,chunk,chunk,message"
    assert resp.commit.journal == "hello world"
