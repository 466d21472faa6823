"""A read-committed read split into partitions returns exactly what one walk of the whole range
returns: each partition delivers the committed messages that lie in it, transactions spanning a
split point included (whole, or not at all when rolled back or never acknowledged), each once.

First against the per-message reference (ReadCommittedIter) on random histories split at
append boundaries (no Spark); then through the data source's own planning, on a journal of many
fragments whose long transaction spans every partition and more than the look-back.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.duration_pb2 import Duration

from broker.client import JournalClient, apply_journals, upsert
from broker.fragment.naming import parse_content_name
from broker.protocol import labels
from broker.protocol import protocol_pb2 as pb
from gazette_consumer.message.clock import clock_from_unix_nanos
from gazette_consumer.sequencer.read_iter import ReadCommittedIter
from gazette_consumer.sequencer.types import SequencerCheckpoint
from spark_integration import GazetteDataSource
from spark_integration.batch_read import JournalRange
from spark_integration.range_read import CommittedRange, scan_committed
from spark_integration.range_start import start_checkpoint
from spark_integration.rows import META_SCHEMA
from tests.broker.serve_testkit import gazette_serve
from tests.gazette_consumer.sequencer.read_iter_testkit import ACK as ACK_FLAG
from tests.gazette_consumer.sequencer.read_iter_testkit import CONTINUE as CONTINUE_FLAG
from tests.gazette_consumer.sequencer.read_iter_testkit import OUTSIDE as OUTSIDE_FLAG
from tests.gazette_consumer.sequencer.read_iter_testkit import P1, P2, broker_env, msg
from tests.gazette_consumer.sequencer.read_iter_testkit import Msg as IterMsg
from tests.spark_integration.spark_testkit import (
    ACK,
    CONTINUE,
    OUTSIDE,
    Msg,
    append_messages,
    committed_texts,
    producer,
    unique,
)
from tests.spark_integration.test_bulk_commit import history as bulk_history
from tests.spark_integration.test_range_read import history, source, texts

# How long the broker may take to persist the fragments it closed, and the polling backoff.
persist_timeout_s = 30.0
persist_poll_s_max = 0.5


async def reference(env: Any, journal: str, head: int, ring_size: int) -> list[str]:
    """The committed messages' texts, as a Gazette consumer reads them, one message at a time."""
    it = ReadCommittedIter(env.client, {journal: 0}, message_type=IterMsg, ring_size=ring_size)
    out: list[str] = []
    try:
        while True:
            got = it.try_next()
            if got is None:
                if it.checkpoint().read_through.get(journal, 0) >= head:
                    return out
                async with asyncio.timeout(30):
                    got = await it.next()
            out.append(got.message.text)
    finally:
        await it.close()


async def split_texts(
    env: Any,
    journal: str,
    cuts: list[int],
    head: int,
    ring_size: int,
    *,
    exact: bool,
    planned: bool = False,
    clock_scans: list[int] | None = None,
    resolving: bool = False,
    look_ahead_bytes: list[int] | None = None,
) -> list[str]:
    """The texts the partitions [0, c1), [c1, c2), ... [cn, head) deliver, each from the state
    at its start: exact (a scan from 0), `planned` (one scan from 0 stopping at every cut, its
    checkpoints and reached clocks handed to the partitions, as streaming plans) or learned by a
    look-back (as batch reads do; here one reaching back to 0). `clock_scans` gets each
    partition's scans of the part of a transaction before it. Planned and `resolving`, each
    partition's look-ahead reads only the messages the planner found resolving what is pending
    at its end; `look_ahead_bytes` gets what each look-ahead decoded."""
    out: list[str] = []
    bounds = [0, *cuts, head]
    stops: dict[int, SequencerCheckpoint] = {}
    reached: dict[int, dict[bytes, int]] = {}
    resolved: dict[int, list[tuple[int, int]]] = {}
    if planned:
        plan = CommittedRange(
            source(env.client, journal), 0, head, ring_size=ring_size, replay=False
        )
        stops, _ = await plan.scan(cuts)
        reached = plan.reached_at
        resolved = plan.resolving_at
    for lo, hi in pairwise(bounds):
        if planned:
            cp = stops[lo] if lo else SequencerCheckpoint(read_through={journal: 0})
        elif exact:
            cp = await scan_committed(
                source(env.client, journal),
                0,
                lo,
                ring_size=ring_size,
                checkpoint=SequencerCheckpoint(read_through={journal: 0}),
                horizon=0,
            )
        else:
            cp = await start_checkpoint(
                source(env.client, journal), lo, lookback=head, ring_size=ring_size
            )
        walk = CommittedRange(
            source(env.client, journal),
            lo,
            hi,
            ring_size=ring_size,
            checkpoint=cp,
            deliver_from=lo if lo else None,
            read_end=head,
            reached=reached.get(lo),
            resolving=resolved[hi] if resolving and hi < head else None,
        )
        out += await texts(walk)
        if clock_scans is not None:
            clock_scans.append(walk.clock_scans)
        if look_ahead_bytes is not None:
            look_ahead_bytes.append(walk.look_ahead_bytes)
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("ring_size", [4, 8192])
async def test_split_partitions_deliver_what_one_walk_does(seed: int, ring_size: int) -> None:
    async with broker_env() as env:
        journal = await env.journal(f"split/s{seed}-r{ring_size}")
        bounds = [0]
        for batch in history(seed):
            if batch:
                bounds.append((await env.append_messages(journal, batch))[1])
        head = bounds[-1]
        expected = await reference(env, journal, head, ring_size)
        assert len(expected) > 50
        inner = bounds[1:-1]
        # Every single cut, and cuts at every other append boundary (several partitions).
        for cuts in [*([c] for c in inner), inner[::2], inner]:
            for exact in (True, False):
                got = await split_texts(env, journal, cuts, head, ring_size, exact=exact)
                assert sorted(got) == sorted(expected), f"cuts {cuts}, exact {exact}"
            got = await split_texts(env, journal, cuts, head, ring_size, exact=True, planned=True)
            assert sorted(got) == sorted(expected), f"cuts {cuts}, planned"


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("ring_size", [4, 8192])
async def test_planned_clocks_deliver_what_one_walk_does(seed: int, ring_size: int) -> None:
    """Partitions starting inside transactions (appends cut anywhere: transactions, their
    re-sent messages and rollbacks straddle the cuts), each given the clocks the planner's walk
    saw those transactions reach (as a streaming micro-batch's are) rather than scanning their
    earlier part: the same messages as one walk, and (nearly) no scan."""
    rng = random.Random(seed)
    flat = [m for batch in history(seed) for m in batch]
    async with broker_env() as env:
        journal = await env.journal(f"split/planned-s{seed}-r{ring_size}")
        bounds = [0]
        at = 0
        while at < len(flat):
            step = rng.randint(1, 12)
            bounds.append((await env.append_messages(journal, flat[at : at + step]))[1])
            at += step
        head = bounds[-1]
        expected = await reference(env, journal, head, ring_size)
        inner = bounds[1:-1]
        planned_scans = unplanned_scans = 0
        for cuts in [inner, inner[::2], inner[::3], inner[1::4]]:
            scans: list[int] = []
            got = await split_texts(
                env, journal, cuts, head, ring_size, exact=True, planned=True, clock_scans=scans
            )
            assert sorted(got) == sorted(expected), f"cuts {cuts}, planned"
            planned_scans += sum(scans)
            scans = []
            got = await split_texts(
                env, journal, cuts, head, ring_size, exact=True, clock_scans=scans
            )
            assert sorted(got) == sorted(expected), f"cuts {cuts}, exact"
            unplanned_scans += sum(scans)
        assert unplanned_scans > 0, "no partition started inside a committed transaction: no test"
        # Left to scan: only a rolled-back part (an ACK below the clock the planner saw).
        assert planned_scans <= unplanned_scans / 2


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("ring_size", [4, 8192])
async def test_planned_look_aheads_read_only_what_resolves(seed: int, ring_size: int) -> None:
    """Partitions whose look-ahead reads only the messages the planner's walk found resolving
    the transactions pending at their end (as a streaming micro-batch's do: offsets'
    `resolving`), rather than scanning on to the read's end: the same messages as one walk,
    for far fewer bytes read ahead. Appends are cut anywhere (transactions, re-sent messages,
    rollbacks and older ACKs straddle the cuts; odd seeds: test_bulk_commit's histories, with
    re-sent ACKs older than the last and messages without a UUID)."""
    rng = random.Random(seed)
    appends = history(seed) if seed % 2 == 0 else bulk_history(seed, old_acks=True)
    flat = [m for batch in appends for m in batch]
    async with broker_env() as env:
        journal = await env.journal(f"split/resolving-s{seed}-r{ring_size}")
        bounds = [0]
        at = 0
        while at < len(flat):
            step = rng.randint(1, 12)
            bounds.append((await env.append_messages(journal, flat[at : at + step]))[1])
            at += step
        head = bounds[-1]
        expected = await reference(env, journal, head, ring_size)
        inner = bounds[1:-1]
        read_ahead = {False: 0, True: 0}
        for cuts in [inner, inner[::2], inner[::3], inner[1::4]]:
            for resolving in (False, True):
                ahead: list[int] = []
                got = await split_texts(
                    env,
                    journal,
                    cuts,
                    head,
                    ring_size,
                    exact=True,
                    planned=True,
                    resolving=resolving,
                    look_ahead_bytes=ahead,
                )
                assert sorted(got) == sorted(expected), f"cuts {cuts}, resolving {resolving}"
                read_ahead[resolving] += sum(ahead)
        assert read_ahead[False] > 0, "no partition looked ahead: no test"
        assert read_ahead[True] < read_ahead[False] / 4


@pytest.mark.parametrize("bulk", [True, False])
async def test_look_ahead_keeps_what_it_commits_past_the_end_out(bulk: bool) -> None:
    """A partition's look-ahead (for P1's ACK) also commits P2's message past the partition's
    end (P2 rolled its transaction back, then published outside one): the next partition's to
    deliver. It was delivered twice when it came before P1's committed rows in what one
    look-ahead batch commits (the rows past the end were cut off by the last row's end), and
    with no content (the look-ahead reads none). P1's span is served from the ring one by one
    (`bulk=False`), replayed otherwise."""
    async with broker_env() as env:
        journal = await env.journal("split/look-ahead-order")
        _, cut = await env.append_messages(
            journal,
            [
                msg(P1, 10, CONTINUE_FLAG, "a1"),
                msg(P2, 20, CONTINUE_FLAG, "b1"),
                msg(P2, 21, ACK_FLAG),
                msg(P2, 22, CONTINUE_FLAG, "b2"),
            ],
        )
        _, head = await env.append_messages(
            journal, [msg(P2, 21, ACK_FLAG), msg(P2, 23, OUTSIDE_FLAG, "x"), msg(P1, 11, ACK_FLAG)]
        )
        first = CommittedRange(
            source(env.client, journal), 0, cut, ring_size=64, read_end=head, bulk=bulk
        )
        assert await texts(first) == ["b1", "a1"]
        cp = await scan_committed(
            source(env.client, journal),
            0,
            cut,
            ring_size=64,
            checkpoint=SequencerCheckpoint(read_through={journal: 0}),
            horizon=0,
        )
        second = CommittedRange(
            source(env.client, journal),
            cut,
            head,
            ring_size=64,
            checkpoint=cp,
            deliver_from=cut,
            bulk=bulk,
        )
        assert await texts(second) == ["x"]


def create_small_fragment_journal(
    broker: str, name: str, fragment_bytes: int, stores: tuple[str, ...] = ()
) -> None:
    async def apply() -> None:
        client = JournalClient(broker)
        try:
            spec = pb.JournalSpec(
                name=name,
                replication=1,
                labels=pb.LabelSet(
                    labels=[
                        pb.Label(name=labels.CONTENT_TYPE, value=labels.CONTENT_TYPE_JSON_LINES)
                    ]
                ),
                fragment=pb.JournalSpec.Fragment(
                    length=fragment_bytes,
                    compression_codec=pb.NONE,
                    stores=list(stores),
                    refresh_interval=Duration(seconds=1),
                ),
            )
            await apply_journals(client, [upsert(spec)])
        finally:
            await client.close()

    asyncio.run(apply())


def long_transaction_history() -> list[Msg]:
    """A transaction of 1,500 messages (~250 KB), the rest interleaved with it: messages outside
    transactions (some re-sent), small transactions, one rolled back across several hundred
    messages and one never acknowledged."""
    long_p, undo_p, open_p, small_p, alone_p = (producer() for _ in range(5))
    base = clock_from_unix_nanos(time.time_ns())
    pad = "x" * 120
    messages: list[Msg] = []
    clocks = dict.fromkeys((long_p, undo_p, open_p, small_p, alone_p), base)

    def add(p: bytes, flags: Any, text: str | None) -> Msg:
        clocks[p] += 1
        m = Msg(p, clocks[p], flags, None if text is None else {"text": text, "pad": pad})
        messages.append(m)
        return m

    for i in range(1500):
        add(long_p, CONTINUE, f"long{i}")
        if i % 3 == 0:
            dup = add(alone_p, OUTSIDE, f"alone{i}")
            if i % 30 == 0:
                messages.append(dup)  # A re-sent message: read once.
        if 300 <= i < 900:
            add(undo_p, CONTINUE, f"undo{i}")
        if i == 900:
            messages.append(Msg(undo_p, base, ACK))  # Rolls back (its last ACK's clock).
        if i % 7 == 0:
            add(open_p, CONTINUE, f"open{i}")  # Never acknowledged.
        if i % 50 == 0:
            add(small_p, CONTINUE, f"small{i}a")
            add(small_p, CONTINUE, f"small{i}b")
            add(small_p, ACK, None)
    add(long_p, ACK, None)
    return messages


def append_in_groups(broker: str, journal: str, messages: list[Msg]) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    for start in range(0, len(messages), 200):
        spans += append_messages(broker, journal, messages[start : start + 200], together=True)
    return spans


def partition_texts(options: dict[str, str]) -> list[str]:
    """Read as Spark drives the data source: partitions planned, each read on its own."""
    reader = GazetteDataSource(options).reader(META_SCHEMA)
    parts = reader.partitions()
    assert len(parts) >= 5
    assert all(isinstance(p, JournalRange) for p in parts)
    return [
        json.loads(content)["text"]
        for part in parts
        for batch in reader.read(part)
        for content in batch.column("content").to_pylist()
    ]


SPLIT_OPTIONS = {"maxPartitionBytes": str(64 << 10), "lookbackBytes": str(16 << 10)}


@pytest.mark.spark
def test_batch_partitions_read_a_long_transaction_once(broker: str) -> None:
    """A transaction spanning every partition and far more than the look-back is read whole,
    once; one rolled back across a split and one never acknowledged are not read at all; small
    transactions, duplicates and messages outside transactions in between are read as the
    per-message reference reads them."""
    journal = unique("spark/split")
    create_small_fragment_journal(broker, journal, 16 << 10)
    append_in_groups(broker, journal, long_transaction_history())

    expected = committed_texts(broker, journal)
    assert sum(t.startswith("long") for t in expected) == 1500
    assert not any(t.startswith(("undo", "open")) for t in expected)
    got = partition_texts({"broker": broker, "journals": journal, **SPLIT_OPTIONS})
    assert sorted(got) == sorted(expected)


@pytest.mark.spark
def test_store_partitions_look_ahead_in_the_store(tmp_path: Path) -> None:
    """The same read from the fragment store alone, with the broker killed: partitions look
    ahead for ACKs in the store's fragments (a look-ahead beyond a partition's own fragments
    would otherwise find no content there, and fail as lost)."""
    journal = unique("spark/split-store")
    (tmp_path / "frag").mkdir()
    messages = long_transaction_history()
    filler = producer()
    # Past the ACK, so that the fragment holding it is closed and persisted.
    fill = [
        Msg(filler, 1000 + i, OUTSIDE, {"text": f"fill{i}", "pad": "y" * 400}) for i in range(80)
    ]
    with gazette_serve(tmp_path) as (port, proc):
        b = f"127.0.0.1:{port}"
        create_small_fragment_journal(b, journal, 16 << 10, ("file:///frag/",))
        spans = append_in_groups(b, journal, messages)
        fill_spans = append_in_groups(b, journal, fill)
        expected = committed_texts(b, journal)
        deadline, wait = time.monotonic() + persist_timeout_s, 0.05
        while (persisted := persisted_end(tmp_path / "frag" / journal)) < spans[-1][1]:
            assert time.monotonic() < deadline, f"persisted through {persisted} only"
            time.sleep(wait)  # Polling the store's directory: no event exists for it.
            wait = min(wait * 2, persist_poll_s_max)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    unpersisted = {
        m.fields["text"]
        for m, (_, e) in zip(fill, fill_spans, strict=True)
        if m.fields and e > persisted
    }
    expected = [t for t in expected if t not in unpersisted]
    got = partition_texts(
        {"store": f"file://{tmp_path}/frag/", "journals": journal, **SPLIT_OPTIONS}
    )
    assert sorted(got) == sorted(expected)


def persisted_end(folder: Path) -> int:
    """Where the journal's contiguous persisted content (from offset 0) ends."""
    if not folder.is_dir():
        return 0
    files = []
    for f in folder.iterdir():
        try:
            begin, end, _sha1, _codec = parse_content_name(f.name)
        except Exception:  # A temporary file being written: not a fragment yet.
            continue
        files.append((begin, end))
    end = 0
    for begin, e in sorted(files):
        if begin > end:
            break
        end = max(end, e)
    return end
