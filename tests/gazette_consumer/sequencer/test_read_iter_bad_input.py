"""Bad input to the read iterators: garbage in fixed-framed journals is skipped after
resynchronising, with a logged error naming journal and offsets; malformed messages fail with a
typed error naming journal and offsets; bad journals and arguments are refused clearly."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import structlog
from read_iter_testkit import (
    ACK,
    CONTINUE,
    MARKER,
    OUTSIDE,
    P1,
    P2,
    FixedMsg,
    Msg,
    broker_env,
    fixed,
    frames,
    msg,
    texts,
)

from broker.client.retry_reader import RetryReader
from broker.client.route_cache import JournalClient
from broker.protocol import protocol_pb2 as pb
from broker.protocol.validate import ValidationError
from gazette_consumer.message import MessageDecodeError, UnknownContentTypeError
from gazette_consumer.sequencer.read_iter import ReadCommittedIter
from gazette_consumer.sequencer.read_uncommitted import ReadUncommittedIter

TIMEOUT_S = 60.0
GARBAGE = b"\x00garbage, not a frame\xff"


def skipped(logs: Sequence[Mapping[str, Any]]) -> list[tuple[str, int, int, str]]:
    return [
        (e["journal"], e["begin"], e["end"], e["kind"])
        for e in logs
        if e["event"] == "skipped unreadable journal content" and e["log_level"] == "error"
    ]


def bounded(client: JournalClient, journal: str, begin: int, end: int) -> RetryReader:
    request = pb.ReadRequest(journal=journal, offset=begin, end_offset=end, block=True)
    return RetryReader(client, request)


async def test_fixed_garbage_is_skipped_and_logged_by_uncommitted_reads() -> None:
    async with broker_env() as env:
        journal = await env.fixed_journal("bad/fixed")
        one, two = fixed(P1, 1, OUTSIDE, "one"), fixed(P1, 2, OUTSIDE, "two")
        head = (await env.append(journal, one + GARBAGE + two)).commit.end

        with structlog.testing.capture_logs() as logs:
            it = ReadUncommittedIter(bounded(env.client, journal, 0, head), FixedMsg)
            got = [e async for e in it]
        assert [(e.message.text, e.begin, e.end) for e in got] == [
            ("one", 0, len(one)),
            ("two", len(one) + len(GARBAGE), head),
        ]
        assert skipped(logs) == [(journal, len(one), len(one) + len(GARBAGE), "FrameDesyncError")]
        assert it.skipped_bytes == len(GARBAGE)


async def test_fixed_garbage_inside_a_replayed_span_is_skipped_both_times() -> None:
    async with broker_env() as env:
        journal = await env.fixed_journal("bad/fixed-txn")
        head = (
            await env.append(
                journal,
                fixed(P1, 1, CONTINUE, "p1")
                + GARBAGE
                + fixed(P2, 9, OUTSIDE, "o1")
                + fixed(P1, 2, CONTINUE, "p2")
                + fixed(P1, 3, ACK)
                + GARBAGE,  # Trailing: reported once the marker's frame resynchronises.
            )
        ).commit.end
        marker = (await env.append(journal, fixed(MARKER, 1, OUTSIDE, "m"))).commit

        with structlog.testing.capture_logs() as logs:
            # A ring of one entry: the ACK's span is replayed from the journal, garbage and all.
            it = ReadCommittedIter(env.client, {journal: 0}, message_type=FixedMsg, ring_size=1)
            got = [await asyncio.wait_for(it.next(), TIMEOUT_S) for _ in range(4)]
        assert texts(got) == ["o1", "p1", "p2", "m"]
        assert it.replays == 1
        first = len(fixed(P1, 1, CONTINUE, "p1"))
        garbage_in_span = (journal, first, first + len(GARBAGE), "FrameDesyncError")
        trailing = (journal, head - len(GARBAGE), head, "FrameDesyncError")
        # In either order: the replay and the background reader's read ahead run concurrently.
        assert sorted(skipped(logs)) == [garbage_in_span, garbage_in_span, trailing]
        # Skipped content counts as read: a checkpoint resumes after it.
        assert it.checkpoint().read_through[journal] == marker.end
        await it.close()


async def test_an_over_long_json_line_is_skipped_and_logged() -> None:
    async with broker_env() as env:
        journal = await env.journal("bad/long")
        long = frames(msg(P1, 1, OUTSIDE, "x" * 200))
        short = frames(msg(P1, 2, OUTSIDE, "ok"))
        head = (await env.append(journal, long + short)).commit.end
        with structlog.testing.capture_logs() as logs:
            reader = bounded(env.client, journal, 0, head)
            it = ReadUncommittedIter(reader, Msg, message_bytes_max=100)
            got = [e async for e in it]
        assert [(e.message.text, e.begin) for e in got] == [("ok", len(long))]
        assert skipped(logs) == [(journal, 0, len(long), "FrameTooLargeError")]


async def test_content_skipped_after_the_last_message_counts_as_read() -> None:
    async with broker_env() as env:
        journal = await env.journal("bad/long-tail")
        messages = frames(msg(P1, 1, OUTSIDE, "a"), msg(P1, 2, OUTSIDE, "b"))
        long = frames(msg(P1, 3, OUTSIDE, "x" * 200))
        head = (await env.append(journal, messages + long)).commit.end
        with structlog.testing.capture_logs() as logs:
            it = ReadCommittedIter(
                env.client, {journal: 0}, message_type=Msg, message_bytes_max=100
            )
            got = [await asyncio.wait_for(it.next(), TIMEOUT_S) for _ in range(2)]
            assert texts(got) == ["a", "b"]
            # The next look decodes nothing more; the skipped line still counts as read, so
            # that a checkpoint resumes past it, not at it.
            assert it.try_next() is None
        assert skipped(logs) == [(journal, len(messages), head, "FrameTooLargeError")]
        assert it.checkpoint().read_through[journal] == head
        await it.close()


async def test_malformed_json_names_journal_and_offsets() -> None:
    async with broker_env() as env:
        journal = await env.journal("bad/json")
        good = frames(msg(P1, 1, OUTSIDE, "good"))
        bad = b'{"UUID": "not a uuid", "text": 3\n'
        after = frames(msg(P1, 2, OUTSIDE, "after"))
        head = (await env.append(journal, good + bad + after)).commit.end

        it = ReadUncommittedIter(bounded(env.client, journal, 0, head), Msg)
        assert (await it.next()).message.text == "good"
        for _ in range(2):  # The iterator stays failed: it cannot skip a message silently.
            with pytest.raises(MessageDecodeError) as caught:
                await it.next()
            assert (caught.value.journal, caught.value.begin, caught.value.end) == (
                journal,
                len(good),
                len(good) + len(bad),
            )
            assert f"journal {journal} offsets [{len(good)}, {len(good) + len(bad)})" in str(
                caught.value
            )
            assert "malformed JSON" in str(caught.value)
        assert it.offset == len(good)  # Reading would resume at the bad message.

        committed = ReadCommittedIter(env.client, {journal: 0}, message_type=Msg)
        assert (await asyncio.wait_for(committed.next(), TIMEOUT_S)).message.text == "good"
        for _ in range(2):
            with pytest.raises(MessageDecodeError, match=f"journal {journal} offsets"):
                await asyncio.wait_for(committed.next(), TIMEOUT_S)
        assert committed.checkpoint().read_through[journal] == len(good)
        await committed.close()


async def test_an_invalid_message_uuid_names_journal_and_offsets() -> None:
    async with broker_env() as env:
        journal = await env.journal("bad/uuid")
        v4 = b'{"UUID": "9b2f8a84-2d5c-4f3b-9c1e-2f0d6e7a8b9c", "text": "v4"}\n'
        head = (await env.append(journal, v4)).commit.end
        it = ReadUncommittedIter(bounded(env.client, journal, 0, head), Msg)
        with pytest.raises(MessageDecodeError, match=rf"journal {journal} offsets \[0, {head}\)"):
            await it.next()


async def test_a_journal_without_a_known_content_type_is_refused() -> None:
    async with broker_env() as env:
        unlabelled = await env.journal("bad/unlabelled", content_type=None)
        unknown = await env.journal("bad/unknown", content_type="application/x-unknown")
        await env.append(unlabelled, frames(msg(P1, 1, OUTSIDE)))
        for journal, shown in ((unlabelled, "''"), (unknown, "'application/x-unknown'")):
            it = ReadUncommittedIter(bounded(env.client, journal, 0, 0), Msg)
            with pytest.raises(UnknownContentTypeError, match=f"journal {journal}: .*{shown}"):
                await it.next()
            committed = ReadCommittedIter(env.client, {journal: 0}, message_type=Msg)
            with pytest.raises(UnknownContentTypeError, match=f"journal {journal}"):
                await asyncio.wait_for(committed.next(), TIMEOUT_S)
            await committed.close()


def test_bad_arguments_are_refused_before_anything_starts() -> None:
    client = JournalClient("http://127.0.0.1:1")  # Never dialled.
    cases: list[tuple[Any, dict[str, Any], type[Exception], str]] = [
        ({}, {}, ValidationError, "sources: must name at least one journal"),
        ([("a/one", 0), ("a/one", 5)], {}, ValidationError, r"sources\[a/one\]: duplicate"),
        ({"a/one": -1}, {}, ValidationError, r"sources\[a/one\]: offset must be an int"),
        ({"a/one": True}, {}, ValidationError, r"sources\[a/one\]: offset must be an int"),
        ({"x": 0}, {}, ValidationError, "sources.*length"),
        ({"a/one": 0}, {"read_channel_size": 0}, ValidationError, "read_channel_size: must be"),
        ({"a/one": 0}, {"ring_size": 0}, ValueError, "ring_size: must be in"),
    ]
    for sources, kwargs, error, match in cases:
        with pytest.raises(error, match=match):
            ReadCommittedIter(client, sources, message_type=Msg, **kwargs)
