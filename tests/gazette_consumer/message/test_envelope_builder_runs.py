"""`EnvelopeBuilder.lead_run`: the run at the front of a built list that a read-committed reader
commits at once (`Sequencer.commit_alone_run`), measured while building. It must never exceed
the run the envelopes actually form (that would commit a message the Sequencer must sequence),
and should equal it whenever the builder's cache was not cleared mid-run."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from gazette_consumer.message.json_framing import JSONFraming, JSONMessage
from gazette_consumer.message.message import Envelope, EnvelopeBuilder
from gazette_consumer.message.uuid import NIL_UUID, Flag, ProducerID, build_uuid
from gazette_consumer.sequencer.decode import ChunkDecoder
from gazette_consumer.sequencer.read_pieces import DECODE_PIECE_BYTES

JOURNAL = "runs/journal"
OUT, CONT, ACK = int(Flag.OUTSIDE_TXN), int(Flag.CONTINUE_TXN), int(Flag.ACK_TXN)
PRODUCERS = [ProducerID(bytes.fromhex(h)) for h in ("01aaaaaaaaaa", "01bbbbbbbbbb")]


class Event(JSONMessage, kw_only=True):
    text: str = ""


def reference_run(envs: list[Envelope[Event]]) -> int:
    """The run at the front of `envs`, by its definition: OUTSIDE_TXN messages with a UUID, of
    the first one's producer, each with a larger clock and beginning at or after the end of the
    one before."""
    n = 0
    for env in envs:
        if env.clock == 0 or env.flags != OUT or env.producer != envs[0].producer:
            break
        if n and (env.clock <= envs[n - 1].clock or env.begin < envs[n - 1].end):
            break
        n += 1
    return n


# A message: (producer index, clock step (0 repeats, negative goes back), flags, has a UUID).
MSGS = st.tuples(
    st.sampled_from([0, 0, 0, 0, 1]),
    st.sampled_from([1, 1, 1, 1, 17, 0, -1, 1 << 36]),
    st.sampled_from([OUT] * 10 + [CONT, ACK, 0x5]),
    st.sampled_from([True] * 12 + [False]),
)


def messages_of(spec: list[tuple[int, int, int, bool]]) -> list[Event]:
    clocks = [1 << 40, 1 << 40]  # Per producer.
    out = []
    for i, (p, step, flags, has_uuid) in enumerate(spec):
        clocks[p] = max(1, clocks[p] + step)
        uuid = build_uuid(PRODUCERS[p], clocks[p], flags) if has_uuid else NIL_UUID
        out.append(Event(uuid=uuid, text=str(i)))
    return out


@settings(max_examples=300, deadline=None)
@given(
    batches=st.lists(st.lists(MSGS, max_size=40), min_size=1, max_size=4),
    cache_entries_max=st.sampled_from([1, 2, 3, 4096]),
)
def test_lead_run_is_the_run_the_envelopes_form(
    batches: list[list[tuple[int, int, int, bool]]], cache_entries_max: int
) -> None:
    builder = EnvelopeBuilder(cache_entries_max=cache_entries_max)
    for spec in batches:  # One builder across batches, as a decoder's: its cache carries over.
        messages = messages_of(spec)
        offsets = list(itertools.accumulate((5 + i % 3 for i in range(len(messages))), initial=9))
        envs = builder.build(JOURNAL, offsets, messages)
        assert envs is not None
        expected = reference_run(envs)
        if cache_entries_max == 4096:
            assert builder.lead_run == expected
        else:
            # A small cache is cleared mid-run, re-learning a producer as a new object: the
            # run may end early, never late.
            assert builder.lead_run <= expected
        # The general path's envelopes are the same (the run is measured, not altered).
        assert envs == [
            Envelope.of(JOURNAL, b, e, m)
            for b, e, m in zip(offsets, offsets[1:], messages, strict=False)
        ]


def test_lead_run_ends_where_the_run_does() -> None:
    a, b = PRODUCERS
    cases = {
        # (producer, clock, flags) per message; None: no UUID.
        "one run": ([(a, 10, OUT), (a, 11, OUT), (a, 30, OUT)], 3),
        "another producer": ([(a, 10, OUT), (a, 11, OUT), (b, 12, OUT), (a, 13, OUT)], 2),
        "a repeated clock": ([(a, 10, OUT), (a, 10, OUT)], 1),
        "a clock going back": ([(a, 10, OUT), (a, 12, OUT), (a, 11, OUT)], 2),
        "a transaction": ([(a, 10, OUT), (a, 11, CONT), (a, 12, ACK)], 1),
        "unknown flags": ([(a, 10, OUT), (a, 11, 0x5)], 1),
        "no UUID": ([(a, 10, OUT), None, (a, 12, OUT)], 1),
        "starts with no UUID": ([None, (a, 12, OUT)], 0),
        "starts with a transaction": ([(a, 10, CONT), (a, 11, OUT)], 0),
        "empty": ([], 0),
    }
    builder = EnvelopeBuilder()
    for name, (spec, want) in cases.items():
        messages = [
            Event(uuid=NIL_UUID if m is None else build_uuid(m[0], m[1], m[2])) for m in spec
        ]
        envs = builder.build(JOURNAL, list(range(0, 10 * len(spec) + 1, 10)), messages)
        assert envs is not None
        assert builder.lead_run == want == reference_run(envs), name


def test_decoder_reports_the_lead_run_of_its_fast_path_only() -> None:
    a, b = PRODUCERS
    framing = JSONFraming()
    decoder = ChunkDecoder(JOURNAL, 0, framing, framing.new_decoder(Event))
    messages = [Event(uuid=build_uuid(a, 100 + i, OUT), text=f"m{i}") for i in range(5)]
    messages.append(Event(uuid=build_uuid(b, 7, OUT)))
    content = b"".join(framing.marshal(m) for m in messages)
    assert len(content) < DECODE_PIECE_BYTES
    envs = decoder.feed(content, 0)
    assert len(envs) == 6 and decoder.lead_run == 5
    # The general path (here: a frame left incomplete, flushed at the end) measures nothing.
    decoder.feed(b'{"text": "cut', len(content))
    assert decoder.flush() == [] and decoder.lead_run is None


def reference_span(envs: list[Envelope[Event]]) -> int:
    """The run at the front of `envs` whatever its flags: messages with a UUID, of the first
    one's producer and flags, each with a larger clock than the one before."""
    n = 0
    for env in envs:
        if env.clock == 0 or env.flags != envs[0].flags or env.producer != envs[0].producer:
            break
        if n and env.clock <= envs[n - 1].clock:
            break
        n += 1
    return n


@settings(max_examples=300, deadline=None)
@given(
    batches=st.lists(st.lists(MSGS, max_size=40), min_size=1, max_size=4),
    cache_entries_max=st.sampled_from([1, 2, 3, 4096]),
)
def test_lead_span_is_the_run_of_any_flags_the_envelopes_form(
    batches: list[list[tuple[int, int, int, bool]]], cache_entries_max: int
) -> None:
    builder = EnvelopeBuilder(cache_entries_max=cache_entries_max)
    for spec in batches:
        messages = messages_of(spec)
        offsets = list(itertools.accumulate((5 + i % 3 for i in range(len(messages))), initial=9))
        # By default, the run of OUTSIDE_TXN messages only, as lead_run.
        envs = builder.build(JOURNAL, offsets, messages)
        assert envs is not None
        assert builder.lead_span == builder.lead_run <= reference_run(envs)
        assert builder.lead_flags == (OUT if builder.lead_span else -1)
        envs = builder.build(JOURNAL, offsets, messages, any_flags=True)
        assert envs is not None
        expected = reference_span(envs)
        if cache_entries_max == 4096:
            assert builder.lead_span == expected
        else:
            assert builder.lead_span <= expected  # Ends early where a producer is re-learned.
        span = builder.lead_span
        assert builder.lead_flags == (envs[0].flags if span else -1)
        # lead_run is the span where it is one of OUTSIDE_TXN messages, as without any_flags.
        assert builder.lead_run == (span if span and envs[0].flags == OUT else 0)
        if cache_entries_max == 4096:
            assert builder.lead_run == reference_run(envs)


# As MSGS, mostly one producer's CONTINUE_TXN messages: a long transaction's continuation.
CONTINUING = st.tuples(
    st.sampled_from([0] * 12 + [1]),
    st.sampled_from([1] * 12 + [0, -1, 1 << 36]),
    st.sampled_from([CONT] * 20 + [OUT, ACK, 0x5]),
    st.sampled_from([True] * 30 + [False]),
)


@settings(max_examples=300, deadline=None)
@given(
    pieces=st.lists(st.lists(CONTINUING, min_size=1, max_size=30), min_size=1, max_size=4),
    after_step=st.sampled_from([-1, 0, 1, 2]),
)
def test_feed_continuing_whole_counts_what_continuation_of_counts(
    pieces: list[list[tuple[int, int, int, bool]]], after_step: int
) -> None:
    """`ChunkDecoder.feed_continuing(whole=True)` takes a piece whose every message continues
    the span from the builder's measure (no loop of `continuation_of`): its result must be the
    general count's, piece after piece, whatever the piece holds."""
    from gazette_consumer.sequencer.decode import continuation_of

    framing = JSONFraming()
    fast = ChunkDecoder(JOURNAL, 0, framing, framing.new_decoder(Event))
    general = ChunkDecoder(JOURNAL, 0, framing, framing.new_decoder(Event))
    assert fast.decodes_uuids
    producer = PRODUCERS[0]
    offset = 0
    for spec in pieces:
        messages = messages_of(spec)
        content = b"".join(framing.marshal(m) for m in messages)
        envs = general.feed(content, offset)
        assert len(envs) == len(messages)
        # A span's clock so far: just below, at or above its first message's.
        first = next((e.clock for e in envs if e.clock), 1 << 40)
        after = max(0, first - 1 + after_step)
        n, begin, clock, end, rest, kept = fast.feed_continuing(
            content, offset, producer, after, whole=True
        )
        want_n, want_clock = continuation_of(envs, producer, after)
        assert (n, clock) == (want_n, want_clock)
        assert begin == offset and end == (envs[n - 1].end if n else offset)
        assert rest == envs[n:]
        assert kept == (envs[:n] if n else None)
        assert fast.through == general.through == offset + len(content)
        offset += len(content)
