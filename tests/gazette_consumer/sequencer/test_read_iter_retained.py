"""Replays served from the content a ReadCommittedIter kept (retained.py), and the fallback to a
read of the broker when the span outgrew the budget: the delivered set is exactly the committed
messages either way, with other producers, duplicates and rolled-back messages inside the span."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from read_iter_testkit import (
    ACK,
    CONTINUE,
    MARKER,
    OUTSIDE,
    P1,
    P2,
    P3,
    Msg,
    broker_env,
    frames,
    msg,
)

from broker.protocol.validate import ValidationError
from gazette_consumer.message import MessageDecodeError, build_uuid
from gazette_consumer.sequencer.read_iter import ReadCommittedIter
from gazette_consumer.sequencer.retained import (
    REPLAY_RETAINED_BYTES_MAX,
    RETAINED_TRIM_EVERY_BYTES,
    RetainedContent,
)

TIMEOUT_S = 60.0
FILLER = "f" * 120


async def read_texts(it: ReadCommittedIter, last: str) -> list[str]:
    got: list[str] = []
    async with asyncio.timeout(TIMEOUT_S):
        while last not in got:
            env = it.try_next() or await it.next()
            got.append(env.message.text)
    return got


def span(producer: bytes, first: int, count: int, prefix: str) -> list[Msg]:
    return [
        msg(producer, first + i, CONTINUE, f"{prefix}{i}:{FILLER}")  # type: ignore[arg-type]
        for i in range(count)
    ]


def plain(messages: list[Msg]) -> list[str]:
    return [m.text for m in messages]


async def test_spans_within_and_beyond_the_budget_are_delivered_exactly() -> None:
    """Three long spans of one producer (each longer than the ring), with another producer's
    messages, duplicates and messages the ACK rolls back inside them: the two within the
    budget are replayed from memory, the one beyond it from the broker; an older ACK rolls a
    fourth back. Every committed message once, in order; nothing rolled back."""
    async with broker_env() as env:
        journal = await env.journal("retained/spans")
        small = span(P1, 1000, 300, "a")  # ~45 KiB: within the budget.
        big = span(P1, 10_000, 3000, "b")  # ~550 KiB: beyond it.
        late = span(P1, 30_000, 300, "c")
        rolled = span(P1, 40_000, 50, "r")
        others = [msg(P2, 10 + i, OUTSIDE, f"o{i}") for i in range(4)]
        await env.append_messages(journal, [*small[:150], others[0], *small[:20], *small[150:]])
        # The ACK commits through small[-1] only: the messages after it roll back.
        await env.append_messages(journal, [*span(P1, 1301, 5, "x"), msg(P1, 1300, ACK)])
        await env.append_messages(journal, [*big[:800], others[1], *big[800:], others[2]])
        await env.append_messages(journal, [msg(P1, 20_000, ACK)])
        await env.append_messages(journal, [*late, msg(P1, 30_300, ACK)])
        # A re-sent (older) ACK: the span begun since is rolled back, never delivered.
        await env.append_messages(journal, [*rolled, msg(P1, 30_300, ACK), others[3]])
        await env.append_messages(journal, [msg(MARKER, 1, OUTSIDE, "m")])

        it = ReadCommittedIter(
            env.client,
            {journal: 0},
            message_type=Msg,
            ring_size=8,
            replay_retained_bytes_max=256 << 10,
        )
        got = await read_texts(it, "m")
        await it.close()
        assert got == [
            "o0",
            *plain(small),
            "o1",
            "o2",
            *plain(big),
            *plain(late),
            "o3",
            "m",
        ]
        assert it.replays == 3
        assert it.replays_from_memory == 2  # small and late; big outgrew the budget.


@pytest.mark.parametrize("retained_max", [0, 1 << 20])
async def test_interleaved_long_spans_of_two_producers(retained_max: int) -> None:
    """Two producers' long spans interleaved, the second beginning where the first is only
    counted (its pieces decoded for their UUIDs), their ACKs in turn: each replay keeps only
    its own producer's messages, from memory as from the broker; none of the second's is
    taken for the first's."""
    async with broker_env() as env:
        journal = await env.journal("retained/interleaved")
        # P3's clocks above P1's: only the producer tells their messages apart.
        one, two = span(P1, 100, 600, "p"), span(P3, 10_000, 400, "q")
        # P1 alone for a few pieces (its span is only counted by then), then P3's span begins.
        await env.append_messages(journal, one[:200])
        for i in range(0, 400, 50):
            await env.append_messages(journal, [*one[200 + i : 250 + i], *two[i : i + 50]])
        await env.append_messages(journal, [msg(P3, 20_000, ACK), msg(P1, 1000, ACK)])
        await env.append_messages(journal, [msg(MARKER, 1, OUTSIDE, "m")])
        it = ReadCommittedIter(
            env.client,
            {journal: 0},
            message_type=Msg,
            ring_size=16,
            replay_retained_bytes_max=retained_max,
        )
        got = await read_texts(it, "m")
        await it.close()
        assert got == [*plain(two), *plain(one), "m"]
        assert it.replays_from_memory == (2 if retained_max else 0)


def test_retained_content_keeps_contiguous_chunks_within_its_budget() -> None:
    kept = RetainedContent(bytes_max=10)
    kept.add(0, b"abcd")
    kept.add(4, b"efgh")
    assert kept.pieces(1, 6) == [(b"abcd", 0, 1, 4), (b"efgh", 4, 0, 2)]
    assert kept.pieces(0, 9) is None  # Past what was kept.
    kept.add(8, b"ijkl")  # 12 bytes: over the budget, the oldest goes.
    assert kept.begin == 4 and kept.retained_bytes == 8
    assert kept.pieces(3, 6) is None
    assert kept.pieces(8, 12) == [(b"ijkl", 8, 0, 4)]
    kept.trim(8)
    assert kept.begin == 8
    kept.add(20, b"mn")  # A gap: nothing before it can serve a range across it.
    assert kept.begin == 20 and kept.pieces(8, 12) is None
    assert kept.pieces(20, 22) == [(b"mn", 20, 0, 2)]


async def test_the_budget_is_validated() -> None:
    async with broker_env() as env:
        for bad in (-1, REPLAY_RETAINED_BYTES_MAX + 1, True, 1.5):
            bad_value: Any = bad
            with pytest.raises(ValidationError, match="replay_retained_bytes_max"):
                ReadCommittedIter(
                    env.client,
                    {"some/journal": 0},
                    message_type=Msg,
                    replay_retained_bytes_max=bad_value,
                )


def mistyped(producer: bytes, clock: int) -> bytes:
    """A JSON line with a valid CONTINUE_TXN UUID whose other field does not decode as Msg's."""
    uuid = build_uuid(producer, clock, CONTINUE)  # type: ignore[arg-type]
    return b'{"UUID":"%s","text":5}\n' % str(uuid).encode()


@pytest.mark.parametrize("retained_max", [0, 1 << 20])
async def test_an_undecodable_message_only_counted_is_reported_by_its_replay(
    retained_max: int,
) -> None:
    """Deep in a long span (decoded for UUIDs only), a message that does not decode as the
    message type: its transaction's replay raises `MessageDecodeError` naming it, having
    returned a prefix of the messages before it (all but those decoded with it in its replay
    piece; none of the transaction may commit: `in_sequence` held throughout). In a span that
    rolls back, it is never delivered and nothing is raised."""
    async with broker_env() as env:
        journal = await env.journal("retained/mistyped")
        rolled = span(P1, 100, 600, "r")
        await env.append(journal, frames(*rolled[:400]) + mistyped(P1, 500) + frames(*rolled[400:]))
        # An ACK older than the span's messages: every one of them rolls back.
        await env.append_messages(journal, [msg(P1, 99, ACK), msg(P2, 1, OUTSIDE, "o")])
        good = span(P1, 1000, 600, "g")
        bad = frames(*good[:400]) + mistyped(P1, 1400) + frames(*good[400:])
        begin = (await env.append(journal, bad)).commit.begin
        await env.append_messages(journal, [msg(P1, 5000, ACK)])
        it = ReadCommittedIter(
            env.client,
            {journal: 0},
            message_type=Msg,
            ring_size=16,
            replay_retained_bytes_max=retained_max,
        )
        got: list[str] = []
        async with asyncio.timeout(TIMEOUT_S):
            with pytest.raises(MessageDecodeError) as caught:
                while True:
                    got.append((it.try_next() or await it.next()).message.text)
        await it.close()
        assert got[0] == "o"
        assert 1 <= len(got) - 1 <= 400 and got[1:] == plain(good[: len(got) - 1])
        assert it.in_sequence
        bad_begin = begin + len(frames(*good[:400]))
        assert (caught.value.begin, caught.value.end) == (
            bad_begin,
            bad_begin + len(mistyped(P1, 1400)),
        )


def test_trims_are_due_once_per_so_many_bytes_added() -> None:
    """Looking for what no pending span needs costs a look at every producer: it is due once
    per RETAINED_TRIM_EVERY_BYTES added, not per chunk (chunks beyond the budget go anyway)."""
    kept = RetainedContent(bytes_max=4 * RETAINED_TRIM_EVERY_BYTES)
    chunk = bytes(128 << 10)
    offset = 0
    while not kept.trim_due:
        kept.add(offset, chunk)
        offset += len(chunk)
    assert offset == RETAINED_TRIM_EVERY_BYTES
    kept.trim(offset - len(chunk))
    assert not kept.trim_due and kept.begin == offset - len(chunk)
    kept.add(offset, chunk)
    assert not kept.trim_due


async def test_a_span_pending_across_trims_keeps_its_content() -> None:
    """A long span begun before more content than a trim's period, of another producer, then
    committed: the trim in between keeps the chunks from its begin (Sequencer.pending_begin),
    and its replay is served from memory."""
    async with broker_env() as env:
        journal = await env.journal("retained/trimmed")
        early, late = span(P1, 100, 100, "a"), span(P1, 200, 100, "b")
        await env.append_messages(journal, early)
        others: list[str] = []
        filler = "o" * 200
        clock = 10
        while len(others) * 250 < RETAINED_TRIM_EVERY_BYTES * 9 // 8:
            batch = [msg(P2, clock + i, OUTSIDE, f"o{clock + i}:{filler}") for i in range(500)]
            clock += 500
            others += [m.text for m in batch]
            await env.append_messages(journal, batch)
        await env.append_messages(
            journal, [*late, msg(P1, 1000, ACK), msg(MARKER, 1, OUTSIDE, "m")]
        )
        it = ReadCommittedIter(env.client, {journal: 0}, message_type=Msg, ring_size=16)
        got = await read_texts(it, "m")
        assert got == [*others, *plain(early), *plain(late), "m"]
        assert (it.replays, it.replays_from_memory) == (1, 1)
        await it.close()
