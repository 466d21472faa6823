"""The read path's fast path in the message layer: UUIDs parsed in cached halves, Envelopes built
a run at a time (`EnvelopeBuilder`), and JSON lines split a chunk at a time
(`JSONUnpacker.feed_run`). Each must give exactly what the general path gives, or decline."""

from __future__ import annotations

import itertools
from typing import Any
from uuid import UUID

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gazette_consumer.message.framing import Frame, UnpackEvent
from gazette_consumer.message.json_framing import JSONFraming, JSONMessage
from gazette_consumer.message.message import (
    UUID_ATTRIBUTE,
    Envelope,
    EnvelopeBuilder,
    message_uuid,
)
from gazette_consumer.message.uuid import (
    NIL_UUID,
    ProducerID,
    build_uuid,
    parse_uuid,
    uuid_high_clock,
    uuid_low_parts,
)

JOURNAL = "fast/journal"
LOW_64 = (1 << 64) - 1
LOW_32 = (1 << 32) - 1


class Event(JSONMessage, kw_only=True):
    text: str = ""


class Opaque:
    """A message type with its own get_uuid (no `uuid` attribute to read directly)."""

    def __init__(self, uuid: Any) -> None:
        self._uuid = uuid

    def get_uuid(self) -> Any:
        return self._uuid


producers = st.binary(min_size=6, max_size=6).map(ProducerID)
clocks = st.integers(0, (1 << 64) - 1)
flags = st.integers(0, 0x3FF)
gazette_uuids = st.builds(build_uuid, producers, clocks, flags)
any_uuids = st.one_of(gazette_uuids, st.integers(0, (1 << 128) - 1).map(lambda v: UUID(int=v)))


@given(any_uuids)
def test_uuid_halves_parse_as_parse_uuid_does(u: UUID) -> None:
    low, mid = uuid_low_parts(u.int & LOW_64), uuid_high_clock((u.int >> 64) & LOW_32)
    try:
        parts = parse_uuid(u)
    except ValueError:
        assert low is None or mid is None  # Refused by at least one half.
        return
    assert low is not None and mid is not None
    producer, sequence, flag_bits = low
    assert (producer, mid | (u.int >> 96) << 4 | sequence, flag_bits) == tuple(parts)


@given(st.lists(st.one_of(gazette_uuids, st.just(NIL_UUID), st.none()), max_size=40))
def test_builder_builds_what_envelope_of_builds(uuids: list[UUID | None]) -> None:
    messages = [Event(uuid=u or NIL_UUID, text=str(i)) for i, u in enumerate(uuids)]
    offsets = list(itertools.accumulate((3 + i % 5 for i in range(len(messages))), initial=7))
    expected = [
        Envelope.of(JOURNAL, b, e, m)
        for m, (b, e) in zip(messages, itertools.pairwise(offsets), strict=True)
    ]
    # The JSON decoder's getter is UUID_ATTRIBUTE: the builder reads the attribute inline.
    assert JSONFraming().new_decoder(Event).uuid_of is UUID_ATTRIBUTE
    for uuid_of in (message_uuid, UUID_ATTRIBUTE):
        # Tiny caches: entries are evicted (the caches cleared) all the time.
        for builder in (EnvelopeBuilder(uuid_of), EnvelopeBuilder(uuid_of, cache_entries_max=1)):
            assert builder.build(JOURNAL, offsets, messages) == expected
            # Again, from the parts cached the first time (clocks from the cached bases).
            assert builder.build(JOURNAL, offsets, messages) == expected


def test_builder_declines_what_envelope_of_must_report() -> None:
    good = build_uuid(ProducerID(b"\x01" * 6), 99, 1)
    v4 = UUID("9f1e0a52-36c2-4e4f-8d4c-6fd26b1c1a1e")  # Version 4.
    bad_variant = UUID(int=good.int & ~(0b11 << 62))  # NCS variant.
    for bad in (v4, bad_variant, "not a UUID", 12):
        builder = EnvelopeBuilder()
        assert builder.build(JOURNAL, [0, 5, 9], [Opaque(good), Opaque(bad)]) is None
        with pytest.raises(ValueError):  # InvalidEnvelopeError or InvalidUUIDError.
            Envelope.of(JOURNAL, 5, 9, Opaque(bad))
        # Nothing learned from the bad one: a good run afterwards still builds exactly.
        message = Opaque(good)
        assert builder.build(JOURNAL, [0, 5], [message]) == [Envelope.of(JOURNAL, 0, 5, message)]
    with pytest.raises(ValueError, match="offsets: 2 given for 2 messages"):
        EnvelopeBuilder().build(JOURNAL, [0, 5], [Opaque(good), Opaque(good)])
    with pytest.raises(ValueError, match="cache_entries_max"):
        EnvelopeBuilder(cache_entries_max=0)


def test_json_decoder_reads_the_uuid_attribute_only_when_get_uuid_is_the_base_one() -> None:
    class Custom(Event, kw_only=True):
        def get_uuid(self) -> UUID | None:
            return None  # Opts out, whatever its field holds.

    framing = JSONFraming()
    assert framing.new_decoder(Event).uuid_of is not message_uuid
    assert framing.new_decoder(Custom).uuid_of is message_uuid
    assert framing.new_decoder(dict).uuid_of is message_uuid
    u = build_uuid(ProducerID(b"\x01" * 6), 5, 0)
    [env] = EnvelopeBuilder(framing.new_decoder(Custom).uuid_of).build(
        JOURNAL, [0, 1], [Custom(uuid=u)]
    )
    assert env.uuid is None and env.clock == 0


# -- JSONUnpacker.feed_run -----------------------------------------------------------------------

lines = st.lists(
    st.one_of(
        st.text(alphabet='ab{}"\r', max_size=12).map(str.encode),  # Anything but a newline.
        st.just(b""),  # An empty line.
        st.just(b"x" * 40),  # Over message_bytes_max below.
    ),
    max_size=30,
)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def frames_of(events: list[UnpackEvent]) -> list[Any]:
    return [
        tuple(e) if isinstance(e, Frame) else (type(e).__name__, e.begin, e.end) for e in events
    ]


@given(lines, st.booleans(), st.lists(st.integers(min_value=0), max_size=12), st.booleans())
def test_feed_run_frames_exactly_as_feed_does(
    content: list[bytes], unterminated: bool, cuts: list[int], delimited: bool
) -> None:
    data = b"\n".join(content) + (b"" if unterminated else b"\n")
    framing = JSONFraming(message_bytes_max=32)
    general, fast = framing.new_unpacker(JOURNAL, 11), framing.new_unpacker(JOURNAL, 11)
    expected: list[UnpackEvent] = []
    got: list[UnpackEvent] = []
    for chunk in split(data, cuts):
        expected += general.feed(chunk, general.offset)
        offset = fast.offset
        run = fast.feed_run(chunk, offset, delimited=delimited)
        if run is None:
            assert fast.offset == offset  # Declined: nothing changed.
            got += fast.feed(chunk, offset)
        else:
            assert [len(p) + (0 if delimited else 1) for p in run.payloads] == [
                b - a for a, b in itertools.pairwise(run.offsets)
            ]
            # Delimited, each payload is its line and newline; else the line alone.
            bare = [p[:-1] if delimited else p for p in run.payloads]
            assert all(b"\n" not in p for p in bare)
            assert not delimited or all(p.endswith(b"\n") for p in run.payloads)
            got += run.frames(JOURNAL)
        assert (fast.offset, fast.buffered_bytes) == (general.offset, general.buffered_bytes)
    expected += general.flush()
    got += fast.flush()
    assert frames_of(got) == frames_of(expected)


def test_feed_run_declines_offset_jumps_and_chunks_without_a_newline() -> None:
    unpacker = JSONFraming().new_unpacker(JOURNAL, 0)
    assert unpacker.feed_run(b'{"a": 1}', 0) is None  # No newline: feed() buffers it.
    unpacker.feed(b'{"a": 1}', 0)
    assert unpacker.feed_run(b"\n", 50) is None  # A jump: feed() reports the cut frame.
    run = unpacker.feed_run(b'\n{"b"', 8)
    assert run is not None and run.frames(JOURNAL) == [Frame(b'{"a": 1}\n', 0, 9, JOURNAL)]
    assert (unpacker.offset, unpacker.buffered_bytes) == (13, 4)
