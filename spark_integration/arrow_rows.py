"""Read messages as Arrow record batches of the DataFrame's schema, a MessageBatch at a time.

Spark's Python data source API takes `pyarrow.RecordBatch`es from `read()` and hands them to
the JVM as they are, so a partition never builds a Python object per row for Spark: each
column is built from the batch's columns at once.

Metadata columns (rows.py's META_NAMES): `journal` (the journal's name, repeated), `offset`,
`uuid`, `producer` (the UUID's node, hex), `clock`, `timestamp` (the clock's time, UTC),
`content` (the message as written), and `labels`: the journal's labels, as a MAP<STRING,
STRING>, or a STRUCT of STRING fields naming the labels wanted (a label with several values
reads as its values joined by ","). `uuid`, `producer`, `clock` and `timestamp` are null for a
message without a UUID.

Every other field of the schema is read from the message: for JSON lines, the top-level field
of that name of the message's object, parsed by Arrow's JSON reader for the whole batch at once;
when it cannot take the batch (a value that does not fit its field's type: Spark's permissive
JSON reads it as null, which Arrow's reader refuses), the batch is parsed message by message,
values that do not fit reading as null (rows.py's converters). For CSV, the fields after the
UUID, in the schema's order. For protobuf, the fields of the message, by name.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BooleanType,
    ByteType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StructField,
    StructType,
)

from spark_integration.message_batch import MessageBatch
from spark_integration.rows import META_NAMES, converter
from spark_integration.uuid_columns import unix_micros

# Parses the non-metadata fields of a message's payload into a dict (None: no fields).
PayloadFields = Callable[[Any], Mapping[str, Any] | Sequence[Any] | None]

_json_decode = msgspec.json.decode


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark expects of `schema`'s record batches."""
    return to_arrow_schema(schema, timezone="UTC")


def text_converter(data_type: DataType) -> Callable[[Any], Any]:
    """`converter` of text values (CSV fields): integers, floats and booleans are parsed from
    their text ("" or text that does not parse reads as null); other types as `converter`."""
    inner = converter(data_type)
    if isinstance(data_type, LongType | IntegerType | ShortType | ByteType):
        parse: Callable[[str], Any] = int
    elif isinstance(data_type, DoubleType | FloatType):
        parse = float
    elif isinstance(data_type, BooleanType):
        return lambda v: (
            {"true": True, "false": False}.get(v.lower()) if isinstance(v, str) else None
        )
    else:
        return inner

    def convert(v: Any) -> Any:
        if isinstance(v, str):
            try:
                v = parse(v.strip())
            except ValueError:
                return None
        return inner(v)

    return convert


def label_value(labels: Sequence[tuple[str, str]], name: str) -> str | None:
    values = [v for n, v in labels if n == name]
    return ",".join(values) if values else None


class RecordBatchBuilder:
    """Builds the record batches of one partition's journal (see the module docstring).
    `labels` are the journal's labels (None: unknown, in store mode; then the schema must not
    ask for them). `payload` is "json", "csv" or "protobuf"."""

    def __init__(
        self,
        schema: StructType,
        labels: Sequence[tuple[str, str]] | None,
        *,
        payload: str = "json",
        protobuf_fields: PayloadFields | None = None,
    ) -> None:
        self.schema = schema
        self.arrow = arrow_schema(schema)
        self._labels = labels
        self._payload = payload
        self._protobuf_fields = protobuf_fields
        self._fields = [f for f in schema.fields if f.name not in META_NAMES]
        self._fields_arrow = arrow_schema(StructType(self._fields)) if self._fields else None
        # CSV fields are text: numbers and booleans are parsed from it first.
        convert = text_converter if payload == "csv" else converter
        self._converters = [convert(f.dataType) for f in self._fields]
        self._constants: dict[str, pa.Array] = {}

    def build(self, batch: MessageBatch) -> pa.RecordBatch:
        n = len(batch)
        has_uuid = np.asarray(batch.uuids.is_valid())
        no_uuid = None if bool(has_uuid.all()) else ~has_uuid
        parsed = self._parse(batch) if self._fields else {}
        arrays: list[pa.Array] = []
        for field, arrow_field in zip(self.schema.fields, self.arrow, strict=True):
            name = field.name
            if name == "journal":
                array = self._constant(name, batch.journal, arrow_field.type, n)
            elif name == "offset":
                array = pa.array(batch.begins, pa.int64())
            elif name == "uuid":
                array = batch.uuids
            elif name == "producer":
                # The texts are canonical (ASCII) UUIDs: a slice of bytes is a slice of
                # characters, by views of the same buffers (~8x faster than a string slice).
                array = pc.binary_slice(batch.uuids.view(pa.binary()), 24, 36).view(pa.string())
            elif name == "clock":
                array = pa.array(batch.clocks.view(np.int64), pa.int64(), mask=no_uuid)
            elif name == "timestamp":
                array = pa.array(unix_micros(batch.clocks), arrow_field.type, mask=no_uuid)
            elif name == "content":
                array = batch.content
            elif name == "labels":
                array = self._labels_column(field, arrow_field.type, n)
            else:
                array = parsed[name]
            if array.type != arrow_field.type:
                array = array.cast(arrow_field.type)
            arrays.append(array)
        return pa.RecordBatch.from_arrays(arrays, schema=self.arrow)

    def _constant(self, key: str, value: Any, arrow_type: pa.DataType, n: int) -> pa.Array:
        """`value` repeated `n` times: a slice of an array built once (doubled when a batch is
        longer), not built again for each batch."""
        repeated = self._constants.get(key)
        if repeated is None or len(repeated) < n:
            size = max(n, 2 * len(repeated) if repeated is not None else n)
            one = pa.array([value], arrow_type)
            repeated = self._constants[key] = one.take(pa.array(np.zeros(size, np.int32)))
        return repeated.slice(0, n)

    def _labels_column(self, field: StructField, arrow_type: pa.DataType, n: int) -> pa.Array:
        labels = self._labels
        if labels is None:
            raise ValueError("the labels of the journal are not known (store mode)")
        if isinstance(field.dataType, MapType):
            names = sorted({name for name, _ in labels})
            value: Any = [(name, label_value(labels, name)) for name in names]
        else:
            assert isinstance(field.dataType, StructType)  # Checked by the options.
            value = {f.name: label_value(labels, f.name) for f in field.dataType.fields}
        return self._constant("labels", value, arrow_type, n)

    # -- message fields ------------------------------------------------------------------------

    def _parse(self, batch: MessageBatch) -> dict[str, pa.Array]:
        if self._payload == "json":
            parsed = self._parse_json_bulk(batch)
            if parsed is not None:
                return parsed
        return self._parse_one_by_one(batch)

    def _parse_json_bulk(self, batch: MessageBatch) -> dict[str, pa.Array] | None:
        n = len(batch)
        if n == 0:
            return None
        lines = pc.binary_join_element_wise(batch.content, "\n", "")
        offsets = np.frombuffer(lines.buffers()[1], np.int32, n + 1, lines.offset * 4)
        data = lines.buffers()[2]
        text = data.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
        assert self._fields_arrow is not None  # Only called with fields to parse.
        try:
            table = pa_json.read_json(
                io.BytesIO(text.to_pybytes()),
                read_options=pa_json.ReadOptions(
                    use_threads=False, block_size=max(1 << 20, len(text) + 1)
                ),
                parse_options=pa_json.ParseOptions(
                    explicit_schema=self._fields_arrow,
                    unexpected_field_behavior="ignore",
                    newlines_in_values=False,
                ),
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return None
        if table.num_rows != n:
            return None
        out = {}
        for field, arrow_field in zip(self._fields, self._fields_arrow, strict=True):
            column = table.column(field.name).combine_chunks()
            if column.type != arrow_field.type:
                return None
            out[field.name] = column
        return out

    def _parse_one_by_one(self, batch: MessageBatch) -> dict[str, pa.Array]:
        values: list[list[Any]] = [[] for _ in self._fields]
        names = [f.name for f in self._fields]
        fields_of = self._fields_of
        for payload in batch.content.to_pylist():
            fields = fields_of(payload)
            if isinstance(fields, Mapping):
                for column, name, convert in zip(values, names, self._converters, strict=True):
                    column.append(convert(fields.get(name)))
            elif isinstance(fields, Sequence):
                for i, (column, convert) in enumerate(zip(values, self._converters, strict=True)):
                    column.append(convert(fields[i] if i < len(fields) else None))
            else:
                for column in values:
                    column.append(None)
        assert self._fields_arrow is not None
        return {
            name: pa.array(column, arrow_field.type)
            for name, column, arrow_field in zip(names, values, self._fields_arrow, strict=True)
        }

    def _fields_of(self, payload: Any) -> Mapping[str, Any] | Sequence[Any] | None:
        if self._payload == "json":
            try:
                fields = _json_decode(payload)
            except msgspec.DecodeError:
                return None
            return fields if isinstance(fields, dict) else None
        if self._payload == "csv":
            from gazette_consumer.message.csv_framing import CSVSyntaxError, parse_record

            try:
                return parse_record(payload)[1:]  # The first field is the UUID.
            except CSVSyntaxError:
                return None
        assert self._protobuf_fields is not None
        return self._protobuf_fields(payload)
