"""Gazette UUIDs as columns: many UUID texts parsed at once, and many formatted (sans-IO, numpy).

A Spark partition reads and writes hundreds of thousands of messages, each carrying its UUID as
text (`"UUID": "2f1e0c1a-1d2c-11ef-8000-0242ac120002"`). Parsing each with `uuid.UUID` costs
about 2 µs; here a batch of texts is one (n, 36) byte matrix and every step is a numpy
operation over it: the same validation `gazette_consumer.message.uuid` applies (RFC 4122
variant, version 1) and the same parts (ProducerID, clock, flags), for well under a tenth of it.

Only the canonical form is taken: 36 characters, lower-case hex, hyphens at 8, 13, 18 and 23,
which is how Gazette's writers (Go's and ours) format every UUID. `parse_texts` says which rows
it parsed; the caller sends the others (upper case, braces, invalid) down the general path,
which accepts what `uuid.UUID` accepts and names what it does not.

The clock of a UUID (`gazette_consumer.message.clock`): its 60-bit timestamp (100 ns units since
1582-10-15) from time_low, time_mid and time_hi, then the 4-bit sequence counter from the top of
clock_seq, whose low 10 bits are the flags.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from gazette_consumer.message.clock import G1582_NS100

UUID_TEXT_BYTES: Final = 36
_HYPHENS: Final = (8, 13, 18, 23)
_HEX_DIGITS: Final = b"0123456789abcdef"
_ZERO: Final = np.uint8(ord("0"))
_NINE_OFF: Final = np.uint8(9)
_LOWER_A: Final = np.uint8(ord("a"))
_LOWER_F_OFF: Final = np.uint8(5)
_ALL_TRUE: Final = np.uint64(0x0101_0101_0101_0101)  # Eight bools, all true.
_HEX_CHAR = np.frombuffer(_HEX_DIGITS, np.uint8)
# Columns of the 32 hex digits in the text, in order (the hyphens left out).
_DIGIT_COLUMNS: Final = np.array([i for i in range(UUID_TEXT_BYTES) if i not in _HYPHENS])
_U64 = np.uint64

U64Array = npt.NDArray[np.uint64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class UUIDColumns:
    """The parts of n UUIDs: `parsed` rows hold a canonical Gazette UUID (others are zero);
    `nil` rows hold the all-zero UUID, which means "no UUID"."""

    parsed: BoolArray
    nil: BoolArray
    producers: U64Array  # The 48-bit ProducerID (the node), as an integer.
    clocks: U64Array
    flags: npt.NDArray[np.uint16]


def parse_texts(texts: npt.NDArray[np.uint8]) -> UUIDColumns:
    """Parse an (n, 36) matrix of UUID texts (see the module docstring)."""
    n = len(texts)
    digits = np.ascontiguousarray(texts[:, _DIGIT_COLUMNS])
    # Lower-case hex digits by arithmetic, not a table: a table look-up of n x 32 bytes costs
    # several times these few passes ('0'-'9' are 0x30-0x39, 'a'-'f' 0x61-0x66; the
    # subtractions wrap below them). A row's 32 checks are read as four 8-byte words.
    valid = ((digits - _ZERO) <= _NINE_OFF) | ((digits - _LOWER_A) <= _LOWER_F_OFF)
    words = valid.view(np.uint64)
    ok = (words[:, 0] & words[:, 1] & words[:, 2] & words[:, 3]) == _ALL_TRUE
    nibbles = (digits & np.uint8(0xF)) + np.uint8(9) * (digits >> np.uint8(6))
    for column in _HYPHENS:
        ok &= texts[:, column] == ord("-")
    nibbles[~ok] = 0
    # Two hex digits a byte: the UUID's 16 bytes, read as two big-endian 64-bit halves.
    raw = np.ascontiguousarray((nibbles[:, 0::2] << 4) | nibbles[:, 1::2])
    halves = raw.view(">u8").reshape(n, 2).astype(_U64)
    high, low = halves[:, 0], halves[:, 1]
    time_low = high >> _U64(32)
    time_mid = (high >> _U64(16)) & _U64(0xFFFF)
    time_hi = high & _U64(0xFFFF)
    clock_seq = low >> _U64(48)
    node = low & _U64(0xFFFF_FFFF_FFFF)
    nil = ok & (high == 0) & (low == 0)
    parsed = ok & ((time_hi >> _U64(12)) == _U64(1)) & ((clock_seq >> _U64(14)) == _U64(0b10))
    clocks = (
        ((time_hi & _U64(0x0FFF)) << _U64(52))
        | (time_mid << _U64(36))
        | (time_low << _U64(4))
        | ((clock_seq >> _U64(10)) & _U64(0xF))
    )
    flags = (clock_seq & _U64(0x3FF)).astype(np.uint16)
    zero = ~parsed
    clocks[zero] = 0
    node[zero] = 0
    flags[zero] = 0
    return UUIDColumns(parsed, nil, node, clocks, flags)


def format_texts(producer: bytes, clocks: U64Array, flags: int) -> npt.NDArray[np.uint8]:
    """The (n, 36) canonical texts of `producer`'s UUIDs of `clocks`, all with `flags`: what
    `str(build_uuid(producer, clock, flags))` gives for each, at once."""
    n = len(clocks)
    clocks = clocks.astype(_U64, copy=False)
    time_low = (clocks >> _U64(4)) & _U64(0xFFFF_FFFF)
    time_mid = (clocks >> _U64(36)) & _U64(0xFFFF)
    time_hi = ((clocks >> _U64(52)) & _U64(0x0FFF)) | _U64(0x1000)
    clock_seq = ((clocks & _U64(0xF)) << _U64(10)) | _U64(flags) | _U64(0x8000)
    out = np.empty((n, UUID_TEXT_BYTES), np.uint8)
    column = 0
    for value, digits in ((time_low, 8), (time_mid, 4), (time_hi, 4), (clock_seq, 4)):
        for shift in range(digits - 1, -1, -1):
            out[:, column] = _HEX_CHAR[((value >> _U64(4 * shift)) & _U64(0xF)).astype(np.intp)]
            column += 1
        out[:, column] = ord("-")
        column += 1
    out[:, column:] = np.frombuffer(producer.hex().encode(), np.uint8)
    return out


def unix_micros(clocks: U64Array) -> npt.NDArray[np.int64]:
    """The timestamps of `clocks` as microseconds since the Unix epoch (Spark's TimestampType)."""
    units = (clocks >> _U64(4)).astype(np.int64) - np.int64(G1582_NS100)
    return units // 10


def clock_of_unix_micros(micros: int) -> int:
    """The smallest clock whose timestamp is at or after `micros` (Unix microseconds)."""
    return (micros * 10 + G1582_NS100) << 4
