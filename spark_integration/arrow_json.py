"""Arrow record batches to framed JSON-lines messages, in bulk (sans-IO).

A write task receives its rows as Arrow record batches (Spark's Arrow writers) and publishes
each row as a JSON object with a Gazette "UUID" field (rows.py says which object). Encoding row
by row in Python costs more than everything else a write does, so a batch is encoded column by
column with Arrow's compute kernels: each column becomes the JSON text of its values, the
UUIDs are formatted from their clocks with numpy, and one concatenation per row joins the
pieces into `{..., "UUID": "..."}\\n`. The framed messages of a batch are then one contiguous
buffer (`EncodedLines`), appended without ever becoming Python objects one by one.

The bulk path covers the usual column types (strings, integers, floats, booleans, decimals,
dates) and `content` columns of JSON objects; anything else (nested types, timestamps, binary)
is encoded value by value through Python, as rows.py does. Where the bulk path cannot be sure
to produce what rows.py would (content with a raw newline, a "UUID" field of its own, or
escapes), a batch falls back to rows.py's decode and re-encode of each content, which also
names the row that is not a JSON object.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from broker.protocol import labels as gl
from gazette_consumer.message.framing import MESSAGE_BYTES_MAX_DEFAULT
from gazette_consumer.message.protobuf_framing import HEADER_BYTES as PROTOBUF_HEADER_BYTES
from gazette_consumer.message.uuid import Flag, ProducerID
from spark_integration.raw_json import UUID_FIELD
from spark_integration.rows import GazetteRowError
from spark_integration.rows import _jsonable as jsonable

_HEX: Final = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
# `,"UUID":"` + 36 characters of UUID + `"}` + newline.
_UUID_HEAD: Final = f'"{UUID_FIELD}":"'.encode()
UUID_SUFFIX_BYTES: Final = 1 + len(_UUID_HEAD) + 36 + 3
_JSON_SPACE: Final = " \t\r\n"
_encode = msgspec.json.encode
_validate = msgspec.json.Decoder(list[msgspec.Raw]).decode


@dataclass(frozen=True)
class EncodedLines:
    """Framed messages: `data[offsets[i]:offsets[i + 1]]` is message i, newline included."""

    data: memoryview
    offsets: np.ndarray[Any, np.dtype[np.int64]]

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def nbytes(self) -> int:
        return int(self.offsets[-1] - self.offsets[0])

    def pieces(self, bytes_max: int) -> list[memoryview]:
        """The content cut at message boundaries into pieces of at most `bytes_max` bytes
        (a message longer than that is a piece of its own)."""
        offsets, out = self.offsets, []
        start, end = 0, len(offsets) - 1
        while start < end:
            # The last boundary within bytes_max of this piece's start (at least one message).
            stop = int(np.searchsorted(offsets, offsets[start] + bytes_max, side="right")) - 1
            stop = min(max(stop, start + 1), end)
            out.append(self.data[int(offsets[start]) : int(offsets[stop])])
            start = stop
        return out


def string_offsets(array: pa.Array) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """(offsets as int64, value bytes as uint8) of a string or binary array, without copying
    its bytes."""
    large = pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type)
    width = np.int64 if large else np.int32
    _validity, offsets_buffer, data_buffer = array.buffers()
    assert offsets_buffer is not None
    offsets = np.frombuffer(
        offsets_buffer, dtype=width, count=len(array) + 1, offset=array.offset * width().itemsize
    ).astype(np.int64)
    if data_buffer is None:
        return offsets, np.empty(0, dtype=np.uint8)
    return offsets, np.frombuffer(data_buffer, dtype=np.uint8)


def lines_of(array: pa.Array) -> EncodedLines:
    """The EncodedLines of a string array whose every value ends with a newline."""
    offsets, data = string_offsets(array)
    return EncodedLines(data.data, offsets)


def _hex_columns(
    out: np.ndarray[Any, Any], column: int, values: np.ndarray[Any, Any], n: int
) -> None:
    """Write `n` lowercase hex digits of each of `values` into out[:, column:column + n]."""
    for k in range(n):
        out[:, column + k] = _HEX[(values >> np.uint64(4 * (n - 1 - k))) & np.uint64(0xF)]


def uuid_suffixes(producer: ProducerID, first_clock: int, count: int, flags: Flag) -> pa.Array:
    """`,"UUID":"<uuid>"}` and a newline for clocks first_clock, first_clock + 1, ...: the
    text of `build_uuid(producer, clock, flags)`, formatted for all of them at once."""
    clocks = np.arange(count, dtype=np.uint64) + np.uint64(first_clock)
    template = b"," + _UUID_HEAD + b"00000000-0000-0000-0000-" + producer.hex().encode() + b'"}\n'
    assert len(template) == UUID_SUFFIX_BYTES
    out = np.tile(np.frombuffer(template, dtype=np.uint8), (count, 1))
    at = 1 + len(_UUID_HEAD)
    _hex_columns(out, at, (clocks >> np.uint64(4)) & np.uint64(0xFFFF_FFFF), 8)
    _hex_columns(out, at + 9, (clocks >> np.uint64(36)) & np.uint64(0xFFFF), 4)
    _hex_columns(
        out, at + 14, ((clocks >> np.uint64(52)) & np.uint64(0x0FFF)) | np.uint64(0x1000), 4
    )
    sequence = ((clocks & np.uint64(0xF)) << np.uint64(10)) | np.uint64(int(flags) | 0x8000)
    _hex_columns(out, at + 19, sequence, 4)
    offsets = np.arange(0, (count + 1) * UUID_SUFFIX_BYTES, UUID_SUFFIX_BYTES, dtype=np.int32)
    return pa.Array.from_buffers(
        pa.string(), count, [None, pa.py_buffer(offsets), pa.py_buffer(out.tobytes())]
    )


def _data_of(array: pa.Array) -> bytes:
    """The bytes of a string array's values (all of them, back to back)."""
    if len(array) == 0:
        return b""
    lines = lines_of(array)
    return bytes(lines.data[int(lines.offsets[0]) : int(lines.offsets[-1])])


def _has_control(data: bytes) -> bool:
    """Whether `data` holds a byte below 0x20 (which JSON strings must escape): a numpy
    reduction, some ten times faster than a regular expression's scan."""
    return bool(data) and int(np.frombuffer(data, dtype=np.uint8).min()) < 0x20


# -- values as JSON text ---------------------------------------------------------------------


def _python_value(data_type: pa.DataType) -> Callable[[Any], Any]:
    """Converts a value of `to_pylist()` to what rows.py would encode for it."""
    if pa.types.is_map(data_type):
        item = _python_value(data_type.item_type)
        return lambda v: None if v is None else {str(k): item(e) for k, e in v}
    if pa.types.is_struct(data_type):
        fields = [(f.name, _python_value(f.type)) for f in data_type]
        return lambda v: None if v is None else {n: c(v.get(n)) for n, c in fields}
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        element = _python_value(data_type.value_type)
        return lambda v: None if v is None else [element(e) for e in v]
    return jsonable


def _json_by_value(array: pa.Array) -> pa.Array:
    convert = _python_value(array.type)
    return pa.array([_encode(convert(v)).decode() for v in array.to_pylist()], pa.string())


def _json_strings(array: pa.Array) -> pa.Array:
    data = _data_of(array)
    # A string holding none of the bytes JSON escapes is quoted as it is (memchr scans).
    if _has_control(data):
        return _json_by_value(array)  # Rare: msgspec escapes control characters.
    if b"\\" in data:
        array = pc.replace_substring(array, "\\", "\\\\")
    if b'"' in data:
        array = pc.replace_substring(array, '"', '\\"')
    return pc.binary_join_element_wise('"', array, '"', "")


def plain_array(array: pa.Array | pa.ChunkedArray) -> pa.Array:
    """`array` as one array of plain values: chunks combined, a dictionary decoded."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    return array


def json_values(array: pa.Array) -> pa.Array:
    """The JSON text of each value of `array` (a string array; nulls as `null`)."""
    array = plain_array(array)
    t = array.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        out = _json_strings(array.cast(pa.string()))
    elif pa.types.is_integer(t):
        out = pc.cast(array, pa.string())
    elif pa.types.is_boolean(t):
        out = pc.if_else(array, "true", "false")
    elif pa.types.is_floating(t):
        # msgspec writes NaN and infinities as null (JSON has no such numbers).
        out = pc.if_else(
            pc.is_finite(array), pc.cast(array, pa.string()), pa.scalar(None, pa.string())
        )
    elif pa.types.is_decimal(t) or pa.types.is_date(t):
        # As text, as rows.py writes them (str(Decimal), date.isoformat()).
        out = pc.binary_join_element_wise('"', pc.cast(array, pa.string()), '"', "")
    elif pa.types.is_null(t):
        out = pa.nulls(len(array), pa.string())
    else:
        return _json_by_value(array)
    return pc.fill_null(out, "null")


def object_bodies(batch: pa.RecordBatch, columns: Sequence[str]) -> list[pa.Array | str]:
    """Pieces whose row-wise concatenation is `{"a":1,"b":"x"` (no closing brace) of the
    given columns of each row."""
    pieces: list[pa.Array | str] = []
    for index, name in enumerate(columns):
        key = _encode(name).decode()
        pieces.append(("{" if index == 0 else ",") + key + ":")
        pieces.append(json_values(batch.column(name)))
    if not pieces:
        pieces.append("{")
    return pieces


# -- content columns -------------------------------------------------------------------------


def _content_row_error(text: str) -> GazetteRowError:
    try:
        obj = msgspec.json.decode(text)
    except msgspec.DecodeError as err:
        return GazetteRowError(f"row's 'content' is not JSON: {err}: {text[:80]!r}")
    if not isinstance(obj, dict):
        return GazetteRowError(f"row's 'content' is not a JSON object: {text[:80]!r}")
    return GazetteRowError(f"row's 'content' could not be encoded: {text[:80]!r}")


def _content_by_value(content: pa.Array, suffixes: pa.Array) -> pa.Array:
    """rows.py's way: decode each content, set its UUID, encode it again."""
    out = []
    for text, suffix in zip(content.to_pylist(), suffixes.to_pylist(), strict=True):
        if text is None:
            raise GazetteRowError("row's 'content' column is null")
        try:
            obj = msgspec.json.decode(text)
        except msgspec.DecodeError:
            raise _content_row_error(text) from None
        if not isinstance(obj, dict):
            raise _content_row_error(text)
        obj[UUID_FIELD] = suffix[1 + len(_UUID_HEAD) : -3]
        out.append(_encode(obj).decode() + "\n")
    return pa.array(out, pa.string())


def content_lines(content: pa.Array, suffixes: pa.Array) -> pa.Array:
    """Each content (a JSON object, as text) with its UUID added, framed."""
    if isinstance(content, pa.ChunkedArray):
        content = content.combine_chunks()
    content = content.cast(pa.string())
    if content.null_count:
        raise GazetteRowError("row's 'content' column is null")
    data = _data_of(content)
    if b"\n" in data or b'"UUID"' in data or b"\\u" in data:
        return _content_by_value(content, suffixes)
    body = pc.utf8_rtrim(pc.utf8_ltrim(content, _JSON_SPACE), _JSON_SPACE)
    if not (pc.all(pc.starts_with(body, "{")).as_py() and pc.all(pc.ends_with(body, "}")).as_py()):
        return _content_by_value(content, suffixes)  # Names the row that is not an object.
    open_body = pc.utf8_rtrim(pc.utf8_slice_codeunits(body, 0, -1), _JSON_SPACE)
    # An empty object takes the UUID without the comma that separates it from other fields.
    comma = pc.if_else(pc.ends_with(open_body, "{"), "", ",")
    lines = pc.binary_join_element_wise(open_body, comma, pc.utf8_slice_codeunits(suffixes, 1), "")
    # Validate them all at once: as lines hold no raw newline, they are the elements of a
    # JSON array once newlines become commas. Any doubt, and rows.py's way names the row.
    framed = _data_of(lines)
    try:
        valid = len(_validate(b"[" + framed[:-1].replace(b"\n", b",") + b"]")) == len(content)
    except msgspec.DecodeError:
        valid = False
    if not valid:
        return _content_by_value(content, suffixes)
    return lines


# Per content type, how its readers name its framing, and the bytes of a frame around the
# message they bound: a JSON line's and a CSV record's newline, a protobuf message's header.
_FRAMING_OF: Final = {
    gl.CONTENT_TYPE_JSON_LINES: ("JSON-lines", 1),
    gl.CONTENT_TYPE_CSV: ("CSV", 1),
    gl.CONTENT_TYPE_PROTO_FIXED: ("protobuf", PROTOBUF_HEADER_BYTES),
}


def check_sizes(
    lines: EncodedLines,
    content_type: str = gl.CONTENT_TYPE_JSON_LINES,
    bytes_max: int = MESSAGE_BYTES_MAX_DEFAULT,
) -> None:
    """Refuse a message that readers of a journal of `content_type` would refuse (longer
    than their framing's bound, measured as they measure it), naming that framing."""
    if len(lines):
        name, frame_bytes = _FRAMING_OF[content_type]
        longest = int(np.max(np.diff(lines.offsets))) - frame_bytes
        if longest > bytes_max:
            raise GazetteRowError(
                f"a row encodes to a message of {longest} bytes, above the {bytes_max} bytes"
                f" {name} readers accept"
            )
