"""Arrow record batches to fixed-framed protobuf messages (sans-IO).

A write to an `application/x-protobuf-fixed` journal encodes each row as one message of the
class option `protobufClass` names ("module:Class", as reads take it: framings.py), framed as
Gazette frames protobuf (gazette_consumer.message.protobuf_framing: magic word, little-endian
length, payload). Each column sets the message field of its name; a null leaves the field
unset. The data source sets the message's Gazette UUID in the field where readers find it
(framings.uuid_of_protobuf): a string field `uuid` (or `UUID`), or a `uuid` message field with
Gazette's UUIDParts (`node`: the ProducerID and flags, `clock`). An ACK is a message with its
UUID alone.

What can be checked from types is checked before anything is written (`check_columns`: on the
driver, from the DataFrame's schema): every column must name a scalar field of the message
(nested messages, repeated and map fields are not written), of a type that fits (integers for
integer and enum fields, numbers for floating ones, strings, binary, booleans), and the UUID
field is the data source's. What only a value shows (an integer out of the field's range) fails
the task with `GazetteRowError` naming the column and the row; the write then commits nothing.

Encoding is per message (the protobuf runtime has no columnar encoder): each column is turned
into Python values once, a batch at a time, and each message built from them in one call.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Sequence
from typing import Any, Final

import pyarrow as pa
from google.protobuf.descriptor import FieldDescriptor

from gazette_consumer.message.protobuf_framing import encode_header
from gazette_consumer.message.uuid import get_clock, get_flags, get_producer_id
from spark_integration.options import GazetteOptionError
from spark_integration.rows import GazetteRowError

UUID_FIELDS: Final = ("uuid", "UUID")
_INTEGER_CPP: Final = frozenset(
    (
        FieldDescriptor.CPPTYPE_INT32,
        FieldDescriptor.CPPTYPE_INT64,
        FieldDescriptor.CPPTYPE_UINT32,
        FieldDescriptor.CPPTYPE_UINT64,
    )
)
_FLOAT_CPP: Final = frozenset((FieldDescriptor.CPPTYPE_DOUBLE, FieldDescriptor.CPPTYPE_FLOAT))


class GazetteColumnError(GazetteRowError):
    """A column whose values cannot be written to a protobuf journal's messages (`column`)."""

    def __init__(self, column: str, message: str) -> None:
        self.column = column
        super().__init__(message)


@functools.cache
def message_class(class_path: str) -> Any:
    """The protobuf message class `class_path` ("module:Class") names."""
    module_name, _, name = class_path.partition(":")
    if not module_name or not name:
        raise GazetteOptionError("protobufClass", f"must be 'module:Class' (got {class_path!r})")
    try:
        cls = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as err:
        raise GazetteOptionError(
            "protobufClass", f"{class_path!r} cannot be imported: {err}"
        ) from None
    if getattr(cls, "DESCRIPTOR", None) is None or not callable(
        getattr(cls, "SerializeToString", None)
    ):
        raise GazetteOptionError("protobufClass", f"{class_path!r} is not a protobuf message class")
    return cls


def uuid_field(class_path: str) -> FieldDescriptor:
    """The field of `class_path`'s messages that holds the Gazette UUID (module docstring)."""
    fields = message_class(class_path).DESCRIPTOR.fields_by_name
    for name in UUID_FIELDS:
        field = fields.get(name)
        if field is None or field.is_repeated:
            continue
        if field.type == FieldDescriptor.TYPE_STRING:
            return field
        parts = field.message_type
        if parts is not None and {"node", "clock"} <= set(parts.fields_by_name):
            return field
    raise GazetteOptionError(
        "protobufClass",
        f"{class_path}: no field to hold the Gazette UUID (readers find it in a string field"
        " 'uuid' or 'UUID', or a 'uuid' field of Gazette's UUIDParts)",
    )


def _fits(field: FieldDescriptor, t: pa.DataType) -> bool:
    if pa.types.is_null(t):
        return True
    cpp = field.cpp_type
    if cpp in _INTEGER_CPP:
        return pa.types.is_integer(t)
    if cpp in _FLOAT_CPP:
        return pa.types.is_integer(t) or pa.types.is_floating(t)
    if cpp == FieldDescriptor.CPPTYPE_BOOL:
        return pa.types.is_boolean(t)
    if cpp == FieldDescriptor.CPPTYPE_ENUM:
        return pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
    if field.type == FieldDescriptor.TYPE_BYTES:
        return pa.types.is_binary(t) or pa.types.is_large_binary(t)
    if cpp == FieldDescriptor.CPPTYPE_STRING:
        return pa.types.is_string(t) or pa.types.is_large_string(t)
    return False


def check_columns(journal: str, class_path: str, schema: pa.Schema, columns: Sequence[str]) -> None:
    """Refuse `columns` (of `schema`) that cannot make messages of `class_path` (module
    docstring), naming the column."""
    descriptor = message_class(class_path).DESCRIPTOR
    uuid = uuid_field(class_path)
    for name in columns:
        field = descriptor.fields_by_name.get(name)
        t = schema.field(name).type
        where = f"journal {journal!r} ({class_path}): column {name!r}"
        if field is None:
            raise GazetteColumnError(
                name,
                f"{where}: {descriptor.full_name} has no field {name!r} (fields:"
                f" {', '.join(f.name for f in descriptor.fields)})",
            )
        if field.name == uuid.name:
            raise GazetteColumnError(name, f"{where}: the message's UUID is set by the data source")
        if field.is_repeated or field.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE:
            raise GazetteColumnError(
                name,
                f"{where}: field {name!r} is a repeated, map or message field: writes set"
                " scalar fields only",
            )
        if not _fits(field, t):
            raise GazetteColumnError(
                name,
                f"{where} is of type {t}, and field {name!r} of {descriptor.full_name} is"
                f" {_type_name(field)}: cast the column, or write another",
            )


def _type_name(field: FieldDescriptor) -> str:
    names = {v: k for k, v in vars(FieldDescriptor).items() if k.startswith("TYPE_")}
    return str(names.get(field.type, field.type)).removeprefix("TYPE_").lower()


def _set_uuid(message: Any, field: FieldDescriptor, uuid_text: str) -> None:
    if field.type == FieldDescriptor.TYPE_STRING:
        setattr(message, field.name, uuid_text)
        return
    from uuid import UUID

    uuid = UUID(uuid_text)
    parts = getattr(message, field.name)
    parts.node = int.from_bytes(bytes(get_producer_id(uuid)), "big") << 16 | int(get_flags(uuid))
    parts.clock = get_clock(uuid)


def _framed(message: Any) -> bytes:
    payload = message.SerializeToString()
    return encode_header(len(payload)) + payload


def ack_frame(class_path: str, uuid_text: str) -> bytes:
    """The framed message of `class_path` holding the UUID `uuid_text` alone."""
    message = message_class(class_path)()
    _set_uuid(message, uuid_field(class_path), uuid_text)
    return _framed(message)


def protobuf_frames(
    batch: pa.RecordBatch, columns: Sequence[str], class_path: str, uuids: pa.Array
) -> pa.Array:
    """The framed message of each row of `batch` (a binary array): `columns` set their fields,
    `uuids` (text) the UUID field."""
    cls = message_class(class_path)
    field = uuid_field(class_path)
    values = [batch.column(name).to_pylist() for name in columns]
    out: list[bytes] = []
    for row, (uuid_text, *row_values) in enumerate(zip(uuids.to_pylist(), *values, strict=True)):
        given = {n: v for n, v in zip(columns, row_values, strict=True) if v is not None}
        try:
            message = cls(**given)
        except (TypeError, ValueError) as err:
            raise _row_error(cls, given, row, err) from None
        _set_uuid(message, field, uuid_text)
        out.append(_framed(message))
    return pa.array(out, pa.binary())


def _row_error(cls: Any, given: dict[str, Any], row: int, err: Exception) -> GazetteRowError:
    """The error of the first column of `given` whose value the message refuses."""
    for name, value in given.items():
        try:
            cls(**{name: value})
        except (TypeError, ValueError) as field_err:
            return GazetteColumnError(
                name,
                f"column {name!r}: value {value!r} of row {row} of the batch cannot be set in"
                f" {cls.DESCRIPTOR.full_name}.{name}: {field_err}",
            )
    return GazetteRowError(f"row {row} of the batch cannot be encoded: {err}")
