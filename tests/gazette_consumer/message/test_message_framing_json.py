"""JSON lines framing: Gazette's json_framing_test.go fixtures, bounds and error paths."""

from __future__ import annotations

from uuid import UUID

import msgspec
import pytest

from gazette_consumer.message.framing import (
    FeedOffsetError,
    Frame,
    FrameTooLargeError,
    MessageDecodeError,
    MessageEncodeError,
    MessageTooLargeError,
    TruncatedFrameError,
)
from gazette_consumer.message.json_framing import JSONFraming, JSONMessage
from gazette_consumer.message.message import Message
from gazette_consumer.message.uuid import NIL_UUID

JOURNAL = "a/journal"


class AB(msgspec.Struct):
    A: int
    B: str


class OnlyB(msgspec.Struct):
    B: str


def test_marshal_fixtures() -> None:
    framing = JSONFraming()
    buf = bytearray()
    assert framing.marshal_into(AB(42, "the answer"), buf) == 26
    assert bytes(buf) == b'{"A":42,"B":"the answer"}\n'
    # A second message appends after the first.
    framing.marshal_into({"Bar": 63}, buf)
    assert bytes(buf) == b'{"A":42,"B":"the answer"}\n{"Bar":63}\n'


def test_marshal_error_names_the_type_and_changes_nothing() -> None:
    buf = bytearray(b"before")
    with pytest.raises(MessageEncodeError, match="object message is not JSON-encodable"):
        JSONFraming().marshal_into(object(), buf)
    assert buf == b"before"


def test_marshal_refuses_messages_above_message_bytes_max() -> None:
    framing = JSONFraming(message_bytes_max=12)
    assert framing.marshal({"a": "1234"}) == b'{"a":"1234"}\n'  # 12 bytes, newline excluded.
    buf = bytearray(b"before")
    with pytest.raises(
        MessageTooLargeError, match="encodes to 13 bytes, above message_bytes_max 12"
    ):
        framing.marshal_into({"a": "12345"}, buf)
    assert buf == b"before"


def test_decode_fixture() -> None:
    framing = JSONFraming()
    fixture = b'{"A":42,"B":"test message content"}\n'
    events = framing.unpack(JOURNAL, 100, fixture)
    assert events == [Frame(fixture, 100, 100 + len(fixture), JOURNAL)]
    frame = events[0]
    assert isinstance(frame, Frame)
    assert framing.new_decoder(OnlyB).decode(frame) == OnlyB("test message content")


def test_missing_trailing_newline_is_a_truncated_frame() -> None:
    framing = JSONFraming()
    unpacker = framing.new_unpacker(JOURNAL, 7)
    assert unpacker.feed(b'{"A":42,"B":"missing trailing newline"}', 7) == []
    assert unpacker.buffered_bytes == 39
    [error] = unpacker.flush()
    assert isinstance(error, TruncatedFrameError)
    assert (error.journal, error.begin, error.end) == (JOURNAL, 7, 46)
    assert unpacker.offset == 46


def test_malformed_json_raises_naming_journal_and_offset() -> None:
    framing = JSONFraming()
    fixture = b'{"A":42,"B":"missing quote but including newline}\nextra'
    unpacker = framing.new_unpacker(JOURNAL, 1000)
    [frame] = unpacker.feed(fixture, 1000)
    assert isinstance(frame, Frame)
    assert frame.end - frame.begin == len(fixture) - len("extra")
    assert unpacker.buffered_bytes == len("extra")

    with pytest.raises(MessageDecodeError) as caught:
        framing.new_decoder(OnlyB).decode(frame)
    assert (caught.value.journal, caught.value.begin) == (JOURNAL, 1000)
    assert str(caught.value).startswith(f"journal {JOURNAL} offsets [1000, 1050): malformed JSON")


def test_schema_mismatch_is_a_decode_error() -> None:
    [frame] = JSONFraming().unpack(JOURNAL, 0, b'{"A":"not an int","B":"x"}\n')
    assert isinstance(frame, Frame)
    with pytest.raises(MessageDecodeError, match=r"Expected `int`, got `str` - at `\$.A`"):
        JSONFraming().new_decoder(AB).decode(frame)


def test_over_long_lines_are_skipped_and_reading_continues() -> None:
    framing = JSONFraming(message_bytes_max=8)
    ok1, big, ok2 = b'{"a":1}\n', b'{"a":"0123456789"}\n', b'{"b":22}\n'
    # In one feed.
    events = framing.unpack(JOURNAL, 0, ok1 + big + ok2)
    assert [type(e) for e in events] == [Frame, FrameTooLargeError, Frame]
    error = events[1]
    assert isinstance(error, FrameTooLargeError)
    assert (error.begin, error.end) == (8, 8 + len(big))
    assert events[2] == Frame(ok2, 8 + len(big), 8 + len(big) + len(ok2), JOURNAL)

    # Byte by byte: the unpacker stops buffering once a line is already too long.
    unpacker = framing.new_unpacker(JOURNAL, 0)
    events = []
    for i, byte in enumerate(ok1 + big + ok2):
        events.extend(unpacker.feed(bytes([byte]), i))
        assert unpacker.buffered_bytes <= 9
    assert [type(e) for e in events] == [Frame, FrameTooLargeError, Frame]
    assert events[1].begin == 8 and events[1].end == 8 + len(big)


def test_over_long_line_at_end_of_input() -> None:
    framing = JSONFraming(message_bytes_max=4)
    [error] = framing.unpack(JOURNAL, 10, b"0123456789")
    assert isinstance(error, FrameTooLargeError)
    assert (error.begin, error.end) == (10, 20)


def test_message_at_exactly_message_bytes_max_is_accepted() -> None:
    framing = JSONFraming(message_bytes_max=7)
    frame = framing.marshal({"a": 1})
    assert frame == b'{"a":1}\n'
    assert framing.unpack(JOURNAL, 0, frame) == [Frame(frame, 0, 8, JOURNAL)]


def test_offset_jump_drops_the_partial_frame() -> None:
    unpacker = JSONFraming().new_unpacker(JOURNAL, 0)
    assert unpacker.feed(b'{"a":', 0) == []
    events = unpacker.feed(b'{"b":2}\n', 50)
    assert [type(e) for e in events] == [TruncatedFrameError, Frame]
    assert (events[0].begin, events[0].end) == (0, 5)
    assert events[1] == Frame(b'{"b":2}\n', 50, 58, JOURNAL)


def test_feeding_an_offset_already_passed_raises_and_changes_nothing() -> None:
    unpacker = JSONFraming().new_unpacker(JOURNAL, 10)
    unpacker.feed(b'{"a"', 10)
    with pytest.raises(FeedOffsetError, match="fed offset 12, but expected offset 14"):
        unpacker.feed(b":1}\n", 12)
    assert unpacker.offset == 14
    assert unpacker.feed(b":1}\n", 14) == [Frame(b'{"a":1}\n', 10, 18, JOURNAL)]


class Sum(JSONMessage):
    ID: list[int] = msgspec.field(default_factory=list)
    SeqNo: int = 0
    Value: int = 0


class Chunk(JSONMessage):
    SeqNo: int


def test_json_message_carries_its_uuid_under_gazettes_key() -> None:
    framing = JSONFraming()
    u = UUID("83fc2f81-cc5f-11e9-8aaa-010203040506")
    message = Sum(SeqNo=3, Value=99)
    assert isinstance(message, Message)
    assert message.get_uuid() is None
    message.set_uuid(u)
    assert message.get_uuid() == u
    assert framing.marshal(message) == (
        b'{"ID":[],"SeqNo":3,"Value":99,"UUID":"83fc2f81-cc5f-11e9-8aaa-010203040506"}\n'
    )

    # A message as Gazette's Go stream-sum example writes it.
    go_written = b'{"UUID":"83fc2f81-cc5f-11e9-8aaa-010203040506","ID":[1,2],"SeqNo":4,"Value":7}\n'
    [frame] = framing.unpack(JOURNAL, 0, go_written)
    assert isinstance(frame, Frame)
    assert framing.new_decoder(Sum).decode(frame) == Sum(uuid=u, ID=[1, 2], SeqNo=4, Value=7)


def test_unset_json_message_uuid_encodes_as_gos_zero_value() -> None:
    encoded = JSONFraming().marshal(Sum())
    assert b'"UUID":"00000000-0000-0000-0000-000000000000"' in encoded
    assert Sum(uuid=NIL_UUID).get_uuid() is None


def test_json_message_acknowledgements() -> None:
    ack = Sum(SeqNo=5).new_acknowledgement(JOURNAL)
    assert ack == Sum()
    with pytest.raises(TypeError, match="Chunk has required fields, so it must override"):
        Chunk(SeqNo=1).new_acknowledgement(JOURNAL)
