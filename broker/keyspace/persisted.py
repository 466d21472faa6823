"""The directory of a persisted embedded keyspace: a snapshot, a write-ahead log, a lock.

    <dir>/LOCK                 flock(2)ed by the process that has the keyspace open
    <dir>/identity             cluster ID, member ID and raft term of response headers
    <dir>/snapshot             the state at some revision (absent until the first one)
    <dir>/wal-<generation>.log every change since that snapshot, in order

``KeySpaceDir.open`` locks the directory and rebuilds the MVCC core from it: the snapshot, then
each change of the log (MVCCStore.redo). The embedded store then appends every change to the log
before it answers the request that made it (``append``; ``sync`` to survive an OS crash too).

Snapshots bound the log, and so start-up time: once the log passes ``wal_bytes_max``, the store
calls ``snapshot``, which writes the whole state to a temporary file, fsyncs it and renames it
over the snapshot (fsyncing the directory), then starts an empty log of the next generation and
deletes the old one. The generation, written in the snapshot, says which log follows it, so a
crash at any step leaves either the old snapshot with its log or the new one with its (possibly
missing, i.e. empty) log; a log of an older generation is a leftover, deleted at open.

Snapshots are always fsynced, whatever the store's ``fsync`` setting: the old log is deleted
after one, and a snapshot lost to an OS crash would take every change before it along.

The identity (``open_identity``) is what etcd puts in every response header: Gazette's Go
clients refuse headers whose cluster ID, member ID or raft term is zero, and brokers refuse
requests proxied from another cluster ID. Random non-zero IDs are drawn at the directory's
first open (or the first open by a version that kept none) and kept; the raft term grows by
one at each open, as a restarted one-member etcd's does. Rewritten whole (temporary file,
fsync, rename) at each open; damage is a CorruptLogError, never new IDs in silence.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import struct
from dataclasses import dataclass

from broker.durable_file import fsync_dir, replace_durably
from broker.keyspace.backend import KeySpaceError
from broker.keyspace.change_codec import (
    ChangeDecodeError,
    decode_change,
    decode_state,
    encode_change,
    encode_state,
)
from broker.keyspace.changes import Change, RedoError, StoreState
from broker.keyspace.mvcc import MVCCStore
from broker.keyspace.wal import CorruptLogError, LogWriter, frame, scan_records
from broker.logging import get_logger

log = get_logger(__name__)

# Write-ahead log bytes after which a snapshot replaces them: bounds start-up replay (about
# 2 s for 8 MiB of small changes on a busy 2-core machine).
wal_bytes_max_default = 8 * 1024 * 1024

_SNAPSHOT_MAGIC = b"GZKSNAP1"
IDENTITY_FILE = "identity"
_IDENTITY_MAGIC = b"GZKSID01"
_IDENTITY = struct.Struct("<QQQ")
_GENERATION = struct.Struct("<Q")
_WAL_NAME = re.compile(r"wal-([0-9a-f]{16})\.log")


class KeySpaceDirError(KeySpaceError):
    """The keyspace directory cannot be opened (it cannot be created, read or written)."""


class KeySpaceLockedError(KeySpaceDirError):
    """Another process (or another store in this one) has the keyspace directory open."""


@dataclass(frozen=True, slots=True)
class StoreIdentity:
    """The IDs an embedded store puts in response headers (see the module docstring)."""

    cluster_id: int
    member_id: int
    raft_term: int


def new_store_id() -> int:
    """A random ID: non-zero, and below 2**63 so that no reader takes it for a negative."""
    return 1 + secrets.randbelow((1 << 63) - 1)


class KeySpaceDir:
    """An open, locked keyspace directory. Not thread-safe: its store serialises calls, and
    only ``sync`` may run in another thread (never while ``snapshot`` or ``close`` run)."""

    def __init__(self, path: str, wal_bytes_max: int = wal_bytes_max_default) -> None:
        """Lock ``path`` (created if missing); ``load`` then reads it."""
        if wal_bytes_max < 1:
            raise ValueError(f"wal_bytes_max: must be >= 1 (got {wal_bytes_max})")
        self.path = os.path.abspath(path)
        self.wal_bytes_max = wal_bytes_max
        os.makedirs(self.path, exist_ok=True)
        self._lock_fd = _lock(os.path.join(self.path, "LOCK"))
        self._generation = 0
        self._writer: LogWriter | None = None
        self.syncs = 0  # fdatasyncs of the log so far (group commit shows as fewer syncs).

    def load(self, core: MVCCStore) -> None:
        """Rebuild the fresh ``core`` from the snapshot and the log, dropping a torn tail of
        the log (truncated, with a warning), then open the log for appending. Raises
        CorruptLogError naming the file and offset of any other damage."""
        snapshot = os.path.join(self.path, "snapshot")
        if os.path.exists(snapshot):
            self._generation, state = _read_snapshot(snapshot)
            try:
                core.load_state(state)
            except RedoError as exc:
                raise CorruptLogError(snapshot, len(_SNAPSHOT_MAGIC), str(exc)) from exc
        with contextlib.suppress(FileNotFoundError):
            os.unlink(snapshot + ".tmp")  # A snapshot that was never renamed into place.
        for name in os.listdir(self.path):
            match = _WAL_NAME.fullmatch(name)
            if match is None:
                continue
            generation = int(match.group(1), 16)
            if generation > self._generation:
                raise CorruptLogError(
                    os.path.join(self.path, name),
                    0,
                    f"a log of generation {generation} follows snapshot generation "
                    f"{self._generation}: the snapshot it belongs to is missing",
                )
            if generation < self._generation:
                os.unlink(os.path.join(self.path, name))  # Superseded by the snapshot.
        wal = self._wal_path(self._generation)
        if os.path.exists(wal):
            _replay(wal, core)
        self._writer = LogWriter(wal)
        fsync_dir(self.path)

    def open_identity(self) -> StoreIdentity:
        """The directory's identity, its raft term advanced by this open (see the module
        docstring); written and fsynced before it is returned."""
        path = os.path.join(self.path, IDENTITY_FILE)
        if os.path.exists(path):
            previous = _read_identity(path)
        else:
            previous = StoreIdentity(new_store_id(), new_store_id(), 0)
        identity = StoreIdentity(previous.cluster_id, previous.member_id, previous.raft_term + 1)
        payload = _IDENTITY.pack(identity.cluster_id, identity.member_id, identity.raft_term)
        replace_durably(path, _IDENTITY_MAGIC + frame(payload))
        return identity

    @property
    def wal_bytes(self) -> int:
        return self._writer.size if self._writer is not None else 0

    def wants_snapshot(self) -> bool:
        return self.wal_bytes > self.wal_bytes_max

    def append(self, changes: list[Change]) -> None:
        """Write ``changes`` to the log (to the OS: they survive this process being killed)."""
        self._open_writer().append(encode_change(c) for c in changes)

    def sync(self) -> None:
        """fdatasync the log: what was appended survives an OS crash."""
        self._open_writer().sync()
        self.syncs += 1

    def snapshot(self, state: StoreState) -> None:
        """Replace the snapshot and the log with ``state`` (see the module docstring)."""
        old = self._open_writer()
        generation = self._generation + 1
        target = os.path.join(self.path, "snapshot")
        payload = _GENERATION.pack(generation) + encode_state(state)
        replace_durably(target, _SNAPSHOT_MAGIC + frame(payload))
        self._generation = generation
        self._writer = LogWriter(self._wal_path(generation))
        fsync_dir(self.path)
        old.close()
        os.unlink(old.path)
        log.info("embedded keyspace snapshot", path=self.path, revision=state.revision)

    def close(self) -> None:
        """Close the log and release the lock."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # Releases the flock.
            self._lock_fd = -1

    def _open_writer(self) -> LogWriter:
        if self._writer is None:
            raise ValueError(f"keyspace directory {self.path}: not loaded, or closed")
        return self._writer

    def _wal_path(self, generation: int) -> str:
        return os.path.join(self.path, f"wal-{generation:016x}.log")


def _lock(path: str) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise KeySpaceLockedError(
            f"embedded keyspace directory {os.path.dirname(path)} is in use (lock file {path} "
            f"is held by process {holder}): stop that process, or give this one another "
            "--data-dir"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    # The holder's PID, for the error above (informative only: the flock is the lock).
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _read_snapshot(path: str) -> tuple[int, StoreState]:
    with open(path, "rb") as f:
        data = f.read()
    if not data.startswith(_SNAPSHOT_MAGIC):
        raise CorruptLogError(path, 0, "not a keyspace snapshot (bad magic)")
    scan = scan_records(data[len(_SNAPSHOT_MAGIC) :], path)
    # Snapshots are written whole and fsynced before use: any damage is corruption.
    if scan.torn is not None or len(scan.records) != 1:
        raise CorruptLogError(path, len(_SNAPSHOT_MAGIC) + scan.end, "snapshot is incomplete")
    payload = scan.records[0][1]
    try:
        (generation,) = _GENERATION.unpack_from(payload)
        return generation, decode_state(payload[_GENERATION.size :])
    except (struct.error, ChangeDecodeError) as exc:
        raise CorruptLogError(path, len(_SNAPSHOT_MAGIC), f"snapshot: {exc}") from exc


def _read_identity(path: str) -> StoreIdentity:
    with open(path, "rb") as f:
        data = f.read()
    if not data.startswith(_IDENTITY_MAGIC):
        raise CorruptLogError(path, 0, "not a keyspace identity (bad magic)")
    scan = scan_records(data[len(_IDENTITY_MAGIC) :], path)
    # Written whole and fsynced before use (then renamed): any damage is corruption.
    if scan.torn is not None or len(scan.records) != 1:
        raise CorruptLogError(path, len(_IDENTITY_MAGIC) + scan.end, "identity is incomplete")
    payload = scan.records[0][1]
    if len(payload) != _IDENTITY.size:
        raise CorruptLogError(path, len(_IDENTITY_MAGIC), f"identity of {len(payload)} bytes")
    identity = StoreIdentity(*_IDENTITY.unpack(payload))
    if identity.cluster_id == 0 or identity.member_id == 0:
        raise CorruptLogError(path, len(_IDENTITY_MAGIC), "identity with a zero ID")
    return identity


def _replay(path: str, core: MVCCStore) -> None:
    with open(path, "rb") as f:
        data = f.read()
    scan = scan_records(data, path)
    for offset, payload in scan.records:
        try:
            core.redo(decode_change(payload))
        except (ChangeDecodeError, RedoError) as exc:
            raise CorruptLogError(path, offset, str(exc)) from exc
    if scan.torn is not None:
        # Never acknowledged: the write that left it was cut short by a crash.
        log.warning(
            "embedded keyspace: dropping the torn tail of its write-ahead log",
            path=path,
            offset=scan.end,
            dropped_bytes=len(data) - scan.end,
            found=scan.torn,
        )
        os.truncate(path, scan.end)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
