"""ChunkDecoder's fast path (a chunk's frames split, decoded and enveloped at once) against its
general path (frame by frame): the same envelopes, skips, logs and errors, for any content in any
chunking."""

from __future__ import annotations

import itertools
from typing import Any

import structlog
from hypothesis import given
from hypothesis import strategies as st
from read_iter_testkit import P1, P2, Msg, frames, msg

from gazette_consumer.message import Frame, JSONFraming
from gazette_consumer.message.uuid import build_uuid
from gazette_consumer.sequencer.decode import ChunkDecoder

JOURNAL = "a/journal"
BYTES_MAX = 120


class FrameByFrame:
    """A JSON decoder without the fast path's `decode_payloads`."""

    def __init__(self) -> None:
        self._decoder = JSONFraming().new_decoder(Msg)

    def decode(self, frame: Frame) -> Msg:
        return self._decoder.decode(frame)


good = st.builds(
    lambda p, clock, flags, text: frames(msg(p, clock, flags, text)),
    st.sampled_from([P1, P2]),
    st.integers(1, 1 << 40),
    st.sampled_from([0, 1, 2]),
    st.text(alphabet="xyz", max_size=8),
)
no_uuid = st.just(frames(Msg(text="at-least-once")))
# Well-framed lines the decoder must stop at, and lines the framing skips.
bad_uuid = st.just(b'{"UUID": "9f1e0a52-36c2-4e4f-8d4c-6fd26b1c1a1e"}\n')  # Version 4.
nil_flags = st.builds(lambda c: frames(Msg(uuid=build_uuid(P1, c, 0x3FF))), st.integers(1, 99))
malformed = st.sampled_from([b"[1, 2]\n", b"{\n", b"\n", b'{"text": 5}\n'])
too_long = st.just(b'{"text": "' + b"L" * BYTES_MAX + b'"}\n')
lines = st.lists(
    st.one_of(good, good, good, no_uuid, nil_flags, too_long, malformed, bad_uuid), max_size=25
)


def own_run(envs: list[Any]) -> int:
    """The run at the front of `envs` that `Sequencer.commit_alone_run` may commit at once:
    OUTSIDE_TXN messages with a UUID, of the first one's producer, clocks rising, offsets not
    going back."""
    n = 0
    for env in envs:
        if env.clock == 0 or env.flags != 0 or env.producer != envs[0].producer:
            break
        if n and (env.clock <= envs[n - 1].clock or env.begin < envs[n - 1].end):
            break
        n += 1
    return n


def run(decoder: ChunkDecoder, chunks: list[tuple[bytes, int]]) -> Any:
    got, errors = [], []
    with structlog.testing.capture_logs() as logs:
        for chunk, offset in chunks:
            try:
                got.append(decoder.feed(chunk, offset))
            except Exception as err:
                errors.append(err)
                continue
            # The run measured while decoding (fast path only) is exactly the envelopes' own.
            if decoder.lead_run is not None:
                assert decoder.lead_run == own_run(got[-1])
        try:
            got.append(decoder.flush())
        except Exception as err:
            errors.append(err)
    error = decoder.error
    return (
        [
            [(e.begin, e.end, e.message, e.uuid, e.producer, e.clock, e.flags) for e in g]
            for g in got
        ],
        [(type(e).__name__, str(e)) for e in errors],
        None if error is None else (error.begin, error.end, str(error)),
        decoder.through,
        decoder.skipped_bytes,
        [(e["event"], e.get("begin"), e.get("end")) for e in logs],
    )


@given(lines, st.lists(st.integers(min_value=0), max_size=10), st.integers(0, 3))
def test_fast_and_general_paths_decode_alike(
    content: list[bytes], cuts: list[int], jump_at: int
) -> None:
    data = b"".join(content)
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    chunks = []
    for i, (a, b) in enumerate(itertools.pairwise(points)):
        # Sometimes content goes missing between chunks (an offset jump).
        chunks.append((data[a:b], 100 + a + (1000 if i >= jump_at > 0 else 0)))
    framing = JSONFraming(message_bytes_max=BYTES_MAX)
    fast = ChunkDecoder(JOURNAL, 100, framing, framing.new_decoder(Msg))
    general = ChunkDecoder(JOURNAL, 100, framing, FrameByFrame())
    assert run(fast, chunks) == run(general, chunks)


class Counting(FrameByFrame):
    """A JSON decoder with the fast path, counting how it is used."""

    def __init__(self) -> None:
        super().__init__()
        self.runs: list[int] = []
        self.frames = 0
        self.uuid_of = self._decoder.uuid_of

    def decode(self, frame: Frame) -> Msg:
        self.frames += 1
        return super().decode(frame)

    def decode_payloads(self, payloads: list[bytes]) -> list[Msg]:
        self.runs.append(len(payloads))
        return self._decoder.decode_payloads(payloads)


def test_the_fast_path_takes_well_formed_runs_and_hands_the_rest_on() -> None:
    content = b"".join(frames(msg(P1, c, 0, "m")) for c in range(1, 50))
    framing, counting = JSONFraming(), Counting()
    decoder = ChunkDecoder(JOURNAL, 0, framing, counting)
    envelopes = decoder.feed(content[:1000], 0) + decoder.feed(content[1000:], 1000)
    assert [e.clock for e in envelopes] == list(range(1, 50))
    assert sum(counting.runs) == 49 and len(counting.runs) == 2 and counting.frames == 0

    # A run with a malformed line goes frame by frame, up to that line.
    bad = frames(msg(P1, 60, 0, "ok")) + b"[1]\n"
    assert [e.clock for e in decoder.feed(bad, decoder.offset)] == [60]
    assert counting.frames == 2 and decoder.error is not None
