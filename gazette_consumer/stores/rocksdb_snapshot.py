"""The RocksDBStore's view of its database directory: which files are recorded, in which order,
and a consistent snapshot of what changed since the log last recorded them (rocksdb.py records
the changes; this module does no recording and takes no lock).

Snapshot (`scan_directory`, run in the store's thread after a commit's WriteBatch is in the WAL
file): stat every recordable file, and open each one that differs from what the log holds,
pinning its inode (a deletion by a compaction cannot take the content away) with its size.
Files are visited in RocksDB's dependency order — CURRENT, then MANIFESTs (and the small files
that refer to nothing), then, listed anew, WALs and SSTs/blobs — because RocksDB writes them the
other way round: an SST is complete before the MANIFEST edit naming it, a MANIFEST before the
CURRENT naming it, and files are deleted only after the MANIFEST edit that obsoletes them. The
scan ends by checking that CURRENT and the MANIFESTs are unchanged since visited: then no file
they name was deleted meanwhile, so each was listed after them and is at least as complete as
they require. The snapshot is thus a state RocksDB recovers from as after `kill -9`, although
background jobs run on. A scan that sees a MANIFEST edit, or a file vanish, returns None and the
store starts over (at most `SNAPSHOT_ATTEMPTS_MAX` times; rocksdict exposes no way to pause
background work).

Each changed file is a `Change`: the tail of an append-only file the log holds (SSTs, blobs,
WALs, MANIFESTs: written sequentially, never rewritten in place), a new append-only file, or a
file RocksDB replaces wholesale (CURRENT, OPTIONS-*, IDENTITY, rocksdict's config), recorded
through a temporary name ending in `TEMP_SUFFIX`. Up to `PREFETCH_BYTES_MAX` of the changed
bytes are read in the snapshot's own thread hop.

Not recordable (`recordable`): LOCK, the info log (LOG, LOG.old.*), RocksDB's `*.dbtmp`
temporaries, recorded temporaries, and dot-files (the player's staging).
"""

from __future__ import annotations

import contextlib
import enum
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

from gazette_consumer.stores.base import StoreError

__all__ = [
    "APPEND_ONLY",
    "PREFETCH_BYTES_MAX",
    "SNAPSHOT_ATTEMPTS_MAX",
    "TEMP_SUFFIX",
    "Change",
    "FileKind",
    "FileState",
    "Snapshot",
    "SnapshotError",
    "kind_of",
    "pread_exactly",
    "recordable",
    "scan_directory",
]

PREFETCH_BYTES_MAX: Final = 1 << 20
"""Changed bytes per commit read already in the snapshot's thread hop (saves a hop per file
for the common commit, whose only change is a small WAL tail)."""

SNAPSHOT_ATTEMPTS_MAX: Final = 64
"""Directory snapshots tried before a commit fails: each retry means a background flush or
compaction finished during the scan (a MANIFEST edit, files deleted). A scan takes about a
millisecond, and the commit's own writes are done, so background jobs cannot keep that up."""

TEMP_SUFFIX: Final = ".gazette-tmp"
"""Suffix of the recorded temporary name of a file recorded wholesale (then renamed)."""


class SnapshotError(StoreError):
    """The database directory could not be snapshotted (files kept vanishing, or a file was
    shorter than RocksDB's append-only writing allows)."""


class FileKind(enum.IntEnum):
    """A file's role; the value is its recording order (the scan's is `_SCAN_ORDER`)."""

    DATA = 0  # *.sst, *.blob: written once, sequentially.
    WAL = 1  # *.log: appended.
    MANIFEST = 2  # MANIFEST-*: appended.
    OTHER = 3  # OPTIONS-*, IDENTITY, rocksdict-config.json, ...: replaced wholesale.
    CURRENT = 4  # Names the MANIFEST: replaced wholesale, recorded last.


APPEND_ONLY: Final = frozenset({FileKind.DATA, FileKind.WAL, FileKind.MANIFEST})
# Scan in dependency order: a file is visited before the files it refers to. OTHER files refer
# to nothing, so their place does not matter. WALs and SSTs are listed anew after the MANIFEST.
_SCAN_ORDER: Final = {
    FileKind.CURRENT: 0,
    FileKind.MANIFEST: 1,
    FileKind.OTHER: 2,
    FileKind.WAL: 3,
    FileKind.DATA: 4,
}
_SCAN_PHASES: Final = (
    frozenset({FileKind.CURRENT, FileKind.MANIFEST, FileKind.OTHER}),
    frozenset({FileKind.WAL, FileKind.DATA}),
)


def kind_of(name: str) -> FileKind:
    if name == "CURRENT":
        return FileKind.CURRENT
    if name.startswith("MANIFEST-"):
        return FileKind.MANIFEST
    if name.endswith(".log"):
        return FileKind.WAL
    if name.endswith((".sst", ".blob")):
        return FileKind.DATA
    return FileKind.OTHER


def recordable(name: str) -> bool:
    """Whether a directory entry is part of the database's recorded state."""
    return not (
        name in ("LOCK", "LOG")
        or name.startswith(("LOG.old", "."))
        or name.endswith((".dbtmp", TEMP_SUFFIX))
    )


@dataclass(frozen=True)
class FileState:
    """What tells a file's versions apart: its inode, size and modification time."""

    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileState:
        return cls(st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass
class Change:
    """A file to record: bytes [start, size) of the inode open at `fd`."""

    name: str
    kind: FileKind
    fd: int
    start: int
    size: int
    # "append": the tail of a recorded file; "create": a new append-only file; "replace": a
    # whole file, through a temporary name.
    mode: Literal["append", "create", "replace"]
    prefetched: bytes | None = None


@dataclass
class Snapshot:
    states: dict[str, FileState]
    changes: list[Change] = field(default_factory=list)

    def close(self) -> None:
        for change in self.changes:
            with contextlib.suppress(OSError):
                os.close(change.fd)


def scan_directory(
    directory: Path, baseline: dict[str, FileState], recorded: set[str]
) -> Snapshot | None:
    """The directory's recordable files and their changes against `baseline` (the local state
    of the `recorded` files), or None if the directory moved under the scan: a file vanished
    while visited, or CURRENT or a MANIFEST changed before the scan ended (see the module
    docstring for why that makes the snapshot consistent)."""
    snapshot = Snapshot(states={})
    try:
        # Files are listed per phase: the WALs and SSTs the MANIFEST names may have been
        # created after the first listing, but exist at the second.
        for phase in _SCAN_PHASES:
            names = sorted(
                (name for name in os.listdir(directory) if recordable(name)),
                key=lambda name: (_SCAN_ORDER[kind_of(name)], name),
            )
            for name in names:
                if kind_of(name) in phase:
                    _visit(directory, name, baseline, recorded, snapshot)
        # No MANIFEST edit (nor CURRENT switch) since they were visited, so RocksDB deleted no
        # file they name meanwhile: every such file was listed, whole enough, after them.
        for name, state in snapshot.states.items():
            if kind_of(name) in (FileKind.CURRENT, FileKind.MANIFEST):
                if FileState.of(os.stat(directory / name)) != state:
                    snapshot.close()
                    return None
        budget = PREFETCH_BYTES_MAX
        for change in snapshot.changes:
            length = change.size - change.start
            if length <= budget:
                change.prefetched = pread_exactly(change, change.start, length)
                budget -= length
    except FileNotFoundError:
        snapshot.close()
        return None
    except BaseException:
        snapshot.close()
        raise
    return snapshot


def _visit(
    directory: Path,
    name: str,
    baseline: dict[str, FileState],
    recorded: set[str],
    snapshot: Snapshot,
) -> None:
    """Note a file's state, and open it as a change if it differs from `baseline`."""
    path = directory / name
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        return
    state, recorded_state = FileState.of(st), baseline.get(name)
    if state == recorded_state:
        snapshot.states[name] = state  # Unchanged: the log has all of it.
        return
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        state = FileState.of(os.fstat(fd))  # The inode we hold, as of now.
    except BaseException:
        os.close(fd)
        raise
    kind = kind_of(name)
    if name not in recorded and kind in APPEND_ONLY:
        change = Change(name, kind, fd, 0, state.size, "create")
    elif (
        kind in APPEND_ONLY
        and recorded_state is not None
        and recorded_state.ino == state.ino
        and recorded_state.size <= state.size
    ):
        change = Change(name, kind, fd, recorded_state.size, state.size, "append")
    else:
        change = Change(name, kind, fd, 0, state.size, "replace")
    snapshot.changes.append(change)
    snapshot.states[name] = state


def pread_exactly(change: Change, offset: int, length: int) -> bytes:
    data = os.pread(change.fd, length, offset)
    if len(data) != length:
        raise SnapshotError(
            f"{change.name}: read {len(data)} of {length} bytes at {offset}; the file shrank "
            "(RocksDB files are append-only or replaced whole)"
        )
    return data
