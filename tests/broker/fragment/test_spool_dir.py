"""Durable spools on real files (spool_named.py, spool_dir.py): a Spool writing through
JournalFiles, then a fresh SpoolDir recovering what it left, as a restarted broker does. The
writer's objects are simply dropped without closing anything, which leaves the files exactly
as a kill -9 would (the OS holds every completed write). Torn records, short or corrupt
content and bytes past the last commit are made by editing the files in between."""

from __future__ import annotations

import errno
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from broker import metrics
from broker.fragment.naming import content_sum
from broker.fragment.spool import CompletedSpool, LocalFragment, Outcome, Spool
from broker.fragment.spool_dir import (
    QUARANTINE_DIRNAME,
    RecoveredJournal,
    SpoolDir,
    journal_dir_name,
    journal_dir_name_max,
)
from broker.fragment.spool_file import MemorySpoolFile, SpoolFile, unlink_durable
from broker.fragment.spool_named import JournalFiles, NamedSpoolFile
from broker.fragment.spool_record import decode_file, slot_bytes_min, slot_offset
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set

JOURNAL = "a/journal"
CLOCK_S = 1_700_000_000.0
REGS = label_set([("owner", "shard-1")])


@dataclass
class Recorder:
    commits: list[LocalFragment] = field(default_factory=list)
    completes: list[CompletedSpool] = field(default_factory=list)

    def on_commit(self, fragment: LocalFragment) -> None:
        self.commits.append(fragment)

    def on_complete(self, completed: CompletedSpool) -> None:
        self.completes.append(completed)


def durable_spool(
    spool_dir: SpoolDir, recovered: RecoveredJournal | None = None
) -> tuple[Spool, Recorder]:
    recorder = Recorder()
    files = recovered.files if recovered else spool_dir.journal_files(JOURNAL)
    spool = Spool(
        JOURNAL,
        recorder,
        new_file=MemorySpoolFile,
        files=files,
        recovered=recovered.spool if recovered else None,
        clock=lambda: CLOCK_S,
    )
    return spool, recorder


def append(spool: Spool, data: bytes, registers: pb.LabelSet = REGS) -> None:
    spool.apply_content(data, spool.delta)
    result = spool.apply(
        pb.ReplicateRequest(proposal=spool.next(), registers=registers), primary=False
    )
    assert result.outcome is Outcome.COMMITTED


def roll(spool: Spool, offset: int | None = None) -> None:
    fragment = spool.fragment
    end = fragment.end if offset is None else offset
    proposal = pb.Fragment(journal=JOURNAL, begin=end, end=end, compression_codec=pb.NONE)
    registers = spool.registers if offset is None else label_set([("owner", "other")])
    spool.apply(pb.ReplicateRequest(proposal=proposal, registers=registers), primary=False)
    assert spool.fragment.begin == end


def recover(data: Path) -> tuple[SpoolDir, RecoveredJournal]:
    spool_dir = SpoolDir(data, fsync=False)
    spool_dir.recover()
    recovered = spool_dir.take(JOURNAL)
    assert recovered is not None
    return spool_dir, recovered


def journal_dir(data: Path) -> Path:
    return data / "spools" / journal_dir_name(JOURNAL)


def read(file: SpoolFile) -> bytes:
    return file.pread(file.size(), 0)


@pytest.mark.parametrize("fsync", [False, True])
def test_a_killed_writer_is_recovered_at_its_last_commit(tmp_path: Path, fsync: bool) -> None:
    spool, _ = durable_spool(SpoolDir(tmp_path, fsync=fsync))
    append(spool, b"hello ")
    append(spool, b"world")
    spool.apply_content(b"never committed", spool.delta)  # An append in flight.
    del spool  # kill -9: nothing closed, nothing flushed beyond what the OS has.

    spool_dir, recovered = recover(tmp_path)
    state = recovered.spool
    assert (state.fragment.begin, state.fragment.end) == (0, 11)
    assert state.fragment.sum == content_sum(b"hello world")
    assert state.registers == REGS and state.first_append_time == CLOCK_S
    assert state.file is not None and read(state.file) == b"hello world"  # Pending bytes cut.
    assert recovered.completed == []

    # The spool resumes there, pending until settled; then it goes on appending.
    spool, recorder = durable_spool(spool_dir, recovered)
    assert spool.recovery_pending and spool.fragment.end == 11
    spool.adopt_recovery()
    assert [c.fragment.end for c in recorder.commits] == [11]
    append(spool, b"!")
    del spool
    _, again = recover(tmp_path)
    assert again.spool.fragment.end == 12
    assert again.spool.file is not None and read(again.spool.file) == b"hello world!"


def test_rolled_fragments_are_recovered_as_completed_and_an_empty_spool_keeps_its_offset(
    tmp_path: Path,
) -> None:
    spool, recorder = durable_spool(SpoolDir(tmp_path, fsync=False))
    append(spool, b"first")
    roll(spool)  # Completed [0, 5): handed to the persister, not persisted yet.
    append(spool, b"second")
    roll(spool, 100)  # Caught up to 100 with another broker's registers.
    [completed_a, completed_b] = recorder.completes
    del spool, recorder, completed_a, completed_b

    _, recovered = recover(tmp_path)
    assert [(c.fragment.begin, c.fragment.end) for c in recovered.completed] == [(0, 5), (5, 11)]
    assert [read(c.file) for c in recovered.completed] == [b"first", b"second"]
    assert all(c.first_append_time == CLOCK_S for c in recovered.completed)
    state = recovered.spool
    assert (state.fragment.begin, state.fragment.end) == (100, 100) and state.file is None
    assert state.registers == label_set([("owner", "other")])
    names = sorted(p.name for p in journal_dir(tmp_path).iterdir())
    assert names == [
        "0000000000000000.rec",
        "0000000000000000.spool",
        "0000000000000005.rec",
        "0000000000000005.spool",
        "0000000000000064.rec",
    ]


def test_persisting_a_completed_fragment_removes_its_files(tmp_path: Path) -> None:
    spool, recorder = durable_spool(SpoolDir(tmp_path, fsync=False))
    append(spool, b"persist me")
    roll(spool)
    [completed] = recorder.completes
    assert isinstance(completed.content_file, NamedSpoolFile)
    unlink_durable(completed.content_file)  # What the persister does once it is stored.
    completed.content_file.close()
    assert sorted(p.name for p in journal_dir(tmp_path).iterdir()) == ["000000000000000a.rec"]
    _, recovered = recover(tmp_path)
    assert recovered.completed == [] and recovered.spool.fragment.begin == 10


def test_a_torn_newest_record_falls_back_to_the_previous_commit(tmp_path: Path) -> None:
    spool, _ = durable_spool(SpoolDir(tmp_path, fsync=False))
    append(spool, b"one ")
    append(spool, b"two")
    del spool
    record = journal_dir(tmp_path) / "0000000000000000.rec"
    data = bytearray(record.read_bytes())
    newest = decode_file(bytes(data))[0]
    data[slot_offset(newest.seq, slot_bytes_min) + 20] ^= 0xFF  # Power cut mid-write.
    record.write_bytes(bytes(data))

    _, recovered = recover(tmp_path)
    assert recovered.spool.fragment.end == 4
    assert recovered.spool.file is not None and read(recovered.spool.file) == b"one "
    # The torn slot is the next commit's to overwrite.
    assert [(s.seq, s.record.end) for s in decode_file(record.read_bytes())] == [(1, 4)]


def test_content_shorter_than_its_commit_falls_back_or_is_set_aside(tmp_path: Path) -> None:
    spool, _ = durable_spool(SpoolDir(tmp_path, fsync=False))
    append(spool, b"one ")
    append(spool, b"two")
    del spool
    content = journal_dir(tmp_path) / "0000000000000000.spool"
    os.truncate(content, 5)  # Lost in a power cut without --fsync.
    _, recovered = recover(tmp_path)
    assert recovered.spool.fragment.end == 4
    # The fallback is written as the newest commit, over the older slot: a second recovery,
    # or the next commit, never goes back to the one the content does not hold.
    record = journal_dir(tmp_path) / "0000000000000000.rec"
    assert [(s.seq, s.record.end) for s in decode_file(record.read_bytes())] == [(3, 4), (2, 7)]
    del recovered

    os.truncate(content, 2)  # Shorter than any commit: nothing verifies.
    before = metrics.value_of("gazette_spool_recovery_fragments_total", {"outcome": "corrupt"})
    spool_dir = SpoolDir(tmp_path, fsync=False)
    spool_dir.recover()
    assert spool_dir.take(JOURNAL) is None
    after = metrics.value_of("gazette_spool_recovery_fragments_total", {"outcome": "corrupt"})
    assert after == before + 1
    aside = list((tmp_path / QUARANTINE_DIRNAME / journal_dir_name(JOURNAL)).iterdir())
    assert sorted(p.name.split(".")[1] for p in aside) == ["rec", "spool"]


def test_completed_content_that_fails_its_sha1_is_set_aside_not_recovered(
    tmp_path: Path,
) -> None:
    spool, recorder = durable_spool(SpoolDir(tmp_path, fsync=False))
    append(spool, b"good bytes")
    roll(spool)
    append(spool, b"open")
    del spool, recorder
    completed = journal_dir(tmp_path) / "0000000000000000.spool"
    completed.write_bytes(b"bad! bytes")  # Same length, other content.

    _, recovered = recover(tmp_path)
    assert recovered.completed == []
    assert recovered.spool.fragment.begin == 10 and recovered.spool.fragment.end == 14
    quarantine = tmp_path / QUARANTINE_DIRNAME / journal_dir_name(JOURNAL)
    assert any(p.read_bytes() == b"bad! bytes" for p in quarantine.iterdir())


def test_leftovers_of_a_crash_are_cleaned_up(tmp_path: Path) -> None:
    spool, _ = durable_spool(SpoolDir(tmp_path, fsync=False))
    append(spool, b"kept")
    del spool
    directory = journal_dir(tmp_path)
    (directory / "0000000000000009.spool").write_bytes(b"no commit ever")
    (directory / "0000000000000009.rec.tmp").write_bytes(b"half a record")
    (tmp_path / "spool-scratch").mkdir()
    (tmp_path / "spool-scratch" / "spool-abc").write_bytes(b"scratch")

    _, recovered = recover(tmp_path)
    assert recovered.spool.fragment.end == 4
    assert sorted(p.name for p in directory.iterdir()) == [
        "0000000000000000.rec",
        "0000000000000000.spool",
    ]
    assert list((tmp_path / "spool-scratch").iterdir()) == []


def test_registers_that_outgrow_a_slot_move_to_a_larger_record(tmp_path: Path) -> None:
    spool, _ = durable_spool(SpoolDir(tmp_path, fsync=False))
    append(spool, b"a")
    big = label_set([(f"label-{i:04d}", "v" * 100) for i in range(100)])  # > 10 KiB.
    append(spool, b"b", registers=big)
    append(spool, b"c", registers=big)
    del spool
    _, recovered = recover(tmp_path)
    assert recovered.spool.registers == big and recovered.spool.fragment.end == 3


def test_a_failed_roll_record_leaves_the_spool_at_its_fragment(tmp_path: Path) -> None:
    class FailingFiles(JournalFiles):
        """Real files, whose next new record fails as on a full disk."""

        fail = False

        def record(self, fragment: pb.Fragment, registers: pb.LabelSet, fat: float | None) -> None:
            if self.fail:
                raise OSError(errno.ENOSPC, "no space left (injected)")
            super().record(fragment, registers, fat)

    files = FailingFiles(journal_dir(tmp_path), fsync=False)
    recorder = Recorder()
    spool = Spool(JOURNAL, recorder, new_file=MemorySpoolFile, files=files, clock=lambda: CLOCK_S)
    append(spool, b"committed")
    spool.apply_content(b"pending", spool.delta)
    files.fail = True
    with pytest.raises(OSError):
        roll(spool)
    # Not rolled: the fragment stays, its pending bytes dropped as by a rollback.
    assert (spool.fragment.begin, spool.fragment.end, spool.delta) == (0, 9, 0)
    assert recorder.completes == []
    with pytest.raises(OSError):
        append(spool, b"!")  # The commit's record fails too: nothing committed.
    assert spool.fragment.end == 9
    files.fail = False
    spool.apply(
        pb.ReplicateRequest(proposal=spool.fragment, registers=spool.registers), primary=False
    )
    roll(spool)
    assert [(c.begin, c.end) for c in recorder.completes] == [(0, 9)]


def test_long_journal_names_get_a_bounded_directory_name() -> None:
    short = journal_dir_name("a/b;meta")
    assert short == "a%2Fb%3Bmeta"
    long_a, long_b = "x/" + "a" * 500, "x/" + "a" * 499 + "b"
    assert len(journal_dir_name(long_a)) <= journal_dir_name_max
    assert journal_dir_name(long_a) != journal_dir_name(long_b)
    assert hashlib.sha1(long_a.encode()).hexdigest() in journal_dir_name(long_a)
