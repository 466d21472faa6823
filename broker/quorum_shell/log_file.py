"""A quorum member's durable log: the file shell around `ReplicaLog` (log_codec.py's format).

One append-only file per journal, `<data-dir>/quorum/<journal>/log`. Opening it replays its
records into a `ReplicaLog` (a torn tail, the last write cut short by a crash, is cut off and
counted; a damaged record before intact ones raises `LogFileCorruptError`, changing nothing).
The returned log records its changes (`ReplicaLog.changes`), and `persist()` appends them to
the file: the node calls it after every call into the core and before anything the core
produced is sent, so a follower's answer, a NewTerm answer and a commit visible to readers are
all in the file first. With `fsync` (the broker's --fsync) the file is also fdatasync'ed, so
the log survives power loss and not only the process, like the spools.

Bounded: once the file exceeds twice the records its log needs (plus `rewrite_slack_bytes`),
which happens as the core compacts or truncates, it is rewritten from the log's snapshot
(log_replay.snapshot) into a temporary file renamed over it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Final

from broker import metrics
from broker.fragment.spool_named import fsync_dir
from broker.logging import get_logger
from broker.quorum.errors import LogFileCorruptError, ProtocolError
from broker.quorum.log import ReplicaLog
from broker.quorum.log_codec import HEADER, decode_log, encode_change, encode_log
from broker.quorum.log_replay import replay, snapshot

log = get_logger(__name__)

LOG_FILE_NAME: Final = "log"
# File bytes beyond twice what the log needs before the file is rewritten.
rewrite_slack_bytes_default: Final = 1 << 20
# Record framing and entry fields per entry, for the estimate of what the log needs.
_ENTRY_OVERHEAD_BYTES: Final = 50
_OPEN_FLAGS: Final = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC


def log_path(data_dir: str | Path, journal: str) -> Path:
    """Where `journal`'s member log lives under a broker's data directory."""
    return Path(data_dir) / "quorum" / journal / LOG_FILE_NAME


def _read_all(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    parts: list[bytes] = []
    at = 0
    while at < size:
        chunk = os.pread(fd, size - at, at)
        if not chunk:
            break
        parts.append(chunk)
        at += len(chunk)
    return b"".join(parts)


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


class QuorumLogFile:
    """See the module docstring. `log` is the replayed log, recording its changes."""

    def __init__(
        self,
        path: Path,
        *,
        fsync: bool = False,
        rewrite_slack_bytes: int = rewrite_slack_bytes_default,
    ) -> None:
        """Open (creating) and replay `path`. Raises LogFileCorruptError or OSError, having
        changed nothing (a torn tail excepted: it is cut off)."""
        self.path = path
        self._fsync = fsync
        self._rewrite_slack_bytes = rewrite_slack_bytes
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, _OPEN_FLAGS, 0o644)
        try:
            self.log, self._size = self._replay(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self.log.changes = []
        self.rewrites = 0

    def _replay(self, fd: int) -> tuple[ReplicaLog, int]:
        try:
            decoded = decode_log(_read_all(fd))
        except LogFileCorruptError as err:
            metrics.QUORUM_LOG_OPENED.labels("corrupt").inc()
            raise LogFileCorruptError(f"{self.path}: {err}") from err
        try:
            replayed = replay(decoded.changes)
        except (ProtocolError, IndexError) as err:
            metrics.QUORUM_LOG_OPENED.labels("corrupt").inc()
            raise LogFileCorruptError(f"{self.path}: records do not rebuild a log: {err}") from err
        size = decoded.good_end
        if decoded.torn_bytes:
            metrics.QUORUM_LOG_OPENED.labels("torn_tail").inc()
            log.warning(
                "quorum log: torn tail cut off",
                path=str(self.path),
                good_bytes=size,
                torn_bytes=decoded.torn_bytes,
            )
            os.ftruncate(fd, size)
        if size == 0:
            metrics.QUORUM_LOG_OPENED.labels("new").inc()
            _write_all(fd, HEADER, 0)
            size = len(HEADER)
            self._sync(fd)
            if self._fsync:
                fsync_dir(self.path.parent)
        elif not decoded.torn_bytes:
            metrics.QUORUM_LOG_OPENED.labels("replayed").inc()
        return replayed, size

    @property
    def size(self) -> int:
        """Bytes in the file."""
        return self._size

    def persist(self) -> None:
        """Append the log's recorded changes to the file (synced with `fsync`); rewrite the
        file once it outgrows its bound. Raises OSError: the caller must then not act on the
        changes (the node stops taking part)."""
        changes = self.log.changes
        if not changes:
            return
        data = b"".join(encode_change(c) for c in changes)
        _write_all(self._fd, data, self._size)
        self._size += len(data)
        self._sync(self._fd)
        changes.clear()
        if self._size > 2 * self._needed_bytes() + self._rewrite_slack_bytes:
            self._rewrite()

    def _needed_bytes(self) -> int:
        return (
            len(HEADER) + self.log.held_bytes + _ENTRY_OVERHEAD_BYTES * (self.log.entry_count + 8)
        )

    def _rewrite(self) -> None:
        tmp = self.path.with_name(LOG_FILE_NAME + ".tmp")
        data = encode_log(snapshot(self.log))
        fd = os.open(tmp, _OPEN_FLAGS | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, data, 0)
            self._sync(fd)
            os.replace(tmp, self.path)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):  # a partial copy (a full disk) frees its room
                os.unlink(tmp)
            raise
        if self._fsync:
            fsync_dir(self.path.parent)
        os.close(self._fd)
        self._fd, self._size = fd, len(data)
        self.rewrites += 1

    def _sync(self, fd: int) -> None:
        if self._fsync:
            os.fdatasync(fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
