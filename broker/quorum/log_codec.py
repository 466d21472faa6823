"""The member's log file format, sans I/O: framed `LogChange` records (log_change.py).

Layout (integers little-endian)::

    header   "GZQL" | version u8 | 3 bytes zero
    record   "\\xa7QLR" | body_len u32 | crc32c u32 | body
    body     kind u8 | payload

    kind  payload
    1     term u64                      a term entered (TermSet)
    2     term u64                      the log aligned in a term (AlignedTermSet)
    3     term u64                      a term led (LedTermSet)
    4     index u64                     the commit index raised (CommitSet)
    5     term, index, begin, end u64 | content (end - begin bytes)   an entry (EntryAppended)
    6     index u64                     entries after it dropped (TruncatedAfter)
    7     index u64                     entries through it compacted (CompactedThrough)
    8     term, index, end u64          the log replaced by a base (ResetTo)
    9     term, index, begin, end u64 | registers | content   an entry that changed the
                                        registers (EntryAppended; entry.py)
    10    term, index, end u64 | registers                    the log replaced by a base
                                        with registers (ResetTo)
    11    term, index u64               the aligning leader's head (AlignedHeadSet)

    registers  count u32 | count x (name_len u32 | name | value_len u32 | value), UTF-8

Kinds 9 and 10 were added with registers: an entry (a base) without registers is still written
as kind 5 (8), so files of journals that never use registers are unchanged, and files written
before registers existed replay as they did. Kind 11 was added with the lost-disk catch-up
target (Rules.may_vote); files without it replay as before (the target is ORIGIN).

The CRC32C covers body_len and the body. Records are only ever appended, so a crash can leave
at most the last write incomplete: a *torn tail*, which `decode_log` reports by where the good
records end (the shell cuts the file there). A damaged record followed by an intact one is not
a torn write but corruption (a bad disk, an edited file): `LogFileCorruptError`, because
cutting there would drop records the member acknowledged. Every record starts with a marker so
that intact records after a damaged one are found without trusting its length.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

import google_crc32c

from broker.quorum.entry import NO_REGISTERS, Entry, EntryId, LogBase, Registers
from broker.quorum.errors import LogFileCorruptError
from broker.quorum.log_change import (
    AlignedHeadSet,
    AlignedTermSet,
    CommitSet,
    CompactedThrough,
    EntryAppended,
    LedTermSet,
    LogChange,
    ResetTo,
    TermSet,
    TruncatedAfter,
)

MAGIC: Final = b"GZQL"
VERSION: Final = 1
HEADER: Final = MAGIC + bytes((VERSION, 0, 0, 0))
FRAME_MARKER: Final = b"\xa7QLR"
# The largest record body: an entry of the largest append (quorum_append_bytes_max, 2 MiB)
# with room to spare. A length beyond it is damage, never a record.
record_body_bytes_max: Final = 64 << 20

_FRAME: Final = struct.Struct("<4sII")  # marker, body_len, crc32c
_U64: Final = struct.Struct("<Q")
_ENTRY: Final = struct.Struct("<QQQQ")
_BASE: Final = struct.Struct("<QQQ")

_U32: Final = struct.Struct("<I")

_TERM, _ALIGNED, _LED, _COMMIT, _ENTRY_KIND, _TRUNCATE, _COMPACT, _RESET = range(1, 9)
_ENTRY_REGISTERS, _RESET_REGISTERS, _ALIGNED_HEAD = 9, 10, 11
_ENTRY_ID: Final = struct.Struct("<QQ")


def _encode_registers(registers: Registers) -> bytes:
    parts = [_U32.pack(len(registers))]
    for name, value in registers:
        for text in (name.encode(), value.encode()):
            parts.append(_U32.pack(len(text)))
            parts.append(text)
    return b"".join(parts)


def _decode_registers(data: bytes, at: int) -> tuple[Registers, int]:
    """The registers encoded at `at`, and where they end. Raises struct.error or
    UnicodeDecodeError (or ValueError) on damage."""
    (count,) = _U32.unpack_from(data, at)
    at += _U32.size
    if count > len(data):  # each label takes bytes: a count beyond them is damage
        raise ValueError(f"{count} registers in {len(data)} bytes")
    out: list[tuple[str, str]] = []
    for _ in range(count):
        texts: list[str] = []
        for _ in range(2):
            (size,) = _U32.unpack_from(data, at)
            at += _U32.size
            if at + size > len(data):
                raise ValueError("a register label runs past its record")
            texts.append(data[at : at + size].decode())
            at += size
        out.append((texts[0], texts[1]))
    return tuple(out), at


def _crc(body_len: bytes, body: bytes | memoryview) -> int:
    return int(google_crc32c.extend(google_crc32c.value(body_len), body))


def encode_change(change: LogChange) -> bytes:
    """One framed record."""
    match change:
        case TermSet():
            body = bytes((_TERM,)) + _U64.pack(change.term)
        case AlignedTermSet():
            body = bytes((_ALIGNED,)) + _U64.pack(change.term)
        case LedTermSet():
            body = bytes((_LED,)) + _U64.pack(change.term)
        case AlignedHeadSet():
            body = bytes((_ALIGNED_HEAD,)) + _ENTRY_ID.pack(change.head.term, change.head.index)
        case CommitSet():
            body = bytes((_COMMIT,)) + _U64.pack(change.index)
        case EntryAppended():
            e = change.entry
            head = _ENTRY.pack(e.term, e.index, e.begin, e.end)
            if e.registers is None:
                body = b"".join((bytes((_ENTRY_KIND,)), head, e.data))
            else:
                registers = _encode_registers(e.registers)
                body = b"".join((bytes((_ENTRY_REGISTERS,)), head, registers, e.data))
        case TruncatedAfter():
            body = bytes((_TRUNCATE,)) + _U64.pack(change.index)
        case CompactedThrough():
            body = bytes((_COMPACT,)) + _U64.pack(change.index)
        case ResetTo():
            b = change.base
            body = bytes((_RESET,)) + _BASE.pack(b.term, b.index, b.end)
            if b.registers != NO_REGISTERS:
                body = bytes((_RESET_REGISTERS,)) + body[1:] + _encode_registers(b.registers)
    if len(body) > record_body_bytes_max:
        raise ValueError(f"a log record of {len(body)} bytes (record_body_bytes_max)")
    length = struct.pack("<I", len(body))
    return b"".join((FRAME_MARKER, length, struct.pack("<I", _crc(length, body)), body))


def _decode_body(body: bytes) -> LogChange | None:
    """The change a (CRC-valid) body holds, or None if it is malformed."""
    if not body:
        return None
    kind, rest = body[0], body[1:]
    try:
        if kind in (_ENTRY_KIND, _ENTRY_REGISTERS):
            term, index, begin, end = _ENTRY.unpack_from(rest, 0)
            registers: Registers | None = None
            at = _ENTRY.size
            if kind == _ENTRY_REGISTERS:
                registers, at = _decode_registers(rest, at)
            data = rest[at:]
            if end - begin != len(data):
                return None
            return EntryAppended(Entry(term, index, begin, end, data, registers))
        if kind == _RESET:
            if len(rest) != _BASE.size:
                return None
            return ResetTo(LogBase(*_BASE.unpack(rest)))
        if kind == _RESET_REGISTERS:
            base_registers, at = _decode_registers(rest, _BASE.size)
            if at != len(rest):
                return None
            term, index, end = _BASE.unpack_from(rest, 0)
            return ResetTo(LogBase(term, index, end, base_registers))
        if kind == _ALIGNED_HEAD:
            if len(rest) != _ENTRY_ID.size:
                return None
            return AlignedHeadSet(EntryId(*_ENTRY_ID.unpack(rest)))
        if len(rest) != _U64.size:
            return None
        (value,) = _U64.unpack(rest)
    except (struct.error, ValueError):  # UnicodeDecodeError included
        return None
    simple: dict[int, type[TermSet | AlignedTermSet | LedTermSet]] = {
        _TERM: TermSet,
        _ALIGNED: AlignedTermSet,
        _LED: LedTermSet,
    }
    if kind in simple:
        return simple[kind](value)
    if kind == _COMMIT:
        return CommitSet(value)
    if kind == _TRUNCATE:
        return TruncatedAfter(value)
    if kind == _COMPACT:
        return CompactedThrough(value)
    return None


def _frame_at(data: bytes, at: int) -> tuple[bytes, int] | None:
    """The body of an intact frame at `at` and where the next one starts, or None."""
    if len(data) - at < _FRAME.size:
        return None
    marker, body_len, crc = _FRAME.unpack_from(data, at)
    start = at + _FRAME.size
    if marker != FRAME_MARKER or body_len > record_body_bytes_max or start + body_len > len(data):
        return None
    body = data[start : start + body_len]
    if _crc(data[at + 4 : at + 8], body) != crc:
        return None
    return body, start + body_len


@dataclass(frozen=True, slots=True)
class DecodedLog:
    """A log file's records, and how far they reach: `good_end` is where the intact records
    end; `torn_bytes` after it are a torn tail (0: none), to be cut off."""

    changes: list[LogChange]
    good_end: int
    torn_bytes: int


def decode_log(data: bytes) -> DecodedLog:
    """The records of a log file's bytes (an empty or partial header: an empty log). Raises
    LogFileCorruptError on a bad header, a damaged record followed by an intact one, or an
    intact record that is malformed."""
    if len(data) < len(HEADER):
        if HEADER.startswith(data):
            return DecodedLog([], 0, len(data))
        raise LogFileCorruptError(f"log file header {data!r} is not {HEADER!r}")
    if data[: len(HEADER)] != HEADER:
        raise LogFileCorruptError(f"log file header {data[: len(HEADER)]!r} is not {HEADER!r}")
    changes: list[LogChange] = []
    at = len(HEADER)
    while at < len(data):
        frame = _frame_at(data, at)
        if frame is None:
            later = _next_intact(data, at + 1)
            if later is not None:
                raise LogFileCorruptError(
                    f"log record at byte {at} is damaged and an intact one follows at {later}"
                )
            return DecodedLog(changes, at, len(data) - at)
        body, after = frame
        change = _decode_body(body)
        if change is None:
            raise LogFileCorruptError(f"log record at byte {at} (kind {body[:1]!r}) is malformed")
        changes.append(change)
        at = after
    return DecodedLog(changes, at, 0)


def _next_intact(data: bytes, at: int) -> int | None:
    """The offset of the first intact frame at or after `at`, or None."""
    while True:
        at = data.find(FRAME_MARKER, at)
        if at < 0:
            return None
        if _frame_at(data, at) is not None:
            return at
        at += 1


def encode_log(changes: list[LogChange]) -> bytes:
    """A whole log file holding `changes` (a rewrite)."""
    return HEADER + b"".join(encode_change(c) for c in changes)
