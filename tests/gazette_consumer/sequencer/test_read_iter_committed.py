"""ReadCommittedIter against a real in-process broker: several journals and framings, interleaved
producers, duplicates and rollbacks, replays of spans that left the ring, checkpoints and resumes,
cancellation, and the failure and close of its background readers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
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
    Env,
    FixedMsg,
    Msg,
    broker_env,
    fixed,
    msg,
    texts,
)

from broker.protocol import labels
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import JournalNotFoundError
from gazette_consumer.message import Envelope, FixedFraming
from gazette_consumer.sequencer import JournalProducer, ProducerState, SequencerCheckpoint
from gazette_consumer.sequencer.read_iter import ReadCommittedIter, ReadIterClosedError
from gazette_consumer.sequencer.retained import REPLAY_RETAINED_BYTES_MAX_DEFAULT

TIMEOUT_S = 60.0


def message_type_for(spec: pb.JournalSpec) -> type[Any]:
    fixed_type = labels.value_of(spec.labels, labels.CONTENT_TYPE) == "application/x-protobuf-fixed"
    return FixedMsg if fixed_type else Msg


async def read_until(
    it: ReadCommittedIter, done: Callable[[list[Envelope[Any]]], bool]
) -> list[Envelope[Any]]:
    got: list[Envelope[Any]] = []
    async with asyncio.timeout(TIMEOUT_S):
        while not done(got):
            got.append(await it.next())
    return got


def until_texts(*wanted: str) -> Callable[[list[Envelope[Any]]], bool]:
    return lambda got: set(wanted) <= set(texts(got))


def of(journal: str, got: list[Envelope[Any]]) -> list[str]:
    return texts(e for e in got if e.journal == journal)


async def test_three_journals_interleaved_producers_duplicates_and_rollbacks() -> None:
    async with broker_env() as env:
        a, b = await env.journal("txn/a"), await env.journal("txn/b")
        c = await env.fixed_journal("txn/c")
        await env.append_messages(
            a,
            [
                msg(P1, 10, CONTINUE, "a1"),
                msg(P2, 50, OUTSIDE, "b1"),
                msg(P1, 11, CONTINUE, "a2"),
                msg(P1, 10, CONTINUE, "a1"),  # Re-appended within the pending span.
            ],
        )
        await env.append_messages(
            b, [msg(P1, 10, CONTINUE, "x1"), msg(P2, 20, CONTINUE, "y1"), msg(P1, 11, ACK)]
        )
        await env.append_messages(
            a,
            [
                msg(P1, 12, ACK),
                msg(P2, 50, OUTSIDE, "b1"),  # Duplicates of delivered messages.
                msg(P1, 11, CONTINUE, "a2"),
                msg(P1, 13, CONTINUE, "rolled back by a re-sent ACK"),
                msg(P1, 12, ACK),
                msg(P3, 30, CONTINUE, "c1"),
                msg(P3, 32, CONTINUE, "rolled back: after its ACK's clock"),
                msg(P3, 31, ACK),
            ],
        )
        await env.append(
            c,
            fixed(P1, 5, OUTSIDE, "f1")
            + fixed(P1, 6, CONTINUE, "f2")
            + fixed(P1, 7, ACK)
            + FixedFraming().marshal(FixedMsg(None, "no uuid"))
            + FixedFraming().marshal(FixedMsg(None, "no uuid"))  # At-least-once: both.
            + fixed(MARKER, 1, OUTSIDE, "marker-c"),
        )
        await env.append_messages(b, [msg(P2, 21, CONTINUE, "y2"), msg(P2, 22, ACK)])
        await env.append_messages(b, [msg(MARKER, 1, OUTSIDE, "marker-b")])
        _, head_a = await env.append_messages(
            a, [msg(P1, 14, CONTINUE, "a4"), msg(P1, 15, ACK), msg(MARKER, 1, OUTSIDE, "marker-a")]
        )

        it = ReadCommittedIter(env.client, {a: 0, b: 0, c: 0}, message_type=message_type_for)
        got: list[Envelope[Any]] = []
        more: dict[str, bool] = {}  # Text -> in_sequence after it was returned.
        async with asyncio.timeout(TIMEOUT_S):
            while not {"marker-a", "marker-b", "marker-c"} <= set(texts(got)):
                got.append(await it.next())
                more[got[-1].message.text] = it.in_sequence
        # More messages of the same ACK follow exactly these; the ACKs' last messages end them.
        assert sorted(t for t, m in more.items() if m) == ["a1", "y1"]
        assert of(a, got) == ["b1", "a1", "a2", "c1", "a4", "marker-a"]
        assert of(b, got) == ["x1", "y1", "y2", "marker-b"]
        assert of(c, got) == ["f1", "f2", "no uuid", "no uuid", "marker-c"]
        assert len(got) == 15  # Nothing else: no ACKs, duplicates or rolled-back messages.
        assert it.try_next() is None
        assert it.replays == 0

        checkpoint = it.checkpoint()
        assert checkpoint.read_through[a] == head_a
        assert checkpoint.producers[JournalProducer(a, P1)].last_ack == 15
        assert checkpoint.producers[JournalProducer(b, P2)].last_ack == 22
        await it.close()


def transaction(producer: bytes, first: int, count: int, prefix: str) -> list[Msg]:
    return [msg(producer, first + i, CONTINUE, f"{prefix}{i}") for i in range(count)]  # type: ignore[arg-type]


@pytest.mark.parametrize("retained_max", [0, REPLAY_RETAINED_BYTES_MAX_DEFAULT])
async def test_a_span_longer_than_the_ring_is_replayed_across_many_chunks(
    retained_max: int,
) -> None:
    """Replayed by a read of the broker (nothing kept: `replay_retained_bytes_max` 0), or from
    the chunks the iterator kept (no read: the replay never waits)."""
    async with broker_env() as env:
        journal = await env.journal("t/replay")
        filler = "z" * 150  # ~230-byte messages: the span spans several 128 KiB chunks.
        span = [msg(P1, 1000 + i, CONTINUE, f"p{i}:{filler}") for i in range(1500)]
        others = [msg(P2, 10 + i, OUTSIDE, f"o{i}") for i in range(3)]
        # Other producers' messages and duplicates inside the span, then its ACK.
        await env.append_messages(journal, [*span[:700], others[0], *span[:10]])
        await env.append_messages(journal, [others[1], *span[700:], others[2]])
        await env.append_messages(journal, [msg(P1, 5000, ACK), msg(MARKER, 1, OUTSIDE, "m")])

        it = ReadCommittedIter(
            env.client,
            {journal: 0},
            message_type=Msg,
            ring_size=4,
            replay_retained_bytes_max=retained_max,
        )
        got: list[str] = []
        in_sequence: list[bool] = []
        mid_span: list[tuple[int, SequencerCheckpoint]] = []  # Taken where a replay read waits.
        taken: list[tuple[int, SequencerCheckpoint]] = []
        async with asyncio.timeout(TIMEOUT_S):
            while "m" not in got:
                # As a transaction loop: drain what is at hand, then wait (the span's replay
                # makes try_next() return None in its middle, several times).
                env_ = it.try_next()
                if env_ is None:
                    if it.in_sequence:
                        mid_span.append((len(got), it.checkpoint()))
                    env_ = await it.next()
                got.append(env_.message.text)
                in_sequence.append(it.in_sequence)
                if len(got) in (5, 900):  # Mid-span, where no read waits.
                    taken.append((len(got), it.checkpoint()))
        assert got == ["o0", "o1", "o2", *[m.text for m in span], "m"]
        assert it.replays == 1
        assert it.replays_from_memory == (1 if retained_max else 0)
        # A transaction may close after o0..o2, the span's last message and the marker only.
        assert in_sequence == [False] * 3 + [True] * (len(span) - 1) + [False, False]
        await it.close()

        # Checkpoints taken mid-span (by a reader that would not commit them) are exact too.
        if retained_max:
            assert not mid_span  # Served from memory: nothing to wait for.
            mid_span = taken
        assert mid_span
        for returned, checkpoint in mid_span[:2]:
            resumed = ReadCommittedIter(
                env.client, {journal: 0}, message_type=Msg, ring_size=4, checkpoint=checkpoint
            )
            rest = texts(await read_until(resumed, until_texts("m")))
            assert rest == got[returned:]
            await resumed.close()


async def test_checkpoints_anywhere_in_a_replayed_span_resume_exactly() -> None:
    """A span longer than the ring is replayed whole and returned in runs of what a replay
    read holds: a checkpoint taken after any message (inside a run, at its last, at the
    message looked past it) resumes with exactly the messages not returned yet."""
    async with broker_env() as env:
        journal = await env.journal("t/replay-runs")
        span = transaction(P1, 1000, 900, "p")
        await env.append_messages(journal, [*span[:450], msg(P2, 10, OUTSIDE, "o0"), *span[:5]])
        await env.append_messages(journal, [*span[450:], msg(P1, 5000, ACK)])
        await env.append_messages(journal, [msg(MARKER, 1, OUTSIDE, "m")])
        expected = ["o0", *(m.text for m in span), "m"]

        it = ReadCommittedIter(env.client, {journal: 0}, message_type=Msg, ring_size=8)
        got: list[str] = []
        checkpoints: dict[int, SequencerCheckpoint] = {}
        async with asyncio.timeout(TIMEOUT_S):
            while "m" not in got:
                env_ = it.try_next() or await it.next()
                got.append(env_.message.text)
                assert it.in_sequence == (2 <= len(got) < len(expected) - 1)  # p0..p898
                checkpoints[len(got)] = it.checkpoint()
        assert got == expected
        assert it.replays == 1
        await it.close()

        for returned in [1, 2, 3, 40, 41, 42, 43, 100, 449, 450, 451, 600, 899, 900]:
            resumed = ReadCommittedIter(
                env.client,
                {journal: 0},
                message_type=Msg,
                ring_size=8,
                checkpoint=checkpoints[returned],
            )
            rest = texts(await read_until(resumed, until_texts("m")))
            assert rest == expected[returned:], f"checkpoint after {returned} messages"
            await resumed.close()


async def test_a_restored_pending_span_is_replayed_when_its_ack_arrives() -> None:
    async with broker_env() as env:
        journal = await env.journal("t/restore")
        begin, end = await env.append_messages(journal, transaction(P1, 1, 3, "p"))
        # The checkpoint of a reader that read the span (still pending) and nothing more.
        cp = SequencerCheckpoint(
            read_through={journal: end},
            producers={JournalProducer(journal, P1): ProducerState(last_ack=0, begin=begin)},
        )
        await env.append_messages(journal, [msg(P1, 4, ACK), msg(MARKER, 1, OUTSIDE, "m")])
        it = ReadCommittedIter(env.client, {journal: 0}, message_type=Msg, checkpoint=cp)
        got = await read_until(it, until_texts("m"))
        assert texts(got) == ["p0", "p1", "p2", "m"]
        assert it.replays == 1
        await it.close()


async def _write_mixed_history(env: Env, journal: str) -> list[str]:
    """Transactions interleaved with outside messages, a rollback and duplicates; returns the
    texts a read-committed reader delivers, in order."""
    await env.append_messages(
        journal,
        [
            msg(P1, 1, CONTINUE, "p1"),
            msg(P2, 10, OUTSIDE, "o1"),
            msg(P1, 2, CONTINUE, "p2"),
            msg(P2, 11, OUTSIDE, "o2"),
            msg(P3, 20, CONTINUE, "q1"),
        ],
    )
    await env.append_messages(
        journal,
        [
            msg(P1, 3, ACK),
            msg(P2, 11, OUTSIDE, "o2"),
            msg(P3, 21, CONTINUE, "q2"),
            msg(P1, 4, CONTINUE, "p3 rolled back"),
            msg(P1, 3, ACK),
            msg(P2, 12, OUTSIDE, "o3"),
            msg(P3, 22, ACK),
            msg(MARKER, 1, OUTSIDE, "end"),
        ],
    )
    return ["o1", "o2", "p1", "p2", "o3", "q1", "q2", "end"]


@pytest.mark.parametrize("ring_size", [1, 3, 1024])
async def test_resuming_from_a_checkpoint_delivers_exactly_the_rest(ring_size: int) -> None:
    async with broker_env() as env:
        journal = await env.journal("t/resume")
        expected = await _write_mixed_history(env, journal)

        for taken in range(len(expected)):
            first = ReadCommittedIter(
                env.client, {journal: 0}, message_type=Msg, ring_size=ring_size
            )
            head = [(await first.next()).message.text for _ in range(taken)]
            checkpoint = first.checkpoint()
            await first.close()

            second = ReadCommittedIter(
                env.client,
                [(journal, 0)],
                message_type=Msg,
                ring_size=ring_size,
                checkpoint=checkpoint,
            )
            rest = texts(await read_until(second, until_texts("end")))
            await second.close()
            assert head + rest == expected, f"checkpoint after {taken} messages"


async def test_next_is_cancellation_safe() -> None:
    async with broker_env() as env:
        journal = await env.journal("t/cancel")
        it = ReadCommittedIter(env.client, {journal: 0}, message_type=Msg, ring_size=2)

        # Cancelled while waiting for content: nothing is lost once content arrives.
        waiting = asyncio.ensure_future(it.next())
        done, _ = await asyncio.wait([waiting], timeout=0.2)
        assert not done
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

        async def write() -> list[str]:
            expected: list[str] = []
            for t in range(20):
                base = 100 * (t + 1)
                span = transaction(P1, base, 5, f"t{t}.")
                await env.append_messages(journal, [*span[:3], msg(P2, base, OUTSIDE, f"o{t}")])
                await env.append_messages(journal, [*span[3:], msg(P1, base + 50, ACK)])
                expected += [f"o{t}", *(m.text for m in span)]
            await env.append_messages(journal, [msg(MARKER, 1, OUTSIDE, "end")])
            return [*expected, "end"]

        writer = asyncio.ensure_future(write())
        got: list[str] = []
        async with asyncio.timeout(TIMEOUT_S):
            while "end" not in got:
                try:
                    # Cancelled at whatever await next() is in: the channel, or a replay read.
                    got.append((await asyncio.wait_for(it.next(), 0.002)).message.text)
                except TimeoutError:
                    pass  # Cancelled: try again.
        assert got == await writer
        assert it.replays > 0  # Spans outgrow a ring of 2: cancellations hit replays too.
        await it.close()


async def test_try_next_drains_without_waiting() -> None:
    async with broker_env() as env:
        journal = await env.journal("t/drain")
        it = ReadCommittedIter(env.client, {journal: 0}, message_type=Msg)
        assert it.try_next() is None  # Nothing read yet; starts the readers.
        await env.append_messages(journal, [msg(P1, c, OUTSIDE, f"m{c}") for c in range(1, 6)])
        first = await asyncio.wait_for(it.next(), TIMEOUT_S)
        drained = [first]
        while (env_ := it.try_next()) is not None:
            drained.append(env_)
        assert texts(drained) == ["m1", "m2", "m3", "m4", "m5"]  # One chunk: all at hand.
        assert it.checkpoint().read_through[journal] == drained[-1].end
        await it.close()


async def test_messages_without_uuid_are_delivered_at_least_once() -> None:
    async with broker_env() as env:
        journal = await env.journal("t/nouuid")
        plain = [Msg(text="n1"), Msg(text="n1"), Msg(text="n2")]
        await env.append_messages(journal, [*plain, msg(MARKER, 1, OUTSIDE, "end")])
        it = ReadCommittedIter(env.client, {journal: 0}, message_type=Msg)
        got = await read_until(it, until_texts("end"))
        assert texts(got) == ["n1", "n1", "n2", "end"]
        assert [e.has_uuid for e in got] == [False, False, False, True]
        await it.close()


async def test_a_failed_reader_fails_next_after_what_was_read_before() -> None:
    async with broker_env() as env:
        journal = await env.journal("t/ok")
        await env.append_messages(journal, [msg(P1, 1, OUTSIDE, "fine")])
        it = ReadCommittedIter(env.client, {"t/missing": 0}, message_type=Msg)
        for _ in range(2):  # The failure is sticky.
            with pytest.raises(JournalNotFoundError, match="t/missing"):
                await asyncio.wait_for(it.next(), TIMEOUT_S)
        await it.close()


async def test_close_stops_the_readers_and_ends_iteration() -> None:
    async with broker_env() as env:
        journal = await env.journal("t/close")
        await env.append_messages(journal, [msg(P1, 1, OUTSIDE, "one")])
        async with ReadCommittedIter(env.client, {journal: 0}, message_type=Msg) as it:
            assert (await asyncio.wait_for(it.next(), TIMEOUT_S)).message.text == "one"
            blocked = asyncio.ensure_future(it.next())
            done, _ = await asyncio.wait([blocked], timeout=0.1)
            assert not done
        # Closing fails the waiter in the other task, rather than leaving it hanging.
        with pytest.raises(ReadIterClosedError):
            await asyncio.wait_for(blocked, TIMEOUT_S)
        with pytest.raises(ReadIterClosedError):
            it.try_next()
        assert [e async for e in it] == []
        await it.close()  # Idempotent.


async def test_checkpoint_includes_every_source_even_unread() -> None:
    async with broker_env() as env:
        a, b = await env.journal("txn/a"), await env.journal("txn/b")
        it = ReadCommittedIter(env.client, {a: 0, b: 7}, message_type=Msg)
        assert it.checkpoint().read_through == {a: 0, b: 7}
        cp = SequencerCheckpoint(read_through={a: 0, b: 0})
        resumed = ReadCommittedIter(env.client, {a: 5, b: 7}, message_type=Msg, checkpoint=cp)
        assert resumed.sources == {a: 0, b: 0}  # The checkpoint's offsets win.
        await it.close()
        await resumed.close()
