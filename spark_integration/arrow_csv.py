"""Arrow record batches to framed CSV records, in bulk (sans-IO).

A write to a `text/csv` journal publishes each row as one CSV record framed as Gazette frames
CSV (gazette_consumer.message.csv_framing, Go's `encoding/csv` defaults): its first field is the
message's UUID (Gazette's CSVRecord), then one field per column of the row, in the DataFrame's
column order. There is no header record: Gazette's CSV framing has none, and a reader maps
fields to columns by position. Every record of a journal must have as many fields as the first
one a reader sees, so every write to a journal must write the same columns.

Values as text: strings as they are, integers and decimals in decimal, floats as Arrow formats
them (Python's `float` parses them back), booleans `true` / `false`, dates ISO 8601; timestamps,
binary (hex) and nested values as the JSON-lines writer writes them (rows.py's `_jsonable`,
nested ones as JSON text). A null is an empty field (CSV cannot tell it from an empty string).
A field is quoted exactly when Go's csv.Writer quotes it (`encode_record`), which test_arrow_csv
checks value by value.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from spark_integration.arrow_json import plain_array
from spark_integration.rows import _jsonable as jsonable

# What makes Go's csv.Writer quote a field: a comma, quote, CR or LF anywhere, a leading
# Unicode space (Go's unicode.IsSpace: csv_framing._GO_SPACE), or the whole field being `\.`.
_GO_SPACE_CLASS: Final = (
    r"\t\n\x{0B}\x{0C}\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}"
    r"\x{3000}"
)
_NEEDS_QUOTES: Final = rf'[,"\r\n]|^[{_GO_SPACE_CLASS}]|^\\\.$'


def _text_by_value(array: pa.Array) -> pa.Array:
    """Values Arrow cannot cast to text, as the JSON-lines writer writes them (strings as they
    are, anything nested as JSON text)."""

    def text(value: Any) -> str | None:
        if value is None:
            return None
        value = jsonable(value)
        return value if isinstance(value, str) else msgspec.json.encode(value).decode()

    return pa.array([text(v) for v in array.to_pylist()], pa.string())


def field_texts(array: pa.Array) -> pa.Array:
    """The unquoted text of each value of `array` (a string array; nulls as "")."""
    array = plain_array(array)
    t = array.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        out = array.cast(pa.string())
    elif pa.types.is_boolean(t):
        out = pc.if_else(array, "true", "false")
    elif (
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_decimal(t)
        or pa.types.is_date(t)
    ):
        out = pc.cast(array, pa.string())
    elif pa.types.is_null(t):
        out = pa.nulls(len(array), pa.string())
    else:
        out = _text_by_value(array)
    return pc.fill_null(out, "")


def quoted(texts: pa.Array) -> pa.Array:
    """Each text as a CSV field: quoted (inner quotes doubled) where Go would quote it."""
    needs = pc.match_substring_regex(texts, _NEEDS_QUOTES)
    if not pc.any(needs).as_py():
        return texts
    escaped = pc.binary_join_element_wise('"', pc.replace_substring(texts, '"', '""'), '"', "")
    return pc.if_else(needs, escaped, texts)


def csv_lines(batch: pa.RecordBatch, columns: Sequence[str], uuids: pa.Array) -> pa.Array:
    """The framed record of each row: its UUID (`uuids`, text), then `columns`' fields."""
    pieces: list[pa.Array | str] = [uuids]
    for name in columns:
        pieces.append(",")
        pieces.append(quoted(field_texts(batch.column(name))))
    pieces.append("\n")
    return pc.binary_join_element_wise(*pieces, "")
