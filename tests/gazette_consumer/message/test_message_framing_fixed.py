"""Fixed protobuf framing: Gazette's fixed_framing_test.go fixtures, resync and bounds."""

from __future__ import annotations

import pytest
from google.protobuf.wrappers_pb2 import StringValue

from gazette_consumer.message.framing import (
    Frame,
    FrameDesyncError,
    MessageDecodeError,
    MessageEncodeError,
    MessageTooLargeError,
    TruncatedFrameError,
    UnpackEvent,
)
from gazette_consumer.message.protobuf_framing import FixedFraming

JOURNAL = "a/journal"

# "test message content" (20 bytes) in a fixed frame, byte for byte as Gazette's tests spell it.
TEST_FRAME = bytes([0x66, 0x33, 0x93, 0x36, 0x14, 0x0, 0x0, 0x0]) + b"test message content"


def test_marshal_fixtures() -> None:
    framing = FixedFraming()
    buf = bytearray()
    assert framing.marshal_into(b"test message content", buf) == 28
    assert bytes(buf) == TEST_FRAME
    framing.marshal_into(b"foo message", buf)
    assert bytes(buf) == TEST_FRAME + bytes([0x66, 0x33, 0x93, 0x36, 0xB, 0, 0, 0]) + b"foo message"
    assert framing.marshal(b"foo") == bytes([0x66, 0x33, 0x93, 0x36, 0x03, 0, 0, 0]) + b"foo"


def test_marshal_protobuf_message() -> None:
    message = StringValue(value="hi")
    assert FixedFraming().marshal(message) == b"\x66\x33\x93\x36\x04\x00\x00\x00\x0a\x02hi"


def test_marshal_errors_change_nothing() -> None:
    framing = FixedFraming(message_bytes_max=3)
    buf = bytearray(b"x")
    with pytest.raises(MessageTooLargeError, match="encodes to 4 bytes, above message_bytes_max 3"):
        framing.marshal_into(b"four", buf)
    with pytest.raises(MessageEncodeError, match="str is not fixed-frameable"):
        framing.marshal_into("text", buf)
    assert buf == b"x"


def test_decode_fixture_with_trailing_garbage() -> None:
    framing = FixedFraming()
    events = framing.unpack(JOURNAL, 0, TEST_FRAME + b"extra")
    assert events[0] == Frame(TEST_FRAME, 0, 28, JOURNAL)
    assert isinstance(events[0], Frame)
    assert framing.new_decoder(bytes).decode(events[0]) == b"test message content"
    # "extra" cannot begin a header, so it is a de-synchronized run, reported once.
    [desync] = events[1:]
    assert isinstance(desync, FrameDesyncError)
    assert (desync.begin, desync.end) == (28, 33)


def test_decode_protobuf_message_and_decode_errors() -> None:
    framing = FixedFraming()
    decoder = framing.new_decoder(StringValue)
    [frame] = framing.unpack(JOURNAL, 0, framing.marshal(StringValue(value="hi")))
    assert isinstance(frame, Frame)
    assert decoder.decode(frame) == StringValue(value="hi")

    # A well-framed payload that is not a StringValue: field 1 claims 5 bytes but has 2.
    [bad] = framing.unpack(JOURNAL, 40, framing.marshal(b"\x0a\x05ab"))
    assert isinstance(bad, Frame)
    with pytest.raises(MessageDecodeError) as caught:
        decoder.decode(bad)
    assert (caught.value.journal, caught.value.begin, caught.value.end) == (JOURNAL, 40, 52)
    assert "malformed protobuf message" in str(caught.value)


def test_decoder_verifies_the_frame_header() -> None:
    decoder = FixedFraming().new_decoder(bytes)
    with pytest.raises(MessageDecodeError, match="does not begin with the magic word"):
        decoder.decode(Frame(b"garbage!!", 5, 14, JOURNAL))
    with pytest.raises(MessageDecodeError, match="header length 20 != payload length 19"):
        decoder.decode(Frame(TEST_FRAME[:-1], 5, 32, JOURNAL))
    with pytest.raises(TypeError, match="str cannot be decoded from fixed frames"):
        FixedFraming().new_decoder(str)


def test_desync_handling() -> None:
    events = FixedFraming().unpack(JOURNAL, 0, b"foobar" + TEST_FRAME)
    assert [type(e) for e in events] == [FrameDesyncError, Frame]
    assert (events[0].begin, events[0].end) == (0, 6)
    assert events[1] == Frame(TEST_FRAME, 6, 34, JOURNAL)
    assert str(events[0]) == (
        f"journal {JOURNAL} offsets [0, 6): skipped bytes not at a fixed-frame boundary"
    )


@pytest.mark.parametrize(
    ("data", "expect"),
    [
        # Input ends partway through the header, just after it, or inside the payload.
        (TEST_FRAME[:7], [(TruncatedFrameError, 0, 7)]),
        (TEST_FRAME[:8], [(TruncatedFrameError, 0, 8)]),
        (TEST_FRAME[:19], [(TruncatedFrameError, 0, 19)]),
        # Ends while scanning for a header after de-synchronized bytes.
        (b"foo" + TEST_FRAME[:3], [(FrameDesyncError, 0, 6)]),
        (b"", []),
    ],
)
def test_incomplete_input(data: bytes, expect: list[tuple[type, int, int]]) -> None:
    events = FixedFraming().unpack(JOURNAL, 0, data)
    assert [(type(e), e.begin, e.end) for e in events] == expect


def test_long_desync_run_fed_in_small_chunks_is_one_event() -> None:
    # Gazette's underflow case: 21 bytes of junk, then a frame, read 16 bytes at a time.
    data = b"x" * 21 + TEST_FRAME
    unpacker = FixedFraming().new_unpacker(JOURNAL, 0)
    events: list[UnpackEvent] = []
    for at in range(0, len(data), 16):
        events.extend(unpacker.feed(data[at : at + 16], at))
        assert unpacker.buffered_bytes < len(TEST_FRAME)
    events.extend(unpacker.flush())
    assert [type(e) for e in events] == [FrameDesyncError, Frame]
    assert (events[0].begin, events[0].end) == (0, 21)
    assert events[1] == Frame(TEST_FRAME, 21, 49, JOURNAL)


def test_length_above_message_bytes_max_is_treated_as_corruption() -> None:
    framing = FixedFraming(message_bytes_max=20)
    bogus_header = bytes([0x66, 0x33, 0x93, 0x36, 0xFF, 0xFF, 0xFF, 0x7F])
    events = framing.unpack(JOURNAL, 0, bogus_header + b"junk" + TEST_FRAME)
    assert [type(e) for e in events] == [FrameDesyncError, Frame]
    assert (events[0].begin, events[0].end) == (0, 12)
    assert events[1] == Frame(TEST_FRAME, 12, 40, JOURNAL)

    # One byte smaller a bound, and the fixture frame itself is corruption too.
    [only] = FixedFraming(message_bytes_max=19).unpack(JOURNAL, 0, TEST_FRAME)
    assert isinstance(only, FrameDesyncError)
    assert (only.begin, only.end) == (0, 28)


def test_large_frame_in_small_chunks_is_buffered_until_complete() -> None:
    payload = bytes(range(256)) * 64
    frame = FixedFraming().marshal(payload)
    unpacker = FixedFraming().new_unpacker(JOURNAL, 0)
    events: list[UnpackEvent] = []
    for at in range(0, len(frame), 7):
        events.extend(unpacker.feed(frame[at : at + 7], at))
    assert events == [Frame(frame, 0, len(frame), JOURNAL)]
    assert unpacker.flush() == []
