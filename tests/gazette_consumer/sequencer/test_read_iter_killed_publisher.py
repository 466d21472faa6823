"""End to end: a publisher process killed (SIGKILL) between its CONTINUE_TXN messages and their
ACK leaves nothing visible to read-committed readers, however far they read; a later ACK of the
same producer commits those messages, delivered once and in order."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from read_iter_testkit import ACK, CONTINUE, MARKER, OUTSIDE, P1, Msg, broker_env, msg, texts

from gazette_consumer.sequencer import JournalProducer
from gazette_consumer.sequencer.read_iter import ReadCommittedIter

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
PUBLISHER = HERE / "read_iter_publisher.py"
TIMEOUT_S = 60.0
PENDING = 5


async def run_and_kill_publisher(endpoint: str, journal: str) -> list[tuple[int, int]]:
    """Run the publisher until it has appended its pending messages, then SIGKILL it. Returns
    the [begin, end) of each message it appended."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(PUBLISHER),
        endpoint,
        journal,
        P1.hex(),
        "100",
        str(PENDING),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(TIMEOUT_S):
            line = (await proc.stdout.readline()).decode().split()
    finally:
        proc.kill()  # SIGKILL: no chance to publish anything more.
        returncode = await proc.wait()
    assert returncode == -signal.SIGKILL
    assert line[0] == "appended", line
    return [(int(b), int(e)) for b, e in (span.split("-") for span in line[1:])]


async def test_killed_publisher_leaves_nothing_visible_until_a_later_ack() -> None:
    async with broker_env() as env:
        journal = await env.journal("e2e/pending")
        tailing = ReadCommittedIter(env.client, {journal: 0}, message_type=Msg)
        assert tailing.try_next() is None  # Reading from here on, while the publisher runs.

        spans = await run_and_kill_publisher(env.broker.endpoint, journal)
        assert len(spans) == PENDING

        # Read through the write head: a marker appended after the pending messages is
        # delivered, and nothing before it is.
        await env.append_messages(journal, [msg(MARKER, 1, OUTSIDE, "marker-1")])
        first = await asyncio.wait_for(tailing.next(), TIMEOUT_S)
        assert first.message.text == "marker-1"
        assert first.begin == spans[-1][1]  # Right after the last pending message.
        assert tailing.try_next() is None
        checkpoint = tailing.checkpoint()
        assert checkpoint.read_through[journal] == first.end
        # The pending span is remembered, from its first message, for the ACK to replay.
        assert checkpoint.producers[JournalProducer(journal, P1)].begin == spans[0][0]

        # Someone acknowledges for the producer (as a recovered shard re-writes its ACK
        # intents), with a later clock; re-appended copies of the pending messages and a
        # re-sent ACK change nothing.
        await env.append_messages(journal, [msg(P1, 100 + PENDING, ACK)])
        await env.append_messages(
            journal,
            [
                msg(P1, 100, CONTINUE, "pending-0"),
                msg(P1, 100 + PENDING, ACK),
                msg(MARKER, 2, OUTSIDE, "marker-2"),
            ],
        )
        pending = [f"pending-{i}" for i in range(PENDING)]
        got = [await asyncio.wait_for(tailing.next(), TIMEOUT_S) for _ in range(PENDING + 1)]
        assert texts(got) == [*pending, "marker-2"]
        assert [(e.begin, e.end) for e in got[:PENDING]] == spans
        assert tailing.try_next() is None
        await tailing.close()

        # A reader starting afresh sees the same committed history.
        fresh = ReadCommittedIter(env.client, {journal: 0}, message_type=Msg)
        again = [await asyncio.wait_for(fresh.next(), TIMEOUT_S) for _ in range(PENDING + 2)]
        assert texts(again) == ["marker-1", *pending, "marker-2"]
        assert fresh.try_next() is None
        await fresh.close()
