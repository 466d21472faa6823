"""The sans-IO decoding core of the read iterators: chunks in, Envelopes out, unreadable content
skipped and logged, undecodable messages stopping the decoder with a typed error."""

from __future__ import annotations

import random
from typing import Any

import pytest
import structlog
from read_iter_testkit import ACK, CONTINUE, OUTSIDE, P1, FixedMsg, Msg, fixed, frames, msg

from broker.protocol import labels
from broker.protocol import protocol_pb2 as pb
from gazette_consumer.message import (
    FixedFraming,
    JSONFraming,
    MessageDecodeError,
    UnknownContentTypeError,
)
from gazette_consumer.sequencer.decode import (
    ChunkDecoder,
    MessageTypeError,
    framing_of,
    message_type_of,
    new_chunk_decoder,
    to_seq_envelope,
)

JOURNAL = "a/journal"


def json_decoder(offset: int = 0) -> ChunkDecoder:
    framing = JSONFraming()
    return ChunkDecoder(JOURNAL, offset, framing, framing.new_decoder(Msg))


def spec(content_type: str | None) -> pb.JournalSpec:
    out = pb.JournalSpec(name=JOURNAL)
    if content_type is not None:
        out.labels.CopyFrom(labels.label_set([(labels.CONTENT_TYPE, content_type)]))
    return out


def test_any_chunking_yields_the_same_envelopes_and_skips() -> None:
    content = (
        fixed(P1, 1, CONTINUE, "one")
        + b"junk"
        + fixed(P1, 2, CONTINUE, "two")
        + b"\x66\x33"  # Half a magic word, then garbage: one desync run.
        + b"more junk"
        + fixed(P1, 3, ACK)
    )
    framing = FixedFraming()
    rng = random.Random(7)
    for _ in range(50):
        decoder = ChunkDecoder(JOURNAL, 100, framing, framing.new_decoder(FixedMsg))
        cuts = sorted(rng.sample(range(1, len(content)), rng.randint(0, 12)))
        got = []
        with structlog.testing.capture_logs() as logs:
            for begin, end in zip([0, *cuts], [*cuts, len(content)], strict=True):
                got += decoder.feed(content[begin:end], 100 + begin)
            got += decoder.flush()
        assert [(e.message.text, e.clock, e.flags) for e in got] == [
            ("one", 1, CONTINUE),
            ("two", 2, CONTINUE),
            ("", 3, ACK),
        ]
        assert [(e["begin"], e["end"]) for e in logs if e["log_level"] == "error"] == [
            (got[0].end, got[1].begin),
            (got[1].end, got[2].begin),
        ]
        assert decoder.skipped_bytes == 4 + 2 + 9
        assert decoder.through == 100 + len(content)


def test_through_stops_before_a_partial_frame() -> None:
    one = frames(msg(P1, 1, OUTSIDE, "one"))
    two = frames(msg(P1, 2, OUTSIDE, "two"))
    decoder = json_decoder()
    assert [e.message.text for e in decoder.feed(one + two[:5], 0)] == ["one"]
    assert (decoder.through, decoder.offset) == (len(one), len(one) + 5)
    assert [e.message.text for e in decoder.feed(two[5:], len(one) + 5)] == ["two"]
    assert decoder.through == len(one) + len(two)


def test_an_offset_jump_drops_the_frame_it_cut_and_is_logged() -> None:
    one = frames(msg(P1, 1, OUTSIDE, "one"))
    later = frames(msg(P1, 9, OUTSIDE, "later"))
    decoder = json_decoder()
    with structlog.testing.capture_logs() as logs:
        assert decoder.feed(one[:4], 0) == []
        [env] = decoder.feed(later, 1000)
    assert (env.message.text, env.begin, env.end) == ("later", 1000, 1000 + len(later))
    assert [(e["event"], e["log_level"]) for e in logs] == [
        ("source journal offset jump", "warning"),
        ("skipped unreadable journal content", "error"),
    ]
    assert (logs[0]["from"], logs[0]["to"]) == (4, 1000)
    assert (logs[1]["begin"], logs[1]["end"], logs[1]["kind"]) == (0, 4, "TruncatedFrameError")


def test_an_undecodable_message_stops_the_decoder_after_the_good_ones() -> None:
    good = frames(msg(P1, 1, OUTSIDE, "good"))
    bad = b"[1, 2]\n"
    decoder = json_decoder(10)
    assert [e.message.text for e in decoder.feed(good + bad + good, 10)] == ["good"]
    error = decoder.error
    assert isinstance(error, MessageDecodeError)
    assert (error.journal, error.begin, error.end) == (JOURNAL, 10 + len(good), 10 + len(good) + 7)
    assert decoder.through == 10 + len(good)
    for call in (lambda: decoder.feed(good, 100), decoder.flush):
        with pytest.raises(MessageDecodeError) as caught:
            call()
        assert caught.value is error


def test_a_message_type_rejecting_a_uuid_is_a_decode_error() -> None:
    class BadUUID(Msg, kw_only=True):
        def get_uuid(self) -> object:  # type: ignore[override]
            return "not a UUID"

    framing = JSONFraming()
    decoder = ChunkDecoder(JOURNAL, 0, framing, framing.new_decoder(BadUUID))
    assert decoder.feed(b'{"text": "x"}\n', 0) == []
    assert isinstance(decoder.error, MessageDecodeError)
    assert "offsets [0, 14)" in str(decoder.error) and "get_uuid" in str(decoder.error)


def test_framing_and_message_type_from_the_spec() -> None:
    assert isinstance(framing_of(spec("application/x-ndjson")), JSONFraming)
    assert isinstance(framing_of(spec("application/x-protobuf-fixed")), FixedFraming)
    with pytest.raises(UnknownContentTypeError, match=f"journal {JOURNAL}: .*''"):
        framing_of(spec(None))
    assert message_type_of(Msg, spec(None)) is Msg
    assert message_type_of(lambda s: FixedMsg, spec(None)) is FixedMsg
    with pytest.raises(MessageTypeError, match=f"journal {JOURNAL}: .*returned 'Msg', not a"):
        message_type_of(lambda s: "Msg", spec(None))  # type: ignore[arg-type, return-value]

    def by_name(journal_spec: pb.JournalSpec) -> type[Any]:
        return {"other": Msg}[journal_spec.name]

    # What the function raises names it and the journal, with the error as its cause (before,
    # a shard reported the KeyError alone, as an error of "reading messages").
    with pytest.raises(MessageTypeError) as raised:
        message_type_of(by_name, spec(None))
    assert str(raised.value) == (
        f"journal {JOURNAL}: the message type function"
        f" {by_name.__qualname__} raised KeyError: '{JOURNAL}'"
    )
    assert isinstance(raised.value.__cause__, KeyError)

    decoder = new_chunk_decoder(spec("application/x-ndjson"), 5, Msg)
    [env] = decoder.feed(frames(Msg(text="no uuid")), 5)
    seq = to_seq_envelope(env)
    assert (seq.journal, seq.begin, seq.end, seq.clock, seq.flags) == (JOURNAL, 5, env.end, 0, 0)
    assert seq.message is env
