"""Loaded YAML checked against the protobuf message it describes, before json_format reads it.

json_format.ParseDict would refuse many a malformed spec, but without the line, and some not
with its ParseError at all (`fragment: 5` is a TypeError deep inside). Here every field of the
message's YAML form is checked first, with Gazette's YAML conventions (those of its gazctl, whose
files ours must read):

- a field not in the message is an error (Gazette reads specs strictly);
- a message is a mapping; a repeated field a list; a LabelSet the bare list of ``{name, value}``
  Gazette writes (or the message's own ``{labels: [...]}``);
- a Duration is a Go duration string ("30s", "1h30m");
- an enum is one of its names (JournalSpec's ``flags`` may also be an integer, as in Gazette);
- an integer is an integer within its type's range, a bool ``true`` or ``false``, and a string a
  string (``value: 1`` must be quoted: YAML reads it as a number).

Each failure is a YamlInputError naming the field path and its line.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from broker.cli.strict_yaml import YamlInputError, line_of
from broker.protocol import protocol_pb2 as pb

_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(1 << 31), (1 << 31) - 1),
    FieldDescriptor.TYPE_SINT32: (-(1 << 31), (1 << 31) - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(1 << 31), (1 << 31) - 1),
    FieldDescriptor.TYPE_INT64: (-(1 << 63), (1 << 63) - 1),
    FieldDescriptor.TYPE_SINT64: (-(1 << 63), (1 << 63) - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(1 << 63), (1 << 63) - 1),
    FieldDescriptor.TYPE_UINT32: (0, (1 << 32) - 1),
    FieldDescriptor.TYPE_FIXED32: (0, (1 << 32) - 1),
    FieldDescriptor.TYPE_UINT64: (0, (1 << 64) - 1),
    FieldDescriptor.TYPE_FIXED64: (0, (1 << 64) - 1),
}
_FLOATS = (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE)
_DURATION = "google.protobuf.Duration"
_LABEL_SET = "protocol.LabelSet"
_LABEL_KEYS = frozenset({"name", "value"})
# JournalSpec.flags: an integer on the wire (a combination of JournalSpec.Flag values), which
# Gazette's YAML also takes as a Flag's name.
_FLAGS = "protocol.JournalSpec.flags"


def shown(value: Any) -> str:
    """A short rendering of a YAML value for a message."""
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_keys(
    node: Mapping[Any, Any], allowed: Collection[str], path: str, line: int | None
) -> None:
    """Every key of `node` is one of `allowed` (the first that is not is named, at its line)."""
    for key in node:
        if key not in allowed:
            raise YamlInputError(f"unknown field {key!r}", path, line=line_of(node, key) or line)


def check_message(
    node: Any,
    descriptor: Descriptor | Any,  # Any: the stubs' Message.DESCRIPTOR is a union of types.
    path: str,
    line: int | None = None,
    *,
    extra_keys: Collection[str] = (),
) -> None:
    """`node` is a valid YAML form of a `descriptor` message (None is an unset one). Keys in
    `extra_keys` are the caller's (e.g. a journal space's ``children``) and are not checked."""
    if node is None:
        return
    line = line_of(node) or line
    if not isinstance(node, Mapping):
        raise YamlInputError(f"must be a mapping (got {shown(node)})", path, line=line)
    fields = descriptor.fields_by_name
    check_keys(node, set(fields) | set(extra_keys), path, line)
    for key, value in node.items():
        if key in fields:
            check_field(value, fields[key], f"{path}.{key}", line_of(node, key) or line)


def check_field(value: Any, field: FieldDescriptor, path: str, line: int | None) -> None:
    if value is None:
        return  # Unset, as in Gazette (a YAML null is the zero value).
    if field.is_repeated:
        if not isinstance(value, list):
            raise YamlInputError(f"must be a list (got {shown(value)})", path, line=line)
        for index, item in enumerate(value):
            _check_single(item, field, f"{path}[{index}]", line_of(value, index) or line)
    else:
        _check_single(value, field, path, line)


def _check_single(value: Any, field: FieldDescriptor, path: str, line: int | None) -> None:
    kind = field.type
    message, enum = field.message_type, field.enum_type
    if message is not None:
        name = message.full_name
        if name == _DURATION:
            if not isinstance(value, str):
                raise YamlInputError(
                    f"must be a duration like '30s' or '1h' (got {shown(value)})", path, line=line
                )
        elif name == _LABEL_SET:
            check_label_set(value, path, line)
        else:
            check_message(value, message, path, line)
    elif enum is not None:
        _check_enum(value, list(enum.values_by_name), path, line)
    elif field.full_name == _FLAGS:
        if _is_int(value):
            _check_int(value, kind, path, line)
        else:
            _check_enum(value, list(pb.JournalSpec.Flag.keys()), path, line, integers=True)
    elif kind == FieldDescriptor.TYPE_BOOL:
        if not isinstance(value, bool):
            raise YamlInputError(f"must be true or false (got {shown(value)})", path, line=line)
    elif kind in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES):
        if not isinstance(value, str):
            raise YamlInputError(
                f"must be a string (got {shown(value)}; quote it if it is one)", path, line=line
            )
    elif kind in _FLOATS:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise YamlInputError(f"must be a number (got {shown(value)})", path, line=line)
    else:
        _check_int(value, kind, path, line)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(value: Any, kind: int, path: str, line: int | None) -> None:
    if not _is_int(value):
        raise YamlInputError(f"must be an integer (got {shown(value)})", path, line=line)
    low, high = _INT_RANGES[kind]
    if not low <= value <= high:
        raise YamlInputError(f"must be in [{low}, {high}] (got {value})", path, line=line)


def _check_enum(
    value: Any, names: list[str], path: str, line: int | None, *, integers: bool = False
) -> None:
    if not isinstance(value, str) or value not in names:
        choices = ", ".join(names) + (" or an integer" if integers else "")
        raise YamlInputError(f"must be one of {choices} (got {shown(value)})", path, line=line)


def check_label_set(value: Any, path: str, line: int | None) -> None:
    """Gazette's bare list of ``{name, value}`` mappings, or ``{labels: [...]}``."""
    if isinstance(value, Mapping):
        check_keys(value, ("labels",), path, line)
        line = line_of(value, "labels") or line
        value = value.get("labels")
        path = f"{path}.labels"
        if value is None:
            return
    if not isinstance(value, list):
        raise YamlInputError(f"must be a list of labels (got {shown(value)})", path, line=line)
    for index, label in enumerate(value):
        where, label_line = f"{path}[{index}]", line_of(value, index) or line
        if not isinstance(label, Mapping):
            raise YamlInputError(f"must be a mapping (got {shown(label)})", where, line=label_line)
        check_keys(label, _LABEL_KEYS, where, label_line)
        for key in _LABEL_KEYS & set(label):
            if label[key] is not None and not isinstance(label[key], str):
                raise YamlInputError(
                    f"must be a string (got {shown(label[key])}; quote it if it is one)",
                    f"{where}.{key}",
                    line=line_of(label, key) or label_line,
                )
