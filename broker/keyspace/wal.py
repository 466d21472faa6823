"""Checksummed records in an append-only file: the embedded keyspace's write-ahead log.

A record is a 12-byte header and a payload:

    u32 payload length, u32 CRC-32 of the payload, u32 CRC-32 of the first 8 header bytes

The header has its own checksum so that a damaged length is never trusted: a length that
passed its checksum is what was written, so a record that runs past the end of the file is a
write cut short, not a damaged length swallowing the records after it.

Reading (``scan_records``, sans-IO) tells a torn tail from corruption. A crash can leave the
last write incomplete: a partial header, a partial payload, a final record whose payload
checksum fails, or (after an OS crash) a tail of zeros where the file grew but its pages were
never written. Such a tail never held an acknowledged change (a change is acknowledged only
once its whole record was written), so it is dropped: the caller truncates the file there and
logs a warning. Anything else - a bad checksum with valid-looking data after it - is
corruption, reported as CorruptLogError naming the file and the offset: silently skipping a
record in the middle would rebuild a state that never existed.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from broker.keyspace.backend import KeySpaceError

_HEADER = struct.Struct("<III")
header_bytes = _HEADER.size
# Largest payload a record may declare (a lease revocation deleting many keys, or a snapshot of
# a large keyspace, is one record). A checksummed length above it is corruption.
record_payload_bytes_max = 1 << 30


class CorruptLogError(KeySpaceError):
    """A keyspace file is damaged before its tail (or a snapshot is damaged at all): start-up
    stops rather than guess. ``path`` and ``offset`` say where."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(
            f"embedded keyspace file {path} is corrupt at byte offset {offset}: {reason}"
        )
        self.path = path
        self.offset = offset
        self.reason = reason


def frame(payload: bytes) -> bytes:
    """``payload`` as one record."""
    if not 0 < len(payload) <= record_payload_bytes_max:
        raise ValueError(
            f"record payload of {len(payload)} bytes: must be 1..{record_payload_bytes_max}"
        )
    head = struct.pack("<II", len(payload), zlib.crc32(payload))
    return head + struct.pack("<I", zlib.crc32(head)) + payload


@dataclass
class Scan:
    """What a log holds: each intact record's (offset, payload), where the intact prefix ends,
    and why the bytes after it were dropped (None if there were none)."""

    records: list[tuple[int, bytes]] = field(default_factory=list)
    end: int = 0
    torn: str | None = None


def scan_records(data: bytes, path: str) -> Scan:
    """The records of log ``data`` (read from ``path``, named in errors). Raises
    CorruptLogError for damage before the tail."""
    scan = Scan()
    pos = 0
    while pos < len(data):
        rest = len(data) - pos
        if rest < header_bytes:
            return _torn(scan, pos, f"a partial record header ({rest} bytes)")
        length, crc, head_crc = _HEADER.unpack_from(data, pos)
        if zlib.crc32(data[pos : pos + 8]) != head_crc:
            if _zeros(data, pos):
                return _torn(scan, pos, f"{rest} zero bytes")
            raise CorruptLogError(path, pos, "record header checksum mismatch")
        if not 0 < length <= record_payload_bytes_max:
            raise CorruptLogError(path, pos, f"record length {length} is impossible")
        end = pos + header_bytes + length
        if end > len(data):
            return _torn(scan, pos, f"a partial record ({rest} of {header_bytes + length} bytes)")
        payload = data[pos + header_bytes : end]
        if zlib.crc32(payload) != crc:
            if _zeros(data, end):
                return _torn(scan, pos, "a final record whose checksum does not match")
            raise CorruptLogError(path, pos, "record checksum mismatch")
        scan.records.append((pos, payload))
        pos = end
    scan.end = pos
    return scan


def _torn(scan: Scan, pos: int, what: str) -> Scan:
    scan.end = pos
    scan.torn = what
    return scan


def _zeros(data: bytes, pos: int) -> bool:
    """Whether everything from ``pos`` on is zero bytes (nothing at all counts)."""
    return data.count(0, pos) == len(data) - pos


class LogWriter:
    """Appends records to a log file opened for it. Every append reaches the OS (a write(2))
    before it returns, so it survives the process being killed; ``sync`` (fdatasync) makes it
    survive the machine. Errors are OSError, for the caller to turn into its own."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self.size = os.fstat(self._fd).st_size

    def append(self, payloads: Iterable[bytes]) -> None:
        """Write ``payloads`` as records, in one write where the OS allows."""
        data = memoryview(b"".join(frame(p) for p in payloads))
        while data:
            written = os.write(self._fd, data)
            self.size += written
            data = data[written:]

    def sync(self) -> None:
        os.fdatasync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
