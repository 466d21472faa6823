"""ReadCommittedIter over content spanning many read chunks and decode pieces: messages cut by
piece and chunk boundaries, OUTSIDE_TXN messages on the fast path mixed with transactions, an
exact resume from checkpoints taken anywhere, and a decode error deep inside a chunk."""

from __future__ import annotations

import asyncio
import itertools
import random
from typing import Any

import pytest
from read_iter_testkit import ACK, CONTINUE, OUTSIDE, P1, P2, P3, Msg, broker_env, frames, msg

from gazette_consumer.message import MessageDecodeError
from gazette_consumer.sequencer.read_iter import ReadCommittedIter
from gazette_consumer.sequencer.read_pieces import DECODE_PIECE_BYTES

TIMEOUT_S = 60.0


def workload(seed: int) -> tuple[list[bytes], list[str]]:
    """Appends (each whole frames) and the texts read-committed must return, in order."""
    rng = random.Random(seed)
    clocks = {P1: 100, P2: 100, P3: 100}
    appends: list[bytes] = []
    expected: list[str] = []
    n = 0
    while sum(map(len, appends)) < 3 * (128 << 10):  # Several read chunks' worth.
        producer = rng.choice([P1, P2, P3])
        messages = []
        if rng.random() < 0.7:
            for _ in range(rng.randint(1, 40)):
                clocks[producer] += 1
                text = f"o{n}-" + "p" * rng.randint(0, 300)  # Some are cut by pieces.
                messages.append(msg(producer, clocks[producer], OUTSIDE, text))
                expected.append(text)
                n += 1
        else:
            span = []
            for _ in range(rng.randint(1, 30)):
                clocks[producer] += 1
                text = f"t{n}"
                span.append(msg(producer, clocks[producer], CONTINUE, text))
                n += 1
            clocks[producer] += 1
            messages = [*span, msg(producer, clocks[producer], ACK)]
            expected += [m.text for m in span]
            if rng.random() < 0.3:
                messages.append(Msg(text=f"plain{n}"))  # No UUID: at-least-once.
                expected.append(f"plain{n}")
        appends.append(frames(*messages))
    return appends, expected


async def read(it: ReadCommittedIter, count: int) -> list[Any]:
    got: list[Any] = []
    async with asyncio.timeout(TIMEOUT_S):
        while len(got) < count:
            got.append(await it.next())
            while len(got) < count and (env := it.try_next()) is not None:
                got.append(env)
    return got


async def test_many_chunks_and_pieces_read_exactly_and_resume_exactly() -> None:
    appends, expected = workload(seed=5)
    assert sum(map(len, appends)) > 20 * DECODE_PIECE_BYTES
    async with broker_env() as env:
        journal = await env.journal("pieces/a")
        for content in appends:
            await env.append(journal, content)

        it = ReadCommittedIter(env.client, {journal: 0}, message_type=Msg)
        got = await read(it, len(expected))
        assert [e.message.text for e in got] == expected
        assert all(a.end <= b.begin for a, b in itertools.pairwise(got))
        assert it.try_next() is None
        await it.close()

        # Resume from checkpoints taken after a random number of messages (not inside an ACK's
        # messages): the rest comes exactly once.
        for cut in random.Random(9).sample(range(1, len(expected)), 4):
            first = ReadCommittedIter(env.client, {journal: 0}, message_type=Msg)
            head = await read(first, cut)
            while first.in_sequence:
                head += await read(first, 1)
            checkpoint = first.checkpoint()
            await first.close()
            rest = ReadCommittedIter(
                env.client, {journal: 0}, message_type=Msg, checkpoint=checkpoint
            )
            tail = await read(rest, len(expected) - len(head))
            assert [e.message.text for e in head + tail] == expected
            await rest.close()


async def test_a_decode_error_deep_in_a_chunk_comes_after_every_message_before_it() -> None:
    good = [msg(P1, 10 + i, OUTSIDE, f"m{i}-" + "z" * 100) for i in range(400)]
    bad = b'{"UUID": "not a uuid"}\n'
    content = frames(*good[:300]) + bad + frames(*good[300:])
    async with broker_env() as env:
        journal = await env.journal("pieces/bad")
        await env.append(journal, content)
        it = ReadCommittedIter(env.client, {journal: 0}, message_type=Msg)
        got = await read(it, 300)
        assert [e.message.text for e in got] == [m.text for m in good[:300]]
        for _ in range(2):
            with pytest.raises(MessageDecodeError) as caught:
                await asyncio.wait_for(it.next(), TIMEOUT_S)
            assert (caught.value.begin, caught.value.end) == (got[-1].end, got[-1].end + len(bad))
        assert it.checkpoint().read_through[journal] == got[-1].end
        await it.close()


async def test_a_replayed_chunk_is_served_piece_after_piece_without_waiting() -> None:
    """A transaction longer than the ring is replayed from its journal, a chunk at a time, and
    decoded a piece at a time: only a chunk read needs `next()` to wait; the pieces of a chunk
    already read come from `try_next()` (each piece once cost a turn of the caller's loop)."""
    async with broker_env() as env:
        journal = await env.journal("test/replay-pieces")
        count = 1000
        span = [msg(P1, 100 + i, CONTINUE, f"t{i}-" + "p" * 40) for i in range(count)]
        content = frames(*span, msg(P1, 100 + count, ACK))
        assert 4 * DECODE_PIECE_BYTES < len(content) < 128 << 10  # Pieces, in one chunk.
        await env.append(journal, content)
        it = ReadCommittedIter(env.client, {journal: 0}, message_type=Msg, ring_size=16)
        got: list[Any] = []
        waits = 0
        async with asyncio.timeout(TIMEOUT_S):
            while len(got) < count:
                env_ = it.try_next()
                if env_ is None:
                    waits += 1
                    env_ = await it.next()
                got.append(env_)
        await it.close()
        assert [e.message.text for e in got] == [m.text for m in span]
        assert it.replays == 1
        # The first read, then the replay's chunk reads (one or two: how the broker chunks
        # the range); not one per piece of ~16 KiB (6 or more).
        assert waits <= 3, waits
