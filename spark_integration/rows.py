"""DataFrame rows of read messages, and the JSON values of rows to publish.

A read message becomes a row of the metadata columns (`META_SCHEMA`): its journal, the offset it
begins at, its UUID and the UUID's producer (hex) and clock, and the JSON line itself. With a
user schema, each field of that name is a metadata column and every other field is read from
the message's JSON object; with option("format", "json") and no schema, the message fields are
inferred from a sample (`infer_schema`). A value that does not fit its field's type reads as
null, as Spark's own JSON reader does in its default (permissive) mode.

Writing, a row is published as a JSON object: its "content" column (a JSON object, as text) if
the DataFrame has one, else all its columns, each value as `_jsonable` makes it (arrow_json.py
encodes whole record batches so); a "journal" column, when it routes rows, is left out of the
object.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import msgspec
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from spark_integration.raw_json import UUID_FIELD

META_SCHEMA: Final = StructType(
    [
        StructField("journal", StringType(), False),
        StructField("offset", LongType(), False),
        StructField("uuid", StringType(), True),
        StructField("producer", StringType(), True),
        StructField("clock", LongType(), True),
        StructField("timestamp", TimestampType(), True),
        StructField("content", StringType(), False),
    ]
)
# The journal's labels (arrow_rows.py): a column of this name is a MAP<STRING, STRING> of them
# all, or a STRUCT of STRING fields, one per label wanted.
LABELS_COLUMN: Final = "labels"
LABELS_FIELD: Final = StructField(LABELS_COLUMN, MapType(StringType(), StringType()), False)
META_NAMES: Final = frozenset((*META_SCHEMA.fieldNames(), LABELS_COLUMN))
# Messages sampled to infer the fields of option("format", "json") without a schema.
infer_samples_max: Final = 1000

_json_decode = msgspec.json.decode
_json_encode = msgspec.json.encode


class GazetteRowError(ValueError):
    """A row that cannot be published (no JSON object, no journal)."""


def converter(data_type: DataType) -> Callable[[Any], Any]:
    """Converts a decoded JSON value to `data_type`'s Python form, or None if it does not fit."""
    if isinstance(data_type, StringType):
        return lambda v: v if isinstance(v, str) or v is None else _json_encode(v).decode()
    if isinstance(data_type, LongType | IntegerType | ShortType | ByteType):
        return _to_int
    if isinstance(data_type, DoubleType | FloatType):
        return lambda v: (
            float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None
        )
    if isinstance(data_type, BooleanType):
        return lambda v: v if isinstance(v, bool) else None
    if isinstance(data_type, DecimalType):
        return _to_decimal
    if isinstance(data_type, TimestampType | TimestampNTZType):
        return _to_timestamp
    if isinstance(data_type, DateType):
        return _to_date
    if isinstance(data_type, StructType):
        fields = [(f.name, converter(f.dataType)) for f in data_type.fields]
        return lambda v: tuple(c(v.get(n)) for n, c in fields) if isinstance(v, dict) else None
    if isinstance(data_type, ArrayType):
        element = converter(data_type.elementType)
        return lambda v: [element(e) for e in v] if isinstance(v, list) else None
    if isinstance(data_type, MapType):
        value = converter(data_type.valueType)
        return lambda v: {k: value(e) for k, e in v.items()} if isinstance(v, dict) else None
    return lambda v: v


def _to_int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return None


def _to_decimal(v: Any) -> decimal.Decimal | None:
    if isinstance(v, int | float | str) and not isinstance(v, bool):
        try:
            return decimal.Decimal(str(v))
        except decimal.InvalidOperation:
            return None
    return None


def _to_timestamp(v: Any) -> dt.datetime | None:
    try:
        if isinstance(v, str):
            return dt.datetime.fromisoformat(v)
        if isinstance(v, int | float) and not isinstance(v, bool):
            return dt.datetime.fromtimestamp(v, dt.UTC)
    except (ValueError, OverflowError, OSError):
        return None
    return None


def _to_date(v: Any) -> dt.date | None:
    try:
        return dt.date.fromisoformat(v) if isinstance(v, str) else None
    except ValueError:
        return None


def _type_of(values: list[Any]) -> DataType:
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, bool) for v in present):
        return BooleanType()
    if present and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return LongType()
    if present and all(isinstance(v, int | float) and not isinstance(v, bool) for v in present):
        return DoubleType()
    return StringType()  # Text, mixed, nested values (as JSON text) or only nulls.


def infer_schema(lines: Iterable[bytes]) -> StructType:
    """The metadata columns, then the top-level fields of sampled JSON objects in order of
    first appearance (booleans, longs, doubles, else strings)."""
    seen: dict[str, list[Any]] = {}
    for line in lines:
        try:
            fields = _json_decode(line)
        except msgspec.DecodeError:
            continue
        if isinstance(fields, dict):
            for name, value in fields.items():
                if name != UUID_FIELD and name not in META_NAMES:
                    seen.setdefault(name, []).append(value)
    extra = [StructField(name, _type_of(values), True) for name, values in seen.items()]
    return StructType([*META_SCHEMA.fields, *extra])


# -- writing -----------------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    """A Row value as JSON: nested Rows are objects, dates and decimals text."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dt.date | dt.datetime):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray):
        return value.hex()
    return value
