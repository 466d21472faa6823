"""Framing properties: any messages, fed in any chunking, come back with exact offsets; fixed
frames survive interleaved garbage; over-long messages are skipped without unbounded buffering."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from gazette_consumer.message.csv_framing import CSVFraming
from gazette_consumer.message.framing import (
    Frame,
    FrameDesyncError,
    FrameTooLargeError,
    Framing,
    TruncatedFrameError,
    UnpackEvent,
)
from gazette_consumer.message.json_framing import JSONFraming
from gazette_consumer.message.protobuf_framing import MAGIC_WORD, FixedFraming

JOURNAL = "prop/journal"

cut_points = st.lists(st.integers(min_value=0), max_size=12)
start_offsets = st.integers(min_value=0, max_value=1 << 40)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """Split ``data`` at the cut points (folded into range), so chunks may be any size."""
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def feed_all(framing: Framing, offset: int, chunks: list[bytes]) -> list[UnpackEvent]:
    unpacker = framing.new_unpacker(JOURNAL, offset)
    events: list[UnpackEvent] = []
    for chunk in chunks:
        events.extend(unpacker.feed(chunk, unpacker.offset))
        # Whatever the input, at most about one maximal frame is ever held back.
        assert unpacker.buffered_bytes <= framing.message_bytes_max + 8
    events.extend(unpacker.flush())
    assert unpacker.buffered_bytes == 0
    return events


def assert_round_trip(
    framing: Framing, decode_type: Any, messages: list[Any], offset: int, cuts: list[int]
) -> list[Any]:
    encoded = [framing.marshal(m) for m in messages]
    events = feed_all(framing, offset, split(b"".join(encoded), cuts))

    assert all(isinstance(e, Frame) for e in events), events
    expect_begin = offset
    for event, frame_bytes in zip(events, encoded, strict=True):
        assert event == Frame(frame_bytes, expect_begin, expect_begin + len(frame_bytes), JOURNAL)
        expect_begin += len(frame_bytes)
    decoder = framing.new_decoder(decode_type)
    return [decoder.decode(e) for e in events if isinstance(e, Frame)]


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4)
    ),
    max_leaves=10,
)


@given(messages=st.lists(json_values, max_size=8), offset=start_offsets, cuts=cut_points)
def test_json_round_trips_in_any_chunking(
    messages: list[Any], offset: int, cuts: list[int]
) -> None:
    assert assert_round_trip(JSONFraming(), Any, messages, offset, cuts) == messages


@given(payloads=st.lists(st.binary(max_size=40), max_size=8), offset=start_offsets, cuts=cut_points)
def test_fixed_round_trips_in_any_chunking(
    payloads: list[bytes], offset: int, cuts: list[int]
) -> None:
    assert assert_round_trip(FixedFraming(), bytes, payloads, offset, cuts) == payloads


csv_field = st.text(
    alphabet=st.sampled_from(list('ab ,"\r\n\t\\.é')) | st.characters(codec="utf-8"), max_size=8
)


@given(
    records=st.integers(min_value=1, max_value=4).flatmap(
        lambda width: st.lists(
            st.lists(csv_field, min_size=width, max_size=width).filter(lambda r: r != [""]),
            max_size=6,
        )
    ),
    offset=start_offsets,
    cuts=cut_points,
)
def test_csv_round_trips_in_any_chunking(
    records: list[list[str]], offset: int, cuts: list[int]
) -> None:
    decoded = assert_round_trip(CSVFraming(), list, records, offset, cuts)
    # As with Go's reader, a CRLF line break inside a quoted field reads back as LF.
    assert decoded == [[f.replace("\r\n", "\n") for f in r] for r in records]


garbage = (
    st.binary(min_size=1, max_size=24)
    | st.lists(st.sampled_from([0x66, 0x33, 0x93, 0x36, 0x00, 0x0A]), min_size=1, max_size=24).map(
        bytes
    )
).filter(lambda g: MAGIC_WORD not in g)


@given(
    items=st.lists(st.tuples(st.one_of(st.just(b""), garbage), st.binary(max_size=24)), max_size=6),
    trailing=st.one_of(st.just(b""), garbage),
    offset=start_offsets,
    cuts=cut_points,
)
def test_fixed_frames_survive_interleaved_garbage(
    items: list[tuple[bytes, bytes]], trailing: bytes, offset: int, cuts: list[int]
) -> None:
    framing = FixedFraming()
    data = bytearray()
    expect: list[tuple[type, int, int]] = []
    for junk, payload in items:
        if junk:
            expect.append((FrameDesyncError, offset + len(data), offset + len(data) + len(junk)))
            data += junk
        frame = framing.marshal(payload)
        expect.append((Frame, offset + len(data), offset + len(data) + len(frame)))
        data += frame
    if trailing:
        expect.append((FrameDesyncError, offset + len(data), offset + len(data) + len(trailing)))
        data += trailing

    events = feed_all(framing, offset, split(bytes(data), cuts))

    got = [(type(e), e.begin, e.end) for e in events]
    if trailing and got and got[-1][0] is TruncatedFrameError:
        # Trailing junk that is a prefix of a header can only be told apart at end of input.
        assert MAGIC_WORD.startswith(trailing)
        got[-1] = (FrameDesyncError, *got[-1][1:])
    assert got == expect
    decoded = [framing.new_decoder(bytes).decode(e) for e in events if isinstance(e, Frame)]
    assert decoded == [payload for _, payload in items]


@given(
    sizes=st.lists(st.integers(min_value=0, max_value=40), max_size=8),
    offset=start_offsets,
    cuts=cut_points,
)
def test_over_long_json_lines_are_skipped_in_any_chunking(
    sizes: list[int], offset: int, cuts: list[int]
) -> None:
    bytes_max = 20
    lines = [b'"' + b"x" * size + b'"\n' for size in sizes]
    events = feed_all(
        JSONFraming(message_bytes_max=bytes_max), offset, split(b"".join(lines), cuts)
    )

    expect = []
    begin = offset
    for line in lines:
        kind = Frame if len(line) - 1 <= bytes_max else FrameTooLargeError
        expect.append((kind, begin, begin + len(line)))
        begin += len(line)
    assert [(type(e), e.begin, e.end) for e in events] == expect


@given(
    fields=st.lists(st.text(alphabet='ab,"\n', max_size=12), min_size=2, max_size=6),
    offset=start_offsets,
    cuts=cut_points,
)
def test_over_long_csv_records_are_skipped_in_any_chunking(
    fields: list[str], offset: int, cuts: list[int]
) -> None:
    bytes_max = 16
    # One record per field, each of two columns, so some quote newlines and some are too long.
    framing = CSVFraming(message_bytes_max=1 << 20)
    records = [framing.marshal([f, "z"]) for f in fields]
    events = feed_all(
        CSVFraming(message_bytes_max=bytes_max), offset, split(b"".join(records), cuts)
    )

    expect = []
    begin = offset
    for record in records:
        kind = Frame if len(record) - 1 <= bytes_max else FrameTooLargeError
        expect.append((kind, begin, begin + len(record)))
        begin += len(record)
    assert [(type(e), e.begin, e.end) for e in events] == expect
