"""CSV framing: Gazette's csv_framing_test.go fixtures and Go encoding/csv compatibility."""

from __future__ import annotations

from uuid import UUID

import pytest

from gazette_consumer.message.csv_framing import CSVFraming, CSVRecord
from gazette_consumer.message.framing import (
    Frame,
    FrameTooLargeError,
    MessageDecodeError,
    MessageEncodeError,
    MessageTooLargeError,
    TruncatedFrameError,
    UnpackEvent,
)
from gazette_consumer.message.message import Message

JOURNAL = "a/journal"
U = "83fc2f81-cc5f-11e9-8aaa-010203040506"


def frames(data: bytes, offset: int = 0) -> list[Frame]:
    events = CSVFraming().unpack(JOURNAL, offset, data)
    assert all(isinstance(e, Frame) for e in events), events
    return [e for e in events if isinstance(e, Frame)]


def test_marshal_fixtures() -> None:
    framing = CSVFraming()
    buf = bytearray()
    framing.marshal_into(CSVRecord([U, "123", 'qu"ote']), buf)
    assert bytes(buf) == f'{U},123,"qu""ote"\n'.encode()
    framing.marshal_into(CSVRecord([U, "567,891"]), buf)
    assert bytes(buf) == f'{U},123,"qu""ote"\n{U},"567,891"\n'.encode()


@pytest.mark.parametrize(
    ("fields", "encoded"),
    [
        (["a", "", "b"], b"a,,b\n"),
        (["", ""], b",\n"),
        (["line\nbreak", "cr\rhere"], b'"line\nbreak","cr\rhere"\n'),
        ([" lead", "\tlead", "trail "], b'" lead","\tlead",trail \n'),
        (["\\.", "\\.x"], b'"\\.",\\.x\n'),
        # Go's unicode.IsSpace, not str.isspace: U+001F is not a space, U+3000 is.
        (["\x1fa", "\u3000b"], '\x1fa,"\u3000b"\n'.encode()),
        (["é", "☃"], "é,☃\n".encode()),
    ],
)
def test_marshal_quotes_exactly_like_go(fields: list[str], encoded: bytes) -> None:
    assert CSVFraming().marshal(fields) == encoded
    [frame] = frames(encoded)
    assert CSVFraming().new_decoder(list).decode(frame) == fields


@pytest.mark.parametrize("message", [[], [""], CSVRecord([""])])
def test_marshal_refuses_records_that_would_be_empty_lines(message: list[str]) -> None:
    with pytest.raises(MessageEncodeError, match="would be an empty line"):
        CSVFraming().marshal(message)


def test_marshal_refuses_non_string_fields_and_oversized_records() -> None:
    buf = bytearray()
    with pytest.raises(MessageEncodeError, match="field 1 is int, expected str"):
        CSVFraming().marshal_into(["a", 1], buf)
    with pytest.raises(MessageEncodeError, match="list message is not UTF-8 encodable"):
        CSVFraming().marshal_into(["a", "\ud800"], buf)
    with pytest.raises(MessageEncodeError, match="dict is not CSV-frameable"):
        CSVFraming().marshal_into({"a": "b"}, buf)
    with pytest.raises(MessageTooLargeError, match="encodes to 4 bytes, above message_bytes_max 3"):
        CSVFraming(message_bytes_max=3).marshal_into(["a", "b", ""], buf)
    assert buf == b""
    assert CSVFraming(message_bytes_max=3).marshal(["a", "b"]) == b"a,b\n"


def test_decode_fixture() -> None:
    fixture = f"{U},bar,baz\n".encode()
    [frame] = frames(fixture, 33)
    assert frame == Frame(fixture, 33, 33 + len(fixture), JOURNAL)
    record = CSVFraming().new_decoder(CSVRecord).decode(frame)
    assert record == CSVRecord([U, "bar", "baz"])
    assert isinstance(record, CSVRecord)
    assert isinstance(record, Message)
    assert record.get_uuid() == UUID(U)


def test_errors_if_field_count_changes() -> None:
    decoder = CSVFraming().new_decoder(CSVRecord)
    first, second = frames(f"{U},foo,bar\n{U},baz\n".encode())
    assert decoder.decode(first) == [U, "foo", "bar"]
    with pytest.raises(MessageDecodeError, match="wrong number of fields: 2, expected 3"):
        decoder.decode(second)


def test_decode_error_names_journal_and_offset() -> None:
    [frame] = frames(b"not-a-uuid, bar, baz\n", 500)
    with pytest.raises(MessageDecodeError) as caught:
        CSVFraming().new_decoder(CSVRecord).decode(frame)
    assert (caught.value.journal, caught.value.begin, caught.value.end) == (JOURNAL, 500, 521)
    assert "first field 'not-a-uuid' is not a UUID" in str(caught.value)


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (b'a"b,c\n', 'bare " in non-quoted-field'),
        (b'"ab"c,d\n', 'extraneous or missing " in quoted-field'),
        (b"\xff\xfe,x\n", "can't decode byte 0xff"),
    ],
)
def test_malformed_records(record: bytes, reason: str) -> None:
    [frame] = frames(record)
    with pytest.raises(MessageDecodeError, match=reason):
        CSVFraming().new_decoder(list).decode(frame)


def test_quoted_fields_span_lines_and_crlf_is_normalized() -> None:
    data = b'a,"multi\r\nline ""x"", y"\r\n\n\r\nb,c\n'
    first, second = frames(data)
    assert first == Frame(b'a,"multi\r\nline ""x"", y"\r\n', 0, 26, JOURNAL)
    # The empty lines between records hold no record, as in Go's reader.
    assert (second.begin, second.end) == (29, 33)
    decoder = CSVFraming().new_decoder(list)
    assert decoder.decode(first) == ["a", 'multi\nline "x", y']
    assert decoder.decode(second) == ["b", "c"]


def test_escaped_quote_split_across_feeds() -> None:
    unpacker = CSVFraming().new_unpacker(JOURNAL, 0)
    # The quote at the end of the first chunk could close the field or escape the next byte.
    assert unpacker.feed(b'"a"', 0) == []
    assert unpacker.feed(b'"\nb"', 3) == []
    [frame] = unpacker.feed(b"\n", 7)
    assert frame == Frame(b'"a""\nb"\n', 0, 8, JOURNAL)
    assert isinstance(frame, Frame)
    assert CSVFraming().new_decoder(list).decode(frame) == ['a"\nb']


def test_missing_final_newline_is_a_truncated_frame() -> None:
    [error] = CSVFraming().unpack(JOURNAL, 4, b"a,b")
    assert isinstance(error, TruncatedFrameError)
    assert (error.begin, error.end) == (4, 7)


def test_over_long_records_are_skipped_even_inside_quotes() -> None:
    framing = CSVFraming(message_bytes_max=6)
    big = b'x,"long\nquoted\nfield",y\n'
    data = b"a,b\n" + big + b"c,d\n"
    expect = [(Frame, 0, 4), (FrameTooLargeError, 4, 4 + len(big)), (Frame, 4 + len(big), 32)]

    events = framing.unpack(JOURNAL, 0, data)
    assert [(type(e), e.begin, e.end) for e in events] == expect

    unpacker = framing.new_unpacker(JOURNAL, 0)
    events = []
    for i, byte in enumerate(data):
        events.extend(unpacker.feed(bytes([byte]), i))
        assert unpacker.buffered_bytes <= 7
    assert [(type(e), e.begin, e.end) for e in events] == expect


def test_over_long_record_at_end_of_input() -> None:
    [error] = CSVFraming(message_bytes_max=2).unpack(JOURNAL, 0, b'"abc')
    assert isinstance(error, FrameTooLargeError)
    assert (error.begin, error.end) == (0, 4)


def test_csv_record_uuid_and_acknowledgement() -> None:
    record = CSVRecord(["", "x", "y"])
    assert record.get_uuid() is None
    record.set_uuid(UUID(U))
    assert record == [U, "x", "y"]
    ack = record.new_acknowledgement(JOURNAL)
    assert ack == ["", "", ""]
    empty = CSVRecord()
    empty.set_uuid(UUID(U))
    assert empty == [U]


def test_decoder_requires_a_csv_type() -> None:
    with pytest.raises(TypeError, match="dict cannot be decoded from CSV"):
        CSVFraming().new_decoder(dict)


def test_unpacker_events_in_chunks_match_one_shot() -> None:
    data = f'{U},"x\ny",z\n{U},"",""\n'.encode()
    one_shot = CSVFraming().unpack(JOURNAL, 0, data)
    unpacker = CSVFraming().new_unpacker(JOURNAL, 0)
    events: list[UnpackEvent] = []
    for at in range(0, len(data), 5):
        events.extend(unpacker.feed(data[at : at + 5], at))
    events.extend(unpacker.flush())
    assert events == one_shot
    assert len(one_shot) == 2
