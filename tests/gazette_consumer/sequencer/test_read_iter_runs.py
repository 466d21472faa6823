"""ReadCommittedIter's runs (`Sequencer.commit_alone_run`): a piece of one producer's OUTSIDE_TXN
messages is committed at once and returned one by one, yet every checkpoint taken between two
of them, idle producers pruned or not, is the one committing them one by one would give, and
duplicates after a run are still dropped."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from read_iter_testkit import ACK, CONTINUE, OUTSIDE, P1, P2, P3, Msg, broker_env, frames, msg

from gazette_consumer.sequencer import JournalProducer, ProducerState
from gazette_consumer.sequencer.read_iter import ReadCommittedIter, ReadIterClosedError
from gazette_consumer.sequencer.types import CLOCK_MAX

TIMEOUT_S = 60.0


async def take(it: ReadCommittedIter) -> Any:
    env = it.try_next()
    if env is None:
        async with asyncio.timeout(TIMEOUT_S):
            env = await it.next()
    return env


async def test_checkpoints_inside_a_run_are_per_message_ones() -> None:
    # A run (P1, 300 messages), a duplicate of part of it, a P2 transaction, P1 resuming.
    run = [msg(P1, 1000 + i, OUTSIDE, f"r{i}") for i in range(300)]
    dups = run[100:110]
    txn = [msg(P2, 50 + i, CONTINUE, f"t{i}") for i in range(3)] + [msg(P2, 60, ACK)]
    after = [msg(P1, 2000 + i, OUTSIDE, f"a{i}") for i in range(5)]
    expected = [m.text for m in run] + [f"t{i}" for i in range(3)] + [m.text for m in after]
    async with broker_env() as env:
        journal = await env.journal("runs/a")
        await env.append(journal, frames(*run))
        await env.append(journal, frames(*dups, *txn, *after))
        jp = JournalProducer(journal, P1)

        it = ReadCommittedIter(env.client, {journal: 0}, message_type=Msg)
        got: list[Any] = []
        longest_run = 0
        cuts = set(random.Random(3).sample(range(1, len(expected)), 6)) | {1, 150, 299}
        for n in range(1, len(expected) + 1):
            got.append(await take(it))
            longest_run = max(longest_run, it._run_left())
            last = got[-1]
            if last.producer != P1:
                continue
            # As committing one by one through `last` leaves it (a horizon at its clock
            # prunes nothing; see the next test for one past it).
            cp = it.checkpoint()
            assert cp.read_through[journal] == last.end
            assert cp.producers[jp] == ProducerState(last_ack=last.clock, begin=-1)
            at_horizon = it.checkpoint(last.clock)
            assert at_horizon.producers[jp] == cp.producers[jp]
            assert at_horizon.read_through == cp.read_through
            if n in cuts:  # A new iterator from the checkpoint returns exactly the rest.
                rest = ReadCommittedIter(env.client, {journal: 0}, message_type=Msg, checkpoint=cp)
                tail = [await take(rest) for _ in range(len(expected) - n)]
                assert [e.message.text for e in got + tail] == expected
                assert rest.try_next() is None
                await rest.close()
        assert longest_run > 100  # The run path was taken.
        assert [e.message.text for e in got] == expected  # The duplicates were dropped.
        assert it.try_next() is None
        await it.close()


async def test_a_transaction_taken_at_once_is_returned_as_if_stepped_one_by_one() -> None:
    # ReadCommittedIter takes an ACK's messages from the ring at once (Sequencer.dequeue_all):
    # yet `in_sequence` holds until the transaction's last message, and every checkpoint
    # within it is the one stepping its messages one by one gives (the journal read up to the
    # ACK, the rest of the span pending), from which a restart returns exactly the rest.
    txn = [msg(P1, 100 + i, CONTINUE, f"t{i}") for i in range(40)] + [msg(P1, 200, ACK)]
    other = [msg(P2, 10 + i, OUTSIDE, f"o{i}") for i in range(3)]
    # A second transaction interleaved with another producer's, whose ACK comes later.
    mixed = [msg(P1, 300 + i // 2, CONTINUE, f"u{i // 2}") if i % 2 == 0 else
             msg(P3, 50 + i // 2, CONTINUE, f"v{i // 2}") for i in range(10)]  # fmt: skip
    tail = [msg(P1, 400, ACK), msg(P2, 20, OUTSIDE, "o3"), msg(P3, 60, ACK)]
    # Short transactions, each whole in one decoded piece: committed without the ring
    # (Sequencer.commit_span_run), returned alike.
    short = [msg(P2, 100 + 10 * t + i, CONTINUE, f"w{t}.{i}") for t in range(3) for i in range(4)]
    for t in (2, 1, 0):
        short.insert(4 * t + 4, msg(P2, 100 + 10 * t + 5, ACK))
    expected = [f"t{i}" for i in range(40)] + [f"o{i}" for i in range(3)]
    expected += [f"u{i}" for i in range(5)] + ["o3"] + [f"v{i}" for i in range(5)]
    expected += [f"w{t}.{i}" for t in range(3) for i in range(4)]
    ends_of_txns = {"t39", "u4", "v4", "w0.3", "w1.3", "w2.3"}
    ack_at = len(frames(*txn[:40]))
    async with broker_env() as env:
        journal = await env.journal("runs/txn")
        await env.append(journal, frames(*txn, *other, *mixed, *tail, *short))
        jp = JournalProducer(journal, P1)

        it = ReadCommittedIter(env.client, {journal: 0}, message_type=Msg)
        got: list[Any] = []
        longest_run = 0
        for n in range(1, len(expected) + 1):
            got.append(await take(it))
            longest_run = max(longest_run, it._run_left())
            last = got[-1]
            text = last.message.text
            assert it.in_sequence == (text[0] in "tuvw" and text not in ends_of_txns), text
            cp = it.checkpoint()
            if text[0] == "t" and text != "t39":
                assert cp.read_through[journal] == ack_at
                assert cp.producers[jp] == ProducerState(last_ack=last.clock, begin=last.end)
                # A pending span is never pruned, whatever the horizon.
                assert it.checkpoint(CLOCK_MAX).producers[jp] == cp.producers[jp]
            if text[0] == "w" and text not in ends_of_txns:  # The same within a short one.
                assert cp.read_through[journal] == last.end + (3 - int(text[-1])) * (
                    last.end - last.begin
                )
                jp2 = JournalProducer(journal, P2)
                assert cp.producers[jp2] == ProducerState(last_ack=last.clock, begin=last.end)
                assert it.checkpoint(CLOCK_MAX).producers[jp2] == cp.producers[jp2]
            rest = ReadCommittedIter(env.client, {journal: 0}, message_type=Msg, checkpoint=cp)
            after = [await take(rest) for _ in range(len(expected) - n)]
            assert [e.message.text for e in got + after] == expected, f"after {n}"
            assert rest.try_next() is None
            await rest.close()
        assert longest_run > 30  # The transaction was taken at once.
        assert it.try_next() is None
        await it.close()


async def test_pruning_inside_a_run_keeps_dropping_its_duplicates() -> None:
    newer = msg(
        P3, 5000, OUTSIDE, "newer"
    )  # The journal's newest clock: what a horizon spans from.
    run = [msg(P1, 1000 + i, OUTSIDE, f"r{i}") for i in range(200)]
    marker = msg(P2, 5, OUTSIDE, "end")
    async with broker_env() as env:
        journal = await env.journal("runs/b")
        await env.append(journal, frames(newer, *run))
        await env.append(journal, frames(*run[50:60], marker))
        it = ReadCommittedIter(env.client, {journal: 0}, message_type=Msg)
        got = [await take(it) for _ in range(11)]
        assert it._run_left() > 10  # Inside a run.
        jp, jp3 = JournalProducer(journal, P1), JournalProducer(journal, P3)
        kept = {jp: ProducerState(1009, -1), jp3: ProducerState(5000, -1)}
        assert it.checkpoint(5000 - 1009).producers == kept
        # A horizon that reaches past the last returned message prunes the producer, as one
        # taken between messages committed one by one would; the next message would make the
        # producer's state anew, and the run's end leaves it where the duplicates are dropped.
        pruned = it.checkpoint(5000 - 1010)
        assert pruned.producers == {jp3: kept[jp3]}
        assert pruned.read_through[journal] == got[-1].end
        got += [await take(it) for _ in range(191)]
        assert [e.message.text for e in got] == ["newer"] + [m.text for m in run] + ["end"]
        assert it.try_next() is None
        await it.close()


async def test_close_inside_a_run_ends_it() -> None:
    async with broker_env() as env:
        journal = await env.journal("runs/c")
        await env.append(journal, frames(*(msg(P1, 10 + i, OUTSIDE, f"r{i}") for i in range(50))))
        it = ReadCommittedIter(env.client, {journal: 0}, message_type=Msg)
        assert [(await take(it)).message.text for _ in range(5)] == [f"r{i}" for i in range(5)]
        assert it._run_left() > 5  # Inside a run.
        await it.close()
        with pytest.raises(ReadIterClosedError):
            it.try_next()


async def test_runs_form_anywhere_in_a_piece() -> None:
    """A run after a transaction, or after producers interleaved message by message, is
    committed at once too (not only a piece's leading run), with the same deliveries, the same
    per-message checkpoints and the same duplicates dropped as one message at a time."""
    p3 = P3
    txn = [msg(P2, 50 + i, CONTINUE, f"t{i}") for i in range(3)] + [msg(P2, 60, ACK)]
    run1 = [msg(P1, 1000 + i, OUTSIDE, f"a{i}") for i in range(120)]
    mixed = [msg(P1 if i % 2 else p3, 3000 + i, OUTSIDE, f"m{i}") for i in range(10)]
    run3 = [msg(p3, 4000 + i, OUTSIDE, f"c{i}") for i in range(120)]
    dups = run1[40:45] + run3[10:12]
    tail = [msg(P1, 5000 + i, OUTSIDE, f"z{i}") for i in range(3)]
    stream = [*txn, *run1, *mixed, *run3, *dups, *tail]
    expected = [m.text for m in (*txn[:3], *run1, *mixed, *run3, *tail)]
    async with broker_env() as env:
        journal = await env.journal("runs/d")
        await env.append(journal, frames(*stream))  # One piece: every run but none leads it.
        it = ReadCommittedIter(env.client, {journal: 0}, message_type=Msg)
        got: list[Any] = []
        longest = {P1: 0, p3: 0}
        cuts = {5, 60, 130, 200}
        for n in range(1, len(expected) + 1):
            got.append(await take(it))
            last = got[-1]
            if last.producer not in longest:
                continue
            longest[last.producer] = max(longest[last.producer], it._run_left())
            cp = it.checkpoint()
            assert cp.read_through[journal] == last.end
            jp = JournalProducer(journal, last.producer)
            assert cp.producers[jp] == ProducerState(last_ack=last.clock, begin=-1)
            if n in cuts:  # A new iterator from the checkpoint returns exactly the rest.
                rest = ReadCommittedIter(env.client, {journal: 0}, message_type=Msg, checkpoint=cp)
                more = [await take(rest) for _ in range(len(expected) - n)]
                assert [e.message.text for e in got + more] == expected
                assert rest.try_next() is None
                await rest.close()
        assert longest[P1] > 100 and longest[p3] > 100  # Both runs were taken at once.
        assert [e.message.text for e in got] == expected
        assert it.try_next() is None
        await it.close()
