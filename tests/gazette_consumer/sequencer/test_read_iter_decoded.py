"""Replays handed the messages kept decoded (decoded.py) against the general path (none kept:
`replay_decoded_messages_max=0`, each replay decoding the bytes kept): the same messages in the
same order, and the same checkpoint after each, with other producers' messages, duplicates and
rolled-back messages inside the spans, a span longer than the budget, two producers' spans
interleaved, and a restart from a checkpoint taken while a long span was pending."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest
from read_iter_testkit import ACK, CONTINUE, MARKER, OUTSIDE, P1, P2, P3, Msg, broker_env, msg

from broker.protocol.validate import ValidationError
from gazette_consumer.sequencer.decoded import (
    REPLAY_DECODED_MESSAGES_MAX,
    REPLAY_DECODED_MESSAGES_MAX_DEFAULT,
    DecodedSpans,
)
from gazette_consumer.sequencer.read_iter import ReadCommittedIter
from gazette_consumer.sequencer.types import SequencerCheckpoint

TIMEOUT_S = 60.0
FILLER = "f" * 120
RING_SIZE = 16
BUDGET_SMALL = 200  # Messages: less than the long span below.


def span(producer: bytes, first: int, count: int, prefix: str) -> list[Msg]:
    return [
        msg(producer, first + i, CONTINUE, f"{prefix}{i}:{FILLER}")  # type: ignore[arg-type]
        for i in range(count)
    ]


async def write_journal(env: Any, journal: str) -> None:
    others = [msg(P2, 10 + i, OUTSIDE, f"o{i}") for i in range(6)]
    small = span(P1, 1000, 300, "a")
    # Another producer's message and duplicates inside the span; the ACK commits through
    # small[-1]: the messages after it roll back.
    await env.append_messages(journal, [*small[:150], others[0], *small[:20], *small[150:]])
    await env.append_messages(journal, [*span(P1, 1301, 5, "x"), msg(P1, 1300, ACK)])
    big = span(P1, 10_000, 700, "b")  # Longer than BUDGET_SMALL.
    await env.append_messages(journal, big[:350])
    await env.append_messages(journal, [others[1]])  # Where the restart's checkpoint is taken.
    await env.append_messages(journal, [*big[350:], others[2], msg(P1, 20_000, ACK)])
    # A span rolled back by a re-sent (older) ACK: never delivered.
    await env.append_messages(journal, [*span(P1, 30_000, 400, "r"), msg(P1, 20_000, ACK)])
    # Two producers' spans interleaved (P3's clocks above P1's: only producers tell them apart).
    one, two = span(P1, 40_000, 400, "p"), span(P3, 50_000, 300, "q")
    await env.append_messages(journal, one[:100])
    for i in range(0, 300, 50):
        await env.append_messages(journal, [*one[100 + i : 150 + i], *two[i : i + 50]])
    await env.append_messages(journal, [msg(P3, 60_000, ACK), others[3], msg(P1, 41_000, ACK)])
    await env.append_messages(journal, [msg(MARKER, 1, OUTSIDE, "m")])


async def read(it: ReadCommittedIter, until: str) -> list[tuple[str, bool, SequencerCheckpoint]]:
    """Each message's text, `in_sequence` and the checkpoint after it, through `until`."""
    got: list[tuple[str, bool, SequencerCheckpoint]] = []
    async with asyncio.timeout(TIMEOUT_S):
        while not got or got[-1][0] != until:
            env = it.try_next() or await it.next()
            # `in_sequence` is an attribute, set where the state it summarises changes.
            assert it.in_sequence == it._sequence_state()
            got.append((env.message.text, it.in_sequence, it.checkpoint()))
    return got


def new_iter(env: Any, journal: str, decoded_max: int, cp: SequencerCheckpoint | None = None):
    return ReadCommittedIter(
        env.client,
        {journal: 0},
        message_type=Msg,
        ring_size=RING_SIZE,
        checkpoint=cp,
        replay_decoded_messages_max=decoded_max,
    )


@pytest.mark.parametrize("decoded_max", [BUDGET_SMALL, REPLAY_DECODED_MESSAGES_MAX_DEFAULT])
async def test_replays_from_decoded_messages_deliver_as_the_general_path(decoded_max: int) -> None:
    async with broker_env() as env:
        journal = await env.journal("decoded/differential")
        await write_journal(env, journal)
        general = new_iter(env, journal, 0)
        expected = await read(general, "m")
        await general.close()
        assert general.replays_from_decoded == 0

        it = new_iter(env, journal, decoded_max)
        got = await read(it, "m")
        await it.close()
        assert [g[0] for g in got] == [e[0] for e in expected]
        assert got == expected
        assert (it.replays, it.replays_from_memory) == (
            general.replays,
            general.replays_from_memory,
        )
        # small, big, and the interleaved two; within the small budget P1's span of those
        # two takes it all, and P3's is decoded from the bytes.
        assert it.replays == 4
        assert it.replays_from_decoded == (3 if decoded_max == BUDGET_SMALL else 4)
        # Nothing of what was kept outlives its replay.
        assert it._replays.decoded.messages == 0


@pytest.mark.parametrize("decoded_max", [0, BUDGET_SMALL, REPLAY_DECODED_MESSAGES_MAX_DEFAULT])
async def test_a_restart_from_a_checkpoint_mid_span(decoded_max: int) -> None:
    """A checkpoint taken where the long span `b` is pending (half read): a new iterator from
    it replays `b` from the broker (its begin is before anything it kept), and delivers what
    the first had not, as the general path does."""
    async with broker_env() as env:
        journal = await env.journal("decoded/restart")
        await write_journal(env, journal)
        whole = new_iter(env, journal, 0)
        expected = await read(whole, "m")
        await whole.close()

        first = new_iter(env, journal, decoded_max)
        before = await read(first, "o1")
        await first.close()
        assert not before[-1][1]  # Not in a sequence: a consumer may commit here.
        again = new_iter(env, journal, decoded_max, before[-1][2])
        after = await read(again, "m")
        await again.close()
        texts = [g[0] for g in before + after]
        assert texts == [e[0] for e in expected]
        # The restored span's replay reads the broker; the later ones use what was kept.
        assert again.replays == 3 and again.replays_from_memory == 2
        assert again.replays_from_decoded == {0: 0, BUDGET_SMALL: 1}.get(decoded_max, 2)


async def test_the_decoded_budget_is_validated() -> None:
    async with broker_env() as env:
        for bad in (-1, REPLAY_DECODED_MESSAGES_MAX + 1, True, 1.5):
            bad_value: Any = bad
            with pytest.raises(ValidationError, match="replay_decoded_messages_max"):
                new_iter(env, "some/journal", bad_value)


def test_decoded_spans_keep_within_the_budget_and_merge_touching_runs() -> None:
    one = [msg(P1, 10 + i, CONTINUE, str(i)) for i in range(6)]
    envs = [_env(m, 100 + 10 * i) for i, m in enumerate(one)]  # Contiguous.
    kept = DecodedSpans(messages_max=5)
    kept.add("j", P1, 50, envs[:2])
    kept.add("j", P1, 50, envs[2:4])  # Touching: one run.
    kept.add("j", P1, 50, envs[4:])  # One more fits.
    assert kept.messages == 5 and kept.room == 0
    runs = kept.take("j", P1, 50, 1000)
    assert [len(r.envelopes) for r in runs] == [5] and (runs[0].begin, runs[0].end) == (100, 150)
    assert kept.messages == 0
    kept.add("j", P1, 0, envs[:2])
    kept.add("j", P1, 300, envs[3:5])  # A newer span of the producer: the older's runs go.
    assert kept.messages == 2
    kept.trim("j", lambda producer: -1)  # No span pending any more.
    assert kept.messages == 0 and kept.take("j", P1, 0, 1000) == []


def _env(m: Msg, begin: int) -> Any:
    from gazette_consumer.message.message import Envelope

    return Envelope.of("j", begin, begin + 10, m)


async def read_taking(
    it: ReadCommittedIter, until: str, limits: list[int]
) -> tuple[list[tuple[str, bool, SequencerCheckpoint | None]], int]:
    """As `read`, but taking what `take_sequence` hands out (at most each of `limits` in turn)
    after every message: each message's text, `in_sequence` after it, and the checkpoint after
    it (None within a batch taken: only after a batch's last can one be taken); and how many
    messages came in batches."""
    got: list[tuple[str, bool, SequencerCheckpoint | None]] = []
    batched = 0
    async with asyncio.timeout(TIMEOUT_S):
        while not got or got[-1][0] != until:
            env = it.try_next() or await it.next()
            got.append((env.message.text, it.in_sequence, it.checkpoint()))
            taken = it.take_sequence(limits[len(got) % len(limits)])
            if taken:
                # The sequence goes on after each of them, so no transaction closes there.
                assert it.in_sequence and it.in_sequence == it._sequence_state()
                got.extend((e.message.text, True, None) for e in taken[:-1])
                got.append((taken[-1].message.text, True, it.checkpoint()))
                batched += len(taken)
    return got, batched


@pytest.mark.parametrize("decoded_max", [0, REPLAY_DECODED_MESSAGES_MAX_DEFAULT])
async def test_taking_sequences_at_once_delivers_as_message_by_message(decoded_max: int) -> None:
    """`take_sequence` (the transaction loop's batches inside an ACK's messages) against
    `try_next` alone: the same messages, the same `in_sequence` after each, the same
    checkpoint after each batch's last; and while it keeps messages decoded, the reader holds
    young collections off, releasing the hold once their replay was delivered and on close."""
    async with broker_env() as env:
        journal = await env.journal("decoded/take-sequence")
        await write_journal(env, journal)
        general = new_iter(env, journal, decoded_max)
        expected = await read(general, "m")
        await general.close()

        it = new_iter(env, journal, decoded_max)
        got, batched = await read_taking(it, "m", [1, 7, 512, 3, 10_000])
        assert not it._replays.gc_hold.held or decoded_max  # Never held when keeping nothing.
        await it.close()
        assert [g[0] for g in got] == [e[0] for e in expected]
        assert [g[1] for g in got] == [e[1] for e in expected]
        assert [g[2] for g in got if g[2] is not None] == [
            e[2] for e, g in zip(expected, got, strict=True) if g[2] is not None
        ]
        assert batched > 1000  # Most of the spans' messages.
        assert not it._replays.gc_hold.held  # Released on close.
        assert it.take_sequence(100) == []


async def test_the_collection_hold_follows_what_is_kept() -> None:
    async with broker_env() as env:
        journal = await env.journal("decoded/gc-hold")
        await write_journal(env, journal)
        # A span kept and replayed, then more to decode after its replay.
        await env.append_messages(journal, span(P2, 70_000, 100, "s"))
        await env.append_messages(journal, span(P2, 70_100, 300, "t"))
        await env.append_messages(journal, [msg(P2, 71_000, ACK)])
        # More than a piece (DECODE_PIECE_BYTES) after it.
        after = [msg(MARKER, 2 + i, OUTSIDE, f"y{i}:{FILLER}") for i in range(200)]
        await env.append_messages(journal, [*after, msg(MARKER, 1000, OUTSIDE, "z")])
        it = new_iter(env, journal, REPLAY_DECODED_MESSAGES_MAX_DEFAULT)
        hold = it._replays.gc_hold
        assert hold.objects == 2 * REPLAY_DECODED_MESSAGES_MAX_DEFAULT
        held_while_kept = released_after = 0
        async with asyncio.timeout(TIMEOUT_S):
            while True:
                env_ = it.try_next() or await it.next()
                kept = it._replays.decoded.messages
                if kept:
                    held_while_kept += 1
                    assert hold.held  # Never keeping without holding.
                elif not hold.held:
                    released_after += 1
                if env_.message.text == "z":
                    break
        assert held_while_kept and released_after
        await it.close()
        assert not hold.held


async def test_closing_mid_replay_lets_go_of_the_messages_kept() -> None:
    """Closed while a span's replay from the messages kept decoded is being delivered, the
    iterator frees them at once, by reference counts: it is not left to the cyclic collector
    (a closed shard's reader would otherwise hold up to replay_decoded_messages_max messages
    until the next full collection)."""
    async with broker_env() as env:
        journal = await env.journal("decoded/close-mid-replay")
        await write_journal(env, journal)
        gc.collect()  # Earlier tests' iterators, and their messages.
        before = _alive("b")
        it = new_iter(env, journal, REPLAY_DECODED_MESSAGES_MAX_DEFAULT)
        gc.disable()  # Only reference counts free anything from here on.
        try:
            async with asyncio.timeout(TIMEOUT_S):
                while True:
                    got = it.try_next() or await it.next()
                    if got.message.text.startswith("b0:"):
                        break
            assert it.replays_from_decoded == 2  # Of small's span, and now of big's.
            del got
            assert _alive("b") - before > 600  # The rest of big's span, waiting to be handed out.
            await it.close()
            # At most the message held ahead of the run handed out and the one before it,
            # which checkpoints are taken against: not the span's hundreds.
            assert _alive("b") - before <= 2
        finally:
            gc.enable()


def _alive(prefix: str) -> int:
    """Test messages alive whose text starts with `prefix` (the collector tracks them)."""
    return sum(1 for o in gc.get_objects() if type(o) is Msg and o.text.startswith(prefix))
