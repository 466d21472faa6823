"""RawLineDecoder through the read path's ChunkDecoder: the envelopes of raw JSON lines (UUIDs of
several producers and flags, a nil UUID, none at all) are those `Envelope.of` builds from the
same lines, read through the builder's fast path (`uuid_of` is `UUID_ATTRIBUTE`)."""

from __future__ import annotations

import json
from typing import Any

from gazette_consumer.message import NIL_UUID, Envelope
from gazette_consumer.message.message import UUID_ATTRIBUTE
from spark_integration.raw_json import RawLine, RawLineDecoder, new_decoder
from tests.spark_integration.spark_testkit import ACK, CONTINUE, OUTSIDE, Msg, producer


def parts(env: Envelope[Any]) -> tuple[Any, ...]:
    return (env.begin, env.end, env.message.line, env.uuid, env.producer, env.clock, env.flags)


def test_raw_lines_envelope_as_envelope_of_builds_them() -> None:
    p, q = producer(), producer()
    lines = [Msg(p, 100 + i, OUTSIDE, {"text": f"a{i}"}).line() for i in range(5)]
    lines += [Msg(q, 7, CONTINUE, {"text": "b"}).line(), Msg(q, 7, ACK).line()]
    lines += [b'{"text": "none"}\n', json.dumps({"UUID": str(NIL_UUID)}).encode() + b"\n"]
    lines += [Msg(p, 200, OUTSIDE, {"text": "c"}).line()]
    assert RawLineDecoder.uuid_of is UUID_ATTRIBUTE  # The builder's direct attribute read.
    decoder = new_decoder("raw/j", 10)
    got = decoder.feed(b"".join(lines), 10)
    assert decoder.error is None
    expected, offset = [], 10
    for line in lines:
        uuid = RawLineDecoder()._line(line[:-1]).uuid
        expected.append(Envelope.of("raw/j", offset, offset + len(line), RawLine(line[:-1], uuid)))
        offset += len(line)
    assert [parts(e) for e in got] == [parts(e) for e in expected]
    assert [e.journal for e in got] == ["raw/j"] * len(lines)
    assert decoder.lead_run == 5  # The first producer's run, measured while building.
