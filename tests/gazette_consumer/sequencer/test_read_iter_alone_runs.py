"""ReadCommittedIter hands out a run of messages that each commit alone from a C callable
(`try_next` while the run is held): random histories of several producers (OUTSIDE_TXN runs
long and short, producers alternating, transactions committed and rolled back, re-appended
duplicates, messages without a UUID, a transaction left pending; producers alternating are
committed a run at once too, `Sequencer.commit_alone_mixed`) deliver what the general
protocol of a plain Sequencer delivers, with `in_sequence` and the checkpoint after every
returned message one of that protocol's own, however `try_next` is called (read afresh, or a
callable a caller kept, as the shard's transaction loop keeps one, across runs and after the
run it was read in); and a new iterator from a checkpoint returns exactly the rest."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterable
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

from broker.client.retry_reader import RetryReader
from broker.protocol import protocol_pb2 as pb
from gazette_consumer.message import NIL_UUID, Envelope, ProducerID
from gazette_consumer.sequencer import Sequencer, SequencerCheckpoint
from gazette_consumer.sequencer.read_iter import (
    RING_SIZE_DEFAULT,
    ReadCommittedIter,
    ReadIterClosedError,
    ReadUncommittedIter,
)
from gazette_consumer.sequencer.types import FLAG_ACK_TXN

TIMEOUT_S = 60.0
PRODUCERS = (P1, P2, P3)


def history(rng: random.Random) -> list[list[Msg]]:
    """Random appends of test messages, the last ending with a MARKER message."""
    clocks = {p: 100 for p in PRODUCERS}
    acked = {p: 50 for p in PRODUCERS}  # The clock of each producer's last ACK.
    written: list[Msg] = []
    label = iter(range(1_000_000))

    def tick(p: ProducerID) -> int:
        clocks[p] += rng.randint(1, 3)
        return clocks[p]

    def outside(p: ProducerID) -> Msg:
        return msg(p, tick(p), OUTSIDE, f"m{next(label)}")

    kinds = [rng.choice(["run", "run", "mixed", "txn", "rollback", "dup", "nil"]) for _ in range(8)]
    for kind in [*rng.sample(kinds, rng.randint(3, 8)), "mixed"]:
        p = rng.choice(PRODUCERS)
        if kind == "run":  # One producer's run, often longer than a decoded piece.
            written += [outside(p) for _ in range(rng.choice([1, 2, 30, 150, 400]))]
        elif kind == "mixed":  # Producers alternating, runs of a few.
            for _ in range(rng.randint(5, 60)):
                q = rng.choice(PRODUCERS)
                written += [outside(q) for _ in range(rng.choice([1, 1, 2, 5]))]
        elif kind in ("txn", "rollback"):  # Others' messages may come in between.
            for _ in range(rng.randint(1, 40)):
                written.append(msg(p, tick(p), CONTINUE, f"m{next(label)}"))
                if rng.random() < 0.3:
                    written.append(outside(rng.choice([q for q in PRODUCERS if q != p])))
            if kind == "txn":
                acked[p] = clocks[p]
                written.append(msg(p, acked[p], ACK))
            else:  # The producer's last ACK again: the messages after it roll back.
                written.append(msg(p, acked[p], ACK))
                tick(p)
        elif kind == "dup" and written:  # A re-append of what was written.
            begin = rng.randrange(len(written))
            written += written[begin : begin + rng.randint(1, 200)]
        elif kind == "nil":  # Without a UUID: delivered as read.
            written += [
                Msg(uuid=NIL_UUID, text=f"m{next(label)}") for _ in range(rng.randint(1, 5))
            ]
    if rng.random() < 0.5:  # A transaction left pending: never delivered.
        written += [msg(P1, tick(P1), CONTINUE, f"m{next(label)}") for _ in range(3)]
    written.append(msg(MARKER, 5, OUTSIDE, "end"))
    cuts = sorted(rng.sample(range(1, len(written)), min(3, len(written) - 1)))
    return [written[a:b] for a, b in zip([0, *cuts], [*cuts, len(written)], strict=True)]


def frozen(cp: SequencerCheckpoint) -> Any:
    return (tuple(sorted(cp.read_through.items())), tuple(sorted(cp.producers.items())))


def general_protocol(envelopes: list[Envelope[Any]]) -> tuple[list[str], list[set[Any]]]:
    """What a plain Sequencer (ring as the iterator's) delivers through `queue_trusted` and
    `dequeue()`, one envelope at a time: the texts delivered, and per count of messages
    delivered the (in_sequence, checkpoint) pairs a reader may stand at: just after a message
    that more of the same ACK's follow, or stepped to the end after any envelope."""
    seq: Sequencer[Envelope[Any]] = Sequencer(RING_SIZE_DEFAULT)
    texts: list[str] = []
    points: list[set[Any]] = [set()]
    for env in envelopes:
        seq.queue_trusted(env)
        assert seq.replay_required is None  # Histories fit the ring.
        after: Any = None  # The checkpoint just after the last message dequeued.
        while (got := seq.dequeue()) is not None:
            if got.flags == FLAG_ACK_TXN:
                continue
            if after is not None:  # More of the same sequence followed it.
                points[len(texts)].add((True, after))
            texts.append(got.message.text)
            points.append(set())
            after = frozen(seq.checkpoint())
        points[len(texts)].add((False, frozen(seq.checkpoint())))
    return texts, points


def texts(envelopes: Iterable[Envelope[Any]]) -> list[str]:
    """The texts of the messages among `envelopes` (not of ACKs)."""
    return [e.message.text for e in envelopes if e.flags != FLAG_ACK_TXN]


async def read_all(journal: str, client: Any, end: int) -> list[Envelope[Any]]:
    reader = RetryReader(client, pb.ReadRequest(journal=journal, offset=0, end_offset=end))
    it = ReadUncommittedIter(reader, Msg)
    out: list[Envelope[Any]] = []
    async with asyncio.timeout(TIMEOUT_S):
        async for env in it:
            out.append(env)
    return out


@pytest.mark.parametrize("seed", range(8))
async def test_random_histories_deliver_and_checkpoint_as_the_general_protocol(seed: int) -> None:
    rng = random.Random(seed)
    appends = history(rng)
    async with broker_env() as env:
        journal = await env.journal(f"alone/h{seed}")
        end = 0
        for batch in appends:
            end = (await env.append(journal, frames(*batch))).commit.end
        expected, points = general_protocol(await read_all(journal, env.client, end))
        assert expected[-1] == "end"

        it = ReadCommittedIter(env.client, {journal: 0}, message_type=Msg)
        kept: Callable[[], Any] = it.try_next  # As a caller keeping it across runs would.
        got: list[str] = []
        checkpoints: list[SequencerCheckpoint] = []
        alone_runs = mixed_runs = 0
        async with asyncio.timeout(TIMEOUT_S):
            while len(got) < len(expected):
                how = rng.random()
                if how < 0.1:
                    e = await it.next()
                else:
                    if how < 0.3:
                        kept = it.try_next  # Kept from now on, across runs.
                    e = (kept if how < 0.6 else it.try_next)()
                    if e is None:
                        e = await it.next()
                alone_runs += it._alone is not None
                mixed_runs += it._alone is not None and it._run_before is not None
                got.append(e.message.text)
                cp = it.checkpoint()
                checkpoints.append(cp)
                assert (it.in_sequence, frozen(cp)) in points[len(got)], (seed, len(got), got[-1])
        assert got == expected
        assert it.try_next() is None and kept() is None
        assert alone_runs > 0  # The C path was taken,
        assert mixed_runs > 0  # for several producers' runs too.

        for n in sorted(rng.sample(range(1, len(expected)), 3)):
            rest = ReadCommittedIter(
                env.client, {journal: 0}, message_type=Msg, checkpoint=checkpoints[n - 1]
            )
            async with asyncio.timeout(TIMEOUT_S):
                tail = [(await rest.next()).message.text for _ in range(len(expected) - n)]
            assert got[:n] + tail == expected, (seed, n)
            await rest.close()
        await it.close()


async def test_close_inside_a_run_ends_what_a_caller_kept() -> None:
    async with broker_env() as env:
        journal = await env.journal("alone/close")
        await env.append(journal, frames(*(msg(P2, 10 + i, OUTSIDE, f"r{i}") for i in range(50))))
        it = ReadCommittedIter(env.client, {journal: 0}, message_type=Msg)
        async with asyncio.timeout(TIMEOUT_S):
            first = await it.next()
        kept = it.try_next
        assert it._run_left() == 49 and first.message.text == "r0"
        assert kept().message.text == "r1"  # type: ignore[union-attr]
        # Taken now, the checkpoint resumes after r1, the last message returned.
        before = it.checkpoint()
        await it.close()
        for try_next in (kept, it.try_next):
            with pytest.raises(ReadIterClosedError):
                try_next()
        # Taken after close(), which dropped r2..r49 undelivered, it would resume past them:
        # refused, naming why (found by the differential fuzz of 2026-11-30).
        with pytest.raises(ReadIterClosedError, match="take it before closing"):
            it.checkpoint()
        rest = ReadCommittedIter(env.client, {journal: 0}, message_type=Msg, checkpoint=before)
        async with asyncio.timeout(TIMEOUT_S):
            assert (await rest.next()).message.text == "r2"
        await rest.close()


async def test_a_horizon_inside_a_mixed_run_prunes_as_the_general_protocol() -> None:
    # P2 known from long ago; then P1 and P3 alternating (a run of several producers, P2 once
    # near its end), duplicates of all three, and a marker.
    old = [msg(P2, 10, OUTSIDE, "old")]
    mixed = [msg(P1 if i % 2 else P3, 1000 + i, OUTSIDE, f"m{i}") for i in range(60)]
    mixed.insert(55, msg(P2, 2000, OUTSIDE, "p2"))
    stream = [*old, msg(P1, 500, CONTINUE, "t"), msg(P1, 501, ACK), *mixed]
    stream += [*mixed[10:14], old[0], msg(MARKER, 5, OUTSIDE, "end")]
    async with broker_env() as env:
        journal = await env.journal("alone/horizon")
        end = (await env.append(journal, frames(*stream))).commit.end
        envelopes = await read_all(journal, env.client, end)
        for cut, bound in ((20, 1010), (20, 1030), (40, 5000), (3, 1000), (58, 1057)):
            it = ReadCommittedIter(env.client, {journal: 0}, message_type=Msg)
            async with asyncio.timeout(TIMEOUT_S):
                got = [await it.next() for _ in range(cut)]
            assert it._run_before is not None and it._run_left() > 0  # Inside a mixed run.
            # The general protocol, fed up to the same message, checkpointed with the horizon.
            reference: Sequencer[Envelope[Any]] = Sequencer(RING_SIZE_DEFAULT)
            for e in envelopes:
                reference.queue_trusted(e)
                while reference.dequeue() is not None:
                    pass
                if e.begin == got[-1].begin:
                    break
            # The span back from the journal's newest state that prunes below `bound`.
            newest = max(s.last_ack for s in reference.checkpoint(0).producers.values())
            horizon = max(1, newest - bound)
            cp = it.checkpoint(horizon)
            assert frozen(cp) == frozen(reference.checkpoint(horizon)), (cut, horizon)
            # Pruned alike, they go on alike: every producer of the run has messages left in
            # it, which make its state anew (so its duplicates after the run are dropped).
            went_on = []
            for e in envelopes:
                if e.begin > got[-1].begin:
                    reference.queue_trusted(e)
                    went_on += texts(iter(reference.dequeue, None))
            async with asyncio.timeout(TIMEOUT_S):
                assert [(await it.next()).message.text for _ in went_on] == went_on
            # A restart from it returns the rest as the general protocol's restart would.
            rest = ReadCommittedIter(env.client, {journal: 0}, message_type=Msg, checkpoint=cp)
            restarted = Sequencer(RING_SIZE_DEFAULT, cp)
            expected: list[str] = []
            for e in envelopes:
                if e.begin >= cp.read_through[journal]:
                    restarted.queue_trusted(e)
                    expected += texts(iter(restarted.dequeue, None))
            async with asyncio.timeout(TIMEOUT_S):
                tail = [(await rest.next()).message.text for _ in range(len(expected))]
            assert tail == expected and tail[-1] == "end"
            await rest.close()
            await it.close()
