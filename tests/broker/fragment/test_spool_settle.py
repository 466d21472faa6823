"""Settling a recovered spool (spool_settle.py) on real files, with a real FragmentIndex: who
adopts the recovered content, who sets it aside, and what the index and persister then get."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from broker import metrics
from broker.fragment.index import FragmentIndex
from broker.fragment.naming import content_sum
from broker.fragment.spool import CompletedSpool, Spool
from broker.fragment.spool_dir import QUARANTINE_DIRNAME, SpoolDir, journal_dir_name
from broker.fragment.spool_file import MemorySpoolFile
from broker.fragment.spool_recovery import Verdict
from broker.fragment.spool_settle import RecoverySettler
from broker.protocol import protocol_pb2 as pb
from tests.broker.fragment.test_spool_dir import (
    CLOCK_S,
    JOURNAL,
    REGS,
    Recorder,
    append,
    durable_spool,
    roll,
)

STORE = "file:///fragments/"


@dataclass
class Sink:
    completed: list[CompletedSpool] = field(default_factory=list)

    def on_complete(self, completed: CompletedSpool) -> None:
        self.completed.append(completed)


@dataclass
class Recovered:
    spool_dir: SpoolDir
    spool: Spool
    settler: RecoverySettler
    index: FragmentIndex
    sink: Sink
    recorder: Recorder


def recovered(tmp_path: Path) -> Recovered:
    """A journal left by a killed broker: [0, 5) completed, [5, 15) open; then recovered."""
    writer, _ = durable_spool(SpoolDir(tmp_path, fsync=False))
    append(writer, b"first")
    roll(writer)
    append(writer, b"second")
    append(writer, b"four")
    del writer
    spool_dir = SpoolDir(tmp_path, fsync=False)
    spool_dir.recover()
    state = spool_dir.take(JOURNAL)
    assert state is not None
    index = FragmentIndex(JOURNAL, clock=lambda: CLOCK_S)
    sink = Sink()
    recorder = Recorder()
    spool = Spool(
        JOURNAL,
        recorder,
        new_file=MemorySpoolFile,
        files=state.files,
        recovered=state.spool,
        clock=lambda: CLOCK_S,
    )
    recorder.on_commit = index.spool_commit  # type: ignore[method-assign]
    return Recovered(
        spool_dir, spool, RecoverySettler(state, spool_dir, index, sink), index, sink, recorder
    )


def frag(begin: int, end: int, content: bytes, store: str = "") -> pb.Fragment:
    return pb.Fragment(
        journal=JOURNAL,
        begin=begin,
        end=end,
        sum=content_sum(content),
        compression_codec=pb.NONE,
        backing_store=store,
        mod_time=1 if store else 0,
    )


def outcome(name: str) -> float:
    return metrics.value_of("gazette_spool_recovery_fragments_total", {"outcome": name})


async def settle(r: Recovered, proposal: pb.Fragment | None) -> bool:
    return await r.settler.settle(r.spool, proposal, invalidated=asyncio.Event(), wait_s=5)


def quarantined(tmp_path: Path) -> list[bytes]:
    directory = tmp_path / QUARANTINE_DIRNAME / journal_dir_name(JOURNAL)
    if not directory.is_dir():
        return []
    return sorted(p.read_bytes() for p in directory.iterdir() if ".spool" in p.name)


async def test_the_primary_adopts_and_persists_at_once(tmp_path: Path) -> None:
    r = recovered(tmp_path)
    r.index.replace_remote([frag(0, 0, b"", STORE)])
    before = outcome("adopted")
    assert await settle(r, None)
    assert not r.spool.recovery_pending and r.settler.verdict is Verdict.ADOPT
    assert [(f.begin, f.end) for f in r.index.local_fragments()] == [(0, 5), (5, 15)]
    [completed] = r.sink.completed
    assert (completed.begin, completed.end, completed.primary) == (0, 5, True)
    assert outcome("adopted") == before + 2
    assert quarantined(tmp_path) == []


async def test_a_replica_adopts_what_its_primary_holds(tmp_path: Path) -> None:
    r = recovered(tmp_path)
    r.index.replace_remote([])
    assert await settle(r, r.spool.fragment)  # The primary holds the very same fragment.
    assert r.settler.verdict is Verdict.ADOPT
    assert [c.primary for c in r.sink.completed] == [False]  # After the primary's upload.


@pytest.mark.parametrize(
    "proposal",
    [
        frag(5, 11, b"second"),  # A prefix, verified over our own content.
        frag(0, 0, b""),  # A primary started afresh: it holds nothing of ours.
    ],
)
async def test_a_replica_adopts_when_its_primary_holds_nothing_else(
    tmp_path: Path, proposal: pb.Fragment
) -> None:
    r = recovered(tmp_path)
    r.index.replace_remote([])
    assert await settle(r, proposal)
    assert r.settler.verdict is Verdict.ADOPT and r.spool.fragment.end == 15


@pytest.mark.parametrize(
    ("proposal", "keeps_completed"),
    [
        (frag(5, 20, b"second" + b"x" * 9), True),  # The journal went on past our end.
        (frag(5, 11, b"other!"), True),  # Someone else's bytes at our open fragment's offsets.
        (frag(30, 30, b""), True),  # An empty roll beyond us: cannot be verified.
        (frag(3, 3, b""), False),  # Empty, but within our completed content.
    ],
)
async def test_a_replica_disowns_what_its_primary_does_not_hold(
    tmp_path: Path, proposal: pb.Fragment, keeps_completed: bool
) -> None:
    r = recovered(tmp_path)
    r.index.replace_remote([])
    before = outcome("stale")
    assert await settle(r, proposal)
    assert r.settler.verdict is Verdict.DISOWN
    spool = r.spool
    assert not spool.recovery_pending
    assert (spool.fragment.begin, spool.fragment.end) == (0, 0) and spool.registers != REGS
    if keeps_completed:
        # [0, 5) was completed: every replica acknowledged it, and the primary went on after
        # it. Kept, served and (after the primary's expected upload) persisted.
        assert [(c.begin, c.end, c.primary) for c in r.sink.completed] == [(0, 5, False)]
        assert [(f.begin, f.end) for f in r.index.local_fragments()] == [(0, 5)]
        assert quarantined(tmp_path) == [b"secondfour"]
        assert outcome("stale") == before + 1
    else:
        assert r.sink.completed == [] and r.index.local_fragments() == []
        assert quarantined(tmp_path) == [b"first", b"secondfour"]
        assert outcome("stale") == before + 2
    # The fresh spool is durable again from its first roll on.
    spool.apply(pb.ReplicateRequest(proposal=proposal, registers=REGS), primary=False)
    assert spool.fragment.end == proposal.end


async def test_the_store_drops_identical_fragments_and_sets_aside_a_journal_gone_on(
    tmp_path: Path,
) -> None:
    r = recovered(tmp_path)
    before = outcome("redundant")
    # [0, 5) is in the store already; someone else then wrote [5, 9).
    r.index.replace_remote([frag(0, 5, b"first", STORE), frag(5, 9, b"elsE", STORE)])
    assert await settle(r, None)  # Even the primary sets it aside.
    assert r.settler.verdict is Verdict.DISOWN and r.spool.fragment.end == 0
    assert outcome("redundant") == before + 1
    assert quarantined(tmp_path) == [b"secondfour"]
    journal_dir = tmp_path / "spools" / journal_dir_name(JOURNAL)
    assert sorted(p.name for p in journal_dir.iterdir()) == []


async def test_completed_fragments_the_store_went_on_after_are_kept_and_persisted(
    tmp_path: Path,
) -> None:
    # Found by the 30-minute soak: fragments completed during a store outage, every replica
    # restarted before uploading them, and the journal persisted on past them: setting them
    # aside left a hole in the journal where acknowledged content had been.
    r = recovered(tmp_path)
    r.index.replace_remote([frag(15, 20, b"later", STORE)])  # Written on past our open [5, 15).
    before = outcome("kept")
    assert await settle(r, None)
    assert r.settler.verdict is Verdict.DISOWN and r.spool.fragment.end == 0
    # [0, 5) is served and persisted at once (the store lacks it); [5, 15), open, set aside.
    assert [(c.begin, c.end, c.primary) for c in r.sink.completed] == [(0, 5, True)]
    assert [(f.begin, f.end) for f in r.index.local_fragments()] == [(0, 5)]
    assert quarantined(tmp_path) == [b"secondfour"]
    assert outcome("kept") == before + 1


async def test_no_store_listing_in_time_leaves_it_pending_and_gives_it_back(
    tmp_path: Path,
) -> None:
    r = recovered(tmp_path)
    invalidated = asyncio.Event()
    invalidated.set()
    assert not await r.settler.settle(r.spool, None, invalidated=invalidated, wait_s=5)
    assert not await r.settler.settle(r.spool, None, invalidated=asyncio.Event(), wait_s=0.01)
    assert r.spool.recovery_pending and r.settler.verdict is None
    r.settler.give_back()
    state = r.spool_dir.take(JOURNAL)
    assert state is r.settler.recovered and state.spool.fragment.end == 15


async def test_an_empty_spool_behind_the_store_forgets_its_offset_and_registers(
    tmp_path: Path,
) -> None:
    writer, _ = durable_spool(SpoolDir(tmp_path, fsync=False))
    append(writer, b"first")
    roll(writer)  # A graceful stop: [0, 5) persisted, the spool empty at 5.
    del writer
    spool_dir = SpoolDir(tmp_path, fsync=False)
    spool_dir.recover()
    state = spool_dir.take(JOURNAL)
    assert state is not None and state.spool.fragment.begin == 5
    index = FragmentIndex(JOURNAL, clock=lambda: CLOCK_S)
    spool = Spool(
        JOURNAL,
        Recorder(),
        new_file=MemorySpoolFile,
        files=state.files,
        recovered=state.spool,
        clock=lambda: CLOCK_S,
    )
    settler = RecoverySettler(state, spool_dir, index, Sink())
    # Someone else persisted [5, 9) meanwhile (after a reset-head, say).
    index.replace_remote([frag(0, 5, b"first", STORE), frag(5, 9, b"else", STORE)])
    assert await settler.settle(spool, None, invalidated=asyncio.Event(), wait_s=5)
    assert settler.verdict is Verdict.DISOWN
    assert spool.fragment.end == 0 and spool.registers == pb.LabelSet()
