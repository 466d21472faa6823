"""Durable spool files: named content files, commit record files, and a journal's set of them.

With a data directory, a broker keeps each journal's spool under
``<data-dir>/spools/<journal dir>/`` (spool_dir.py), one pair of files per fragment, named by the
fragment's begin offset (16 hex digits):

- ``<begin>.spool``: the content, exactly as a temporary spool file holds it (committed bytes
  first, then any pending bytes of an append in progress);
- ``<begin>.rec``: the commit record (spool_record.py): what of that content is committed,
  the journal's registers, and the first append time.

Ordering is what makes a kill -9 harmless. An append's content is written to the content file
as it arrives; its commit is written to the record *before* the spool's state changes and so
before any acknowledgement: once the broker acknowledged, both are in the OS, which keeps them
whatever becomes of the process. With ``fsync`` both are also fdatasync'd first (content, then
record), and a new file's directory is fsync'd, so that they survive power loss too. Without
it the default costs one extra pwrite per commit.

A new record file is written whole under a temporary name and renamed into place, so a record
file is never seen half made; later records alternate between its two slots, so a torn write
never destroys the previous one. A roll starts a new record for the new (empty) fragment; the
previous fragment's record then belongs to its content file, and goes when that file is
unlinked (once persisted: `NamedSpoolFile.unlink_durable`, record first, so that a crash in
between leaves content without a record, which recovery deletes, never a record without its
content).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Final

from broker.fragment.spool_file import FdSpoolFile, SpoolFile
from broker.fragment.spool_record import (
    CommitRecord,
    encode_header,
    encode_payload,
    encode_slot,
    slot_bytes_for,
    slot_offset,
)
from broker.protocol import protocol_pb2 as pb

CONTENT_SUFFIX: Final = ".spool"
RECORD_SUFFIX: Final = ".rec"
TMP_SUFFIX: Final = ".tmp"

_OPEN_FLAGS: Final = os.O_RDWR | os.O_CLOEXEC


def fragment_file_name(begin: int, suffix: str) -> str:
    return f"{begin:016x}{suffix}"


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (files created, renamed or removed in it) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(path: Path | None) -> None:
    if path is not None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


class NamedSpoolFile(FdSpoolFile):
    """A content file with a name under the data directory (a `DurableSpoolFile`). Closing it
    keeps it on disk, for a restarted broker to recover; `unlink_durable` removes it, with the
    commit record it owns once its fragment is complete."""

    __slots__ = ("path", "record_path")

    def __init__(self, fd: int, path: Path, record_path: Path | None = None) -> None:
        super().__init__(fd)
        self.path: Path | None = path
        self.record_path: Path | None = record_path

    @classmethod
    def create(cls, path: Path, *, fsync: bool) -> NamedSpoolFile:
        fd = os.open(path, _OPEN_FLAGS | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            if fsync:
                fsync_dir(path.parent)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, path)

    def adopt_record(self, record_path: Path) -> None:
        """The commit record of this (completed) content is this file's to remove from now on."""
        self.record_path = record_path

    def unlink_durable(self) -> None:
        # The record first: a crash in between leaves content without a record, which a
        # recovery deletes, never a record whose content is gone.
        record, self.record_path = self.record_path, None
        _unlink_quietly(record)
        path, self.path = self.path, None
        _unlink_quietly(path)


class RecordFile:
    """The commit record file of one fragment: two alternating slots (spool_record.py). Its
    descriptor is opened on first use and released by `close()`; writing reopens it."""

    __slots__ = ("_fd", "_fsync", "begin", "path", "seq", "slot_bytes")

    def __init__(self, path: Path, begin: int, slot_bytes: int, seq: int, *, fsync: bool) -> None:
        self.path = path
        self.begin = begin
        self.slot_bytes = slot_bytes
        self.seq = seq
        self._fsync = fsync
        self._fd: int | None = None

    @classmethod
    def create(
        cls, directory: Path, record: CommitRecord, *, fsync: bool, seq: int = 1
    ) -> RecordFile:
        """Write a new record file holding `record` (as sequence number `seq`) under a
        temporary name, then rename it into place (replacing any file of that name)."""
        begin = record.begin
        out = cls(directory / fragment_file_name(begin, RECORD_SUFFIX), begin, 0, seq, fsync=fsync)
        out._write_whole(encode_payload(record), seq)
        return out

    def _write_whole(self, payload: bytes, seq: int) -> None:
        slot_bytes = max(self.slot_bytes, slot_bytes_for(len(payload)))
        data = bytearray(encode_header(slot_bytes))
        data.extend(bytes(slot_offset(seq, slot_bytes) - len(data)))
        data.extend(encode_slot(payload, seq))
        tmp = self.path.with_name(self.path.name + TMP_SUFFIX)
        fd = os.open(tmp, _OPEN_FLAGS | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _pwrite_all(fd, data, 0)
            if self._fsync:
                os.fdatasync(fd)
            os.rename(tmp, self.path)
            if self._fsync:
                fsync_dir(self.path.parent)
        except BaseException:
            os.close(fd)
            _unlink_quietly(tmp)
            raise
        self.close()
        self._fd = fd
        self.slot_bytes = slot_bytes
        self.seq = seq

    def write(self, record: CommitRecord) -> None:
        """Write `record` as the next sequence number, into the slot not holding the last."""
        if record.begin != self.begin:
            raise ValueError(f"record of [{record.begin}, ...) in the file of {self.begin}")
        payload = encode_payload(record)
        seq = self.seq + 1
        if slot_bytes_for(len(payload)) > self.slot_bytes:
            self._write_whole(payload, seq)  # Outgrew its slots: a new file, larger slots.
            return
        fd = self._open()
        _pwrite_all(fd, encode_slot(payload, seq), slot_offset(seq, self.slot_bytes))
        if self._fsync:
            os.fdatasync(fd)
        self.seq = seq

    def _open(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, _OPEN_FLAGS)
        return self._fd

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def unlink(self) -> None:
        self.close()
        _unlink_quietly(self.path)

    def __del__(self) -> None:
        if getattr(self, "_fd", None) is not None:
            self.close()


def _pwrite_all(fd: int, data: bytes | bytearray, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        if written <= 0:
            raise OSError(errno.EIO, f"pwrite wrote {written} bytes at offset {offset}")
        view = view[written:]
        offset += written


class JournalFiles:
    """The durable `FragmentFiles` of one journal's spool (see the module docstring): content
    files and commit records in `directory`, created when first needed."""

    def __init__(
        self,
        directory: Path,
        *,
        fsync: bool,
        record: RecordFile | None = None,
        content: NamedSpoolFile | None = None,
        recorded_length: int = 0,
    ) -> None:
        self.directory = directory
        self._fsync = fsync
        # The current fragment's record (None until something is recorded), its content file
        # (None until content arrives), and its recorded length.
        self._record = record
        self._content = content
        self._recorded_length = recorded_length

    @property
    def current_record(self) -> RecordFile | None:
        return self._record

    def content_file(self, begin: int) -> SpoolFile:
        self._ensure_directory()
        file = NamedSpoolFile.create(
            self.directory / fragment_file_name(begin, CONTENT_SUFFIX), fsync=self._fsync
        )
        self._content = file
        return file

    def record(
        self, fragment: pb.Fragment, registers: pb.LabelSet, first_append_time: float | None
    ) -> None:
        record = CommitRecord(fragment, registers, first_append_time)
        if record.length and self._fsync and self._content is not None:
            self._content.sync()  # The content before the record that claims it.
        current = self._record
        if current is not None and current.begin == record.begin:
            current.write(record)
        else:
            self._ensure_directory()
            created = RecordFile.create(self.directory, record, fsync=self._fsync)
            self._retire(current)
            self._record = created
        self._recorded_length = record.length

    def _retire(self, record: RecordFile | None) -> None:
        """The previous fragment's record, once a new one is current. (With none, nothing was
        recorded yet: a content file is the current fragment's own.)"""
        if record is None:
            return
        content = self._content
        if content is not None and content.path == record.path.with_suffix(CONTENT_SUFFIX):
            self._content = None
        else:
            content = None
        if not self._recorded_length:
            record.unlink()  # An empty fragment's: superseded.
            return
        record.close()
        if content is not None:
            content.adopt_record(record.path)  # Removed with its content, once persisted.

    def forget(self) -> None:
        self._retire(self._record)
        self._record = None
        self._recorded_length = 0

    def close(self) -> None:
        if self._record is not None:
            self._record.close()

    def remove(self) -> None:
        """Remove the current record, and the directory if nothing else is left in it (the
        journal was deleted)."""
        if self._record is not None:
            self._record.unlink()
            self._record = None
        self._recorded_length = 0
        try:
            os.rmdir(self.directory)
        except OSError:
            pass  # Not empty (fragments still being persisted), or already gone.

    def _ensure_directory(self) -> None:
        if not self.directory.is_dir():
            self.directory.mkdir(parents=True, exist_ok=True)
            if self._fsync:
                fsync_dir(self.directory.parent)
