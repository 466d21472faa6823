"""Recorded operations on the wire: framing, the op checksum, and an incremental decoder (sans-IO).

A recovery log is a byte stream of RecordedOps, each in a fixed protobuf frame (magic word +
little-endian uint32 length + the serialized op, the framing of `gazette_consumer.message`).
A Write op is special: the `length` bytes it writes follow its frame directly, unframed. So a
log cannot be split into frames without reading the ops — the generic fixed-frame Unpacker,
which would scan the written bytes for magic words, does not apply — and `OpDecoder` does it.

The FSM chains a CRC-32C (Castagnoli) over the serialized bytes of every op it applies (the
frame's payload, not its header and not a write's content), as Gazette does: an op carries the
checksum of the history it extends, so an op written against another history — by a zombie
recorder, or a duplicate — does not apply.

Unlike Gazette's player, which logs a de-synchronised frame and scans on, `OpDecoder` raises
`CorruptLogError` naming the log and offset: a recovery log is written only by recorders, so
bytes that are not an op mean corruption the operator must look at, not noise to skip.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from google.protobuf.message import DecodeError

from broker.protocol.recorded_op_pb2 import RecordedOp
from gazette_consumer.message.protobuf_framing import HEADER_BYTES, MAGIC_WORD, encode_header

__all__ = [
    "OP_BYTES_MAX",
    "WRITE_BYTES_MAX",
    "Content",
    "CorruptLogError",
    "DecodedOp",
    "OpDecoder",
    "checksum_update",
    "encode_op",
]

OP_BYTES_MAX: Final = 1 << 20
"""Bound on one serialized op (a frame's payload). Ops are tiny (paths, offsets, property
contents); a larger length in a header means corruption, not an op to buffer."""

WRITE_BYTES_MAX: Final = 1 << 30
"""Bound on the content length one Write op claims. Recorders write a file's bytes in writes of
at most megabytes (ours in pieces of recorder.WRITE_CHUNK_BYTES_MAX); a larger length means a
corrupt op, whose "content" would swallow the rest of the log."""

_CASTAGNOLI_REVERSED: Final = 0x82F63B78


def _make_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (_CASTAGNOLI_REVERSED if crc & 1 else 0)
        table.append(crc)
    return tuple(table)


_TABLE: Final = _make_table()


def checksum_update(crc: int, data: bytes | bytearray | memoryview) -> int:
    """CRC-32C of `data`, continuing from `crc` (Go's ``crc32.Update`` with the Castagnoli
    table). Pure Python: ops are tens of bytes, so this costs microseconds per op."""
    crc ^= 0xFFFFFFFF
    table = _TABLE
    for byte in bytes(data):
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def encode_op(op: RecordedOp) -> bytes:
    """The frame of `op` as a recorder appends it. The meta-fields (offsets, log) are readers'
    annotations and must not be set."""
    if op.first_offset or op.last_offset or op.log:
        raise ValueError("encode_op: first_offset, last_offset and log are set by readers only")
    payload = op.SerializeToString()
    if len(payload) > OP_BYTES_MAX:
        raise ValueError(f"encode_op: op of {len(payload)} bytes exceeds OP_BYTES_MAX")
    return encode_header(len(payload)) + payload


class CorruptLogError(Exception):
    """Bytes of the log at `offset` are not a recorded op (or the log ends inside one)."""

    def __init__(self, log: str, offset: int, reason: str) -> None:
        super().__init__(f"recovery log {log!r} at offset {offset}: {reason}")
        self.log = log
        self.offset = offset
        self.reason = reason


@dataclass(frozen=True)
class DecodedOp:
    """An op read from the log. `op` has its meta-fields set (first/last offset, log);
    `payload` is its exact serialized bytes, which the FSM checksums."""

    op: RecordedOp
    payload: bytes


@dataclass(frozen=True)
class Content:
    """A piece of the content of the last decoded Write op, at `file_offset` in its file.
    `data` is a view of the bytes fed to the decoder: no copy is made of a log's content."""

    data: memoryview
    file_offset: int


class OpDecoder:
    """Splits a log's bytes into ops and write content. Feed it contiguous bytes from
    `offset`; it returns events in log order and raises CorruptLogError on bytes that are not
    an op (after which it is unusable: the error is the state of the log)."""

    def __init__(self, log: str, offset: int, op_bytes_max: int = OP_BYTES_MAX) -> None:
        self.log = log
        self._offset = offset  # Log offset of _buf[0] (or of the next content byte).
        self._buf = bytearray()  # Bytes of an incomplete frame (bounded by op_bytes_max).
        self._op_bytes_max = op_bytes_max
        self._content_left = 0  # Bytes of the current write's content still to come.
        self._content_offset = 0  # File offset of the next content byte.
        self._failed: CorruptLogError | None = None

    @property
    def offset(self) -> int:
        """Offset of the next byte this decoder has not yet consumed into an event."""
        return self._offset

    @property
    def at_op_boundary(self) -> bool:
        """True if the next byte begins an op (no partial frame or content is pending)."""
        return not self._buf and not self._content_left

    def feed(self, data: bytes | memoryview) -> list[DecodedOp | Content]:
        if self._failed is not None:
            raise self._failed
        events: list[DecodedOp | Content] = []
        view = memoryview(data)
        while view:
            if self._content_left:
                piece = view[: self._content_left]
                view = view[len(piece) :]
                events.append(Content(piece, self._content_offset))
                self._content_left -= len(piece)
                self._content_offset += len(piece)
                self._offset += len(piece)
                continue
            view = self._take_frame_bytes(view)
            decoded = self._frame()
            if decoded is not None:
                events.append(decoded)
        return events

    def _take_frame_bytes(self, view: memoryview) -> memoryview:
        need = HEADER_BYTES - len(self._buf)
        if need > 0:
            self._buf += view[:need]
            return view[need:]
        length = int.from_bytes(self._buf[4:HEADER_BYTES], "little")
        need = HEADER_BYTES + length - len(self._buf)
        self._buf += view[:need]
        return view[need:]

    def _frame(self) -> DecodedOp | None:
        """The op of the buffered frame once it is complete; checks the header as it arrives."""
        buf = self._buf
        if len(buf) < HEADER_BYTES:
            if not MAGIC_WORD.startswith(bytes(buf[: len(MAGIC_WORD)])):
                self._fail("expected the magic word of a recorded-op frame")
            return None
        if buf[:4] != MAGIC_WORD:
            self._fail(f"expected the magic word of a recorded-op frame, found {bytes(buf[:4])!r}")
        length = int.from_bytes(buf[4:HEADER_BYTES], "little")
        if length > self._op_bytes_max:
            self._fail(f"frame length {length} exceeds op_bytes_max {self._op_bytes_max}")
        if len(buf) < HEADER_BYTES + length:
            return None
        payload = bytes(buf[HEADER_BYTES:])
        try:
            op = RecordedOp.FromString(payload)
        except DecodeError as err:
            self._fail(f"malformed RecordedOp: {err}")
        if op.first_offset or op.last_offset or op.log:
            self._fail("a recorded op must not carry reader meta-fields (offsets, log)")
        if op.HasField("write") and (op.write.length < 0 or op.write.offset < 0):
            self._fail(f"write of negative length or offset: {op.write}")
        if op.HasField("write") and op.write.length > WRITE_BYTES_MAX:
            self._fail(f"write length {op.write.length} exceeds WRITE_BYTES_MAX {WRITE_BYTES_MAX}")
        first = self._offset
        op.first_offset = first
        op.last_offset = first + len(buf) + (op.write.length if op.HasField("write") else 0)
        op.log = self.log
        self._offset += len(buf)
        self._buf = bytearray()
        if op.HasField("write"):
            self._content_left = op.write.length
            self._content_offset = op.write.offset
        return DecodedOp(op, payload)

    def finish(self) -> None:
        """The input ended (at a write head the caller read through): raise if it ended inside
        an op or its content."""
        if self._failed is not None:
            raise self._failed
        if not self.at_op_boundary:
            self._fail("the log ends inside a recorded op or its write content")

    def _fail(self, reason: str) -> None:
        self._failed = CorruptLogError(self.log, self._offset, reason)
        raise self._failed
