"""A broker's durable spools: the directory layout, the recovery scan at start, and the registry
of recovered journals waiting for their replicas.

Layout under ``--data-dir`` (see README, "Data directory")::

    spools/<journal dir>/<begin>.spool, <begin>.rec   one pair per fragment (spool_named.py)
    spool-quarantine/<journal dir>/...                 files set aside: never persisted
    spool-scratch/                                     unlinked scratch files (compression)

``<journal dir>`` is the journal name percent-encoded into one path component (a long one is
cut and suffixed with its SHA1); the journal itself is read from the records.

`SpoolDir.recover` runs once as the broker starts, before it serves anything. For each journal
directory it plans what each file is (spool_recovery.plan_journal), verifies the content of every
fragment it keeps against its commit's SHA1 (falling back to the previous commit if needed),
cuts bytes past the verified commit, deletes what is superseded and sets aside what is corrupt
(logged, counted). What remains, per journal, is a `RecoveredJournal`: the open fragment as a
`RecoveredSpool` the journal's Spool resumes from, and the completed fragments not yet known to
be persisted. It waits in the registry until the journal's replica is created on this broker
(`take`); the replica settles it (spool_settle.py), or gives it back untouched (`put_back`) if
it stops first. Recovered content is never persisted nor served before that.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import time
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

from broker import metrics
from broker.fragment.naming import sum_from_digest
from broker.fragment.spool_file import SpoolFile, TempSpoolFile
from broker.fragment.spool_named import (
    CONTENT_SUFFIX,
    RECORD_SUFFIX,
    TMP_SUFFIX,
    JournalFiles,
    NamedSpoolFile,
    RecordFile,
    fragment_file_name,
)
from broker.fragment.spool_record import CommitRecord, SlotRecord, decode_file, decode_header
from broker.fragment.spool_recovery import (
    Disposition,
    FragmentPlan,
    ScannedFragment,
    plan_journal,
    verified,
)
from broker.fragment.spool_types import RecoveredSpool
from broker.logging import get_logger
from broker.protocol import protocol_pb2 as pb

if TYPE_CHECKING:
    from _hashlib import HASH

log = get_logger(__name__)

SPOOLS_DIRNAME: Final = "spools"
QUARANTINE_DIRNAME: Final = "spool-quarantine"
SCRATCH_DIRNAME: Final = "spool-scratch"
# Longest journal directory name (file systems allow 255 bytes per component).
journal_dir_name_max: Final = 200
# Content is read this much at a time while it is verified.
hash_chunk_bytes: Final = 1 << 20

_FRAGMENT_FILE: Final = re.compile(r"([0-9a-f]{16})(\.spool|\.rec)")


def journal_dir_name(journal: str) -> str:
    """The directory of `journal`'s spool files: one path component."""
    quoted = urllib.parse.quote(journal, safe="")
    if len(quoted) <= journal_dir_name_max:
        return quoted
    return quoted[:150] + "~" + hashlib.sha1(journal.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class RecoveredFragment:
    """A completed fragment found in a journal's directory, its content verified."""

    fragment: pb.Fragment
    registers: pb.LabelSet
    first_append_time: float
    file: NamedSpoolFile


@dataclass(slots=True)
class RecoveredJournal:
    """What a restarted broker holds of one journal (see the module docstring)."""

    journal: str
    files: JournalFiles
    spool: RecoveredSpool
    completed: list[RecoveredFragment] = field(default_factory=list)


@dataclass(slots=True)
class RecoveryReport:
    journals: int = 0
    completed: int = 0
    open_bytes: int = 0
    set_aside: int = 0


class SpoolDir:
    """The spool directories of one data directory (see the module docstring)."""

    def __init__(self, data_dir: str | Path, *, fsync: bool) -> None:
        base = Path(data_dir)
        self.root = base / SPOOLS_DIRNAME
        self.quarantine_root = base / QUARANTINE_DIRNAME
        self.scratch = base / SCRATCH_DIRNAME
        self.fsync = fsync
        self._recovered: dict[str, RecoveredJournal] = {}
        self._scanned = False
        # Journals whose files a replica of this process holds, and the event set when it
        # lets go (see `claim`).
        self._held: dict[str, asyncio.Event] = {}

    # --- Files of live spools ---

    def new_scratch_file(self) -> SpoolFile:
        return TempSpoolFile(str(self.scratch))

    def journal_files(self, journal: str) -> JournalFiles:
        """Fresh files for a journal nothing was recovered of."""
        return JournalFiles(self.root / journal_dir_name(journal), fsync=self.fsync)

    # --- One replica at a time ---

    async def claim(self, journal: str, stopping: asyncio.Event) -> bool:
        """Wait until no other replica of this process holds `journal`'s files, then hold
        them until `release`. False (holding nothing) if `stopping` is set first."""
        while (held := self._held.get(journal)) is not None:
            released = asyncio.ensure_future(held.wait())
            stopped = asyncio.ensure_future(stopping.wait())
            try:
                await asyncio.wait((released, stopped), return_when=asyncio.FIRST_COMPLETED)
            finally:
                released.cancel()
                stopped.cancel()
            if stopping.is_set():
                return False
        if stopping.is_set():
            return False
        self._held[journal] = asyncio.Event()
        return True

    def release(self, journal: str) -> None:
        held = self._held.pop(journal, None)
        if held is not None:
            held.set()

    # --- The registry of recovered journals ---

    def take(self, journal: str) -> RecoveredJournal | None:
        """The recovered state of `journal`, now the caller's (None if there is none)."""
        return self._recovered.pop(journal, None)

    def put_back(self, recovered: RecoveredJournal) -> None:
        """Return a recovered state (its replica stopped before settling it, or left a spool
        to resume from): the journal's next replica on this broker takes it."""
        self._recovered[recovered.journal] = recovered

    def pending(self) -> list[str]:
        """Journals whose recovered state waits for their replica."""
        return sorted(self._recovered)

    # --- Setting aside ---

    def set_aside(self, journal: str, paths: Iterable[Path | None], reason: str) -> None:
        """Move files out of the spool directory, into the quarantine: never persisted nor
        recovered again, kept for an operator to look at. Logged and counted by the caller."""
        target = self.quarantine_root / journal_dir_name(journal)
        stamp = time.time_ns()
        for path in paths:
            if path is None or not path.exists():
                continue
            target.mkdir(parents=True, exist_ok=True)
            os.rename(path, target / f"{path.name}.{stamp}")
        log.error("spool files set aside", journal=journal, reason=reason, quarantine=str(target))

    def set_aside_file(self, journal: str, file: SpoolFile, reason: str) -> None:
        """`set_aside` a recovered content file (and its record), closing it."""
        if isinstance(file, NamedSpoolFile):
            self.set_aside(journal, [file.record_path, file.path], reason)
            file.record_path = file.path = None
        file.close()

    # --- Recovery at start ---

    def recover(self) -> RecoveryReport:
        """Scan, verify and repair every journal directory (blocking: run in a thread, before
        the broker serves). Fills the registry; returns what was found. Once per SpoolDir: a
        broker started again in the same process already holds what it left."""
        if self._scanned:
            return RecoveryReport()
        self._scanned = True
        self.root.mkdir(parents=True, exist_ok=True)
        self.scratch.mkdir(parents=True, exist_ok=True)
        for entry in os.scandir(self.scratch):
            # Scratch files are unlinked at once; one is left only by a crash in between.
            if entry.is_file():
                os.unlink(entry.path)
        report = RecoveryReport()
        for entry in sorted(os.scandir(self.root), key=lambda e: e.name):
            if not entry.is_dir():
                log.warning("unexpected file in the spool directory", path=entry.path)
                continue
            recovered = self._recover_journal(Path(entry.path), report)
            if recovered is not None:
                self._recovered[recovered.journal] = recovered
                report.journals += 1
                report.completed += len(recovered.completed)
                spool = recovered.spool.fragment
                report.open_bytes += spool.end - spool.begin
                log.info(
                    "recovered spool",
                    journal=recovered.journal,
                    begin=spool.begin,
                    end=spool.end,
                    completed=len(recovered.completed),
                )
        return report

    def _recover_journal(self, directory: Path, report: RecoveryReport) -> RecoveredJournal | None:
        slots: dict[int, list[SlotRecord]] = {}
        slot_bytes: dict[int, int] = {}
        sizes: dict[int, int] = {}
        for entry in os.scandir(directory):
            if entry.name.endswith(TMP_SUFFIX):
                os.unlink(entry.path)  # A record file a crash left half made.
                continue
            match = _FRAGMENT_FILE.fullmatch(entry.name)
            if match is None:
                log.warning("unexpected file in a spool directory", path=entry.path)
                continue
            begin = int(match.group(1), 16)
            if match.group(2) == RECORD_SUFFIX:
                data = Path(entry.path).read_bytes()
                slots[begin] = decode_file(data)
                slot_bytes[begin] = decode_header(data) or 0
            else:
                sizes[begin] = entry.stat().st_size
        journal = _journal_of(slots)
        scanned = [
            ScannedFragment(begin, slots.get(begin), sizes.get(begin))
            for begin in sorted(set(slots) | set(sizes))
        ]
        if journal is not None and journal_dir_name(journal) != directory.name:
            reason = f"records of {journal!r} in directory {directory.name!r}"
            scanned_plans = [
                FragmentPlan(s.begin, Disposition.CORRUPT, reason=reason) for s in scanned
            ]
        else:
            scanned_plans = plan_journal(journal or "", scanned)

        files: JournalFiles | None = None
        spool: RecoveredSpool | None = None
        completed: list[RecoveredFragment] = []
        name = journal or directory.name
        for plan in scanned_plans:
            content = directory / fragment_file_name(plan.begin, CONTENT_SUFFIX)
            record = directory / fragment_file_name(plan.begin, RECORD_SUFFIX)
            if plan.disposition is Disposition.SUPERSEDED:
                _unlink_all(record, content)
                continue
            chosen = None
            summer: HASH | None = None
            if plan.disposition is not Disposition.CORRUPT:
                chosen, summer = _verify(content, plan.candidates)
            if chosen is not None and chosen.length and chosen.first_append_time is None:
                chosen = None  # Content without a first append time: no record we wrote.
            if (
                chosen is None
                or summer is None
                or (plan.disposition is Disposition.COMPLETED and chosen.length == 0)
            ):
                reason = plan.reason or "no commit's SHA1 matches the content"
                self.set_aside(name, [record, content], f"[{plan.begin}, ...): {reason}")
                metrics.SPOOL_RECOVERY.labels("corrupt").inc()
                report.set_aside += 1
                continue
            newest = slots[plan.begin][0]
            if chosen is not newest.record:
                log.warning(
                    "spool commit record fell back to the previous commit",
                    journal=name,
                    begin=plan.begin,
                    recorded_end=newest.record.end,
                    recovered_end=chosen.end,
                )
            record_file = RecordFile(
                record, plan.begin, slot_bytes[plan.begin], newest.seq, fsync=self.fsync
            )
            if chosen is not newest.record:
                record_file.write(chosen)  # Both slots agree again on what is committed.
            file = _open_content(content, chosen.length)
            if plan.disposition is Disposition.COMPLETED:
                record_file.close()
                if file is None or chosen.first_append_time is None:
                    raise AssertionError("non-empty commit without content or first append time")
                file.adopt_record(record)
                completed.append(
                    RecoveredFragment(
                        chosen.fragment, chosen.registers, chosen.first_append_time, file
                    )
                )
                continue
            files = JournalFiles(
                directory,
                fsync=self.fsync,
                record=record_file,
                content=file,
                recorded_length=chosen.length,
            )
            spool = RecoveredSpool(
                chosen.fragment, chosen.registers, chosen.first_append_time, file, summer
            )
        if journal is None or (spool is None and not completed):
            try:
                directory.rmdir()
            except OSError:
                pass  # Something is left (files set aside elsewhere, or unknown files).
            return None
        if spool is None:
            # The open fragment was set aside: resume, empty, at the last completed one's end.
            last = completed[-1]
            empty = pb.Fragment(
                journal=journal,
                begin=last.fragment.end,
                end=last.fragment.end,
                compression_codec=last.fragment.compression_codec,
            )
            empty.sum.SetInParent()
            spool = RecoveredSpool(empty, last.registers, None, None, hashlib.sha1())
            files = JournalFiles(directory, fsync=self.fsync)
        if files is None:
            raise AssertionError("recovered spool without its files")
        return RecoveredJournal(journal, files, spool, completed)


def _journal_of(slots: dict[int, list[SlotRecord]]) -> str | None:
    """The journal named by the newest record of the greatest begin (None: no valid record)."""
    for begin in sorted(slots, reverse=True):
        if slots[begin]:
            return slots[begin][0].record.fragment.journal
    return None


def _verify(path: Path, candidates: list[CommitRecord]) -> tuple[CommitRecord | None, HASH | None]:
    """The first of `candidates` (newest first) that the content at `path` verifies, with a
    SHA1 over exactly its content; (None, None) if none does."""
    lengths = sorted({c.length for c in candidates})
    sums: dict[int, HASH] = {}
    summer = hashlib.sha1()
    done = 0
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        fd = -1
    try:
        for length in lengths:
            while done < length and fd >= 0:
                chunk = os.pread(fd, min(hash_chunk_bytes, length - done), done)
                if not chunk:
                    break
                summer.update(chunk)
                done += len(chunk)
            if done < length:
                break
            sums[length] = summer.copy()
    finally:
        if fd >= 0:
            os.close(fd)
    for candidate in candidates:
        digest = sums.get(candidate.length)
        if digest is not None and verified(candidate, sum_from_digest(digest.digest())):
            return candidate, digest
    return None, None


def _open_content(path: Path, length: int) -> NamedSpoolFile | None:
    """The content file cut to `length` (bytes past the commit were never committed); None,
    the file deleted if any, for an empty fragment."""
    if length == 0:
        _unlink_all(path)
        return None
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        if os.fstat(fd).st_size > length:
            os.ftruncate(fd, length)
    except BaseException:
        os.close(fd)
        raise
    return NamedSpoolFile(fd, path)


def _unlink_all(*paths: Path) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
