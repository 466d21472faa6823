"""ReadUncommittedIter against a real in-process broker: JSON and fixed framings, offsets,
duplicates and pending messages returned as written, blocking reads, message type functions."""

from __future__ import annotations

import asyncio

import pytest
from read_iter_testkit import (
    ACK,
    CONTINUE,
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
from broker.protocol import protocol_pb2 as pb
from gazette_consumer.message import FixedFraming, build_uuid
from gazette_consumer.sequencer.read_uncommitted import ReadUncommittedIter


def bounded(client: object, journal: str, begin: int, end: int) -> RetryReader:
    request = pb.ReadRequest(journal=journal, offset=begin, end_offset=end, block=True)
    return RetryReader(client, request)  # type: ignore[arg-type]


async def test_json_envelopes_carry_offsets_and_uuid_parts() -> None:
    async with broker_env() as env:
        journal = await env.journal("a/json")
        written = [
            msg(P1, 100, CONTINUE, "one"),
            msg(P1, 101, CONTINUE, "two"),
            msg(P1, 100, CONTINUE, "one"),  # A duplicate: uncommitted readers see it.
            msg(P2, 500, OUTSIDE, "three"),
            msg(P1, 102, ACK),
        ]
        _, mid = await env.append_messages(journal, written[:2])
        _, head = await env.append_messages(journal, written[2:])

        it = ReadUncommittedIter(bounded(env.client, journal, 0, head), Msg)
        got = [e async for e in it]

        assert texts(got) == ["one", "two", "one", "three", ""]
        sizes = [len(frames(m)) for m in written]
        begins = [sum(sizes[:i]) for i in range(len(sizes))]
        assert [(e.journal, e.begin, e.end) for e in got] == [
            (journal, b, b + s) for b, s in zip(begins, sizes, strict=True)
        ]
        assert got[2].end == begins[3] and begins[2] == mid  # The second append's first frame.
        assert [(e.producer, e.clock, e.flags) for e in got] == [
            (P1, 100, CONTINUE),
            (P1, 101, CONTINUE),
            (P1, 100, CONTINUE),
            (P2, 500, OUTSIDE),
            (P1, 102, ACK),
        ]
        assert got[0].uuid == build_uuid(P1, 100, CONTINUE)
        assert it.offset == head
        assert it.spec is not None and it.spec.name == journal
        with pytest.raises(StopAsyncIteration):
            await it.next()
        await it.close()


async def test_fixed_framing_with_protobuf_like_and_raw_bytes_messages() -> None:
    async with broker_env() as env:
        journal = await env.fixed_journal("a/fixed")
        content = fixed(P1, 7, OUTSIDE, "alpha") + fixed(P2, 9, CONTINUE, "beta")
        raw_payload = FixedFraming().marshal(b"no uuid here")
        head = (await env.append(journal, content + raw_payload)).commit.end

        it = ReadUncommittedIter(bounded(env.client, journal, 0, head - len(raw_payload)), FixedMsg)
        got = [e async for e in it]
        assert [(e.message.text, e.producer, e.clock, e.flags) for e in got] == [
            ("alpha", P1, 7, OUTSIDE),
            ("beta", P2, 9, CONTINUE),
        ]
        first_len = len(fixed(P1, 7, OUTSIDE, "alpha"))
        assert [(e.begin, e.end) for e in got] == [
            (0, first_len),
            (first_len, head - len(raw_payload)),
        ]

        # Raw bytes messages carry no UUID: zero producer and clock, at-least-once.
        raw = ReadUncommittedIter(
            bounded(env.client, journal, head - len(raw_payload), head), bytes
        )
        [only] = [e async for e in raw]
        assert (only.message, only.begin, only.end) == (
            b"no uuid here",
            head - len(raw_payload),
            head,
        )
        assert (only.has_uuid, only.clock, only.flags) == (False, 0, OUTSIDE)


async def test_reads_from_a_mid_journal_offset_and_blocks_for_later_appends() -> None:
    async with broker_env() as env:
        journal = await env.journal("a/json")
        _, first_end = await env.append_messages(journal, [msg(P1, 1, OUTSIDE, "first")])
        await env.append_messages(journal, [msg(P1, 2, OUTSIDE, "second")])

        reader = RetryReader(
            env.client, pb.ReadRequest(journal=journal, offset=first_end, block=True)
        )
        it = ReadUncommittedIter(reader, Msg)
        assert (await it.next()).message.text == "second"

        # Nothing more is written yet: the next read blocks until the append below lands.
        pending = asyncio.ensure_future(it.next())
        begin, end = await env.append_messages(journal, [msg(P1, 3, OUTSIDE, "third")])
        late = await asyncio.wait_for(pending, 30)
        assert (late.message.text, late.begin, late.end) == ("third", begin, end)
        await it.close()


async def test_message_type_may_be_chosen_from_the_journal_spec() -> None:
    async with broker_env() as env:
        journal = await env.journal("a/json")
        _, head = await env.append_messages(journal, [msg(P1, 1, OUTSIDE, "x")])
        seen: list[str] = []

        def message_type_for(spec: pb.JournalSpec) -> type[Msg]:
            seen.append(spec.name)
            return Msg

        it = ReadUncommittedIter(bounded(env.client, journal, 0, head), message_type_for)
        assert texts([e async for e in it]) == ["x"]
        assert seen == [journal]


async def test_next_batch_returns_a_chunk_of_envelopes_at_once() -> None:
    async with broker_env() as env:
        journal = await env.journal("a/json")
        _, head = await env.append_messages(
            journal, [msg(P1, c, OUTSIDE, str(c)) for c in range(1, 51)]
        )
        it = ReadUncommittedIter(bounded(env.client, journal, 0, head), Msg)
        batches = []
        while batch := await it.next_batch():
            batches.append(batch)
        # 50 small messages arrive in one chunk: one batch, in order.
        assert [texts(b) for b in batches] == [[str(c) for c in range(1, 51)]]
        assert it.offset == head
