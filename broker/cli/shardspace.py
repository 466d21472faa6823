"""Shard specs as YAML, the way Gazette's ``gazctl shards apply`` reads and ``shards list
--format yaml`` writes them (Gazette's shardspace): a ``common`` spec that every shard inherits,
and the ``shards`` themselves, each with what differs::

    common:
      max_txn_duration: 1s
      hot_standbys: 1
      labels:
      - name: app.gazette.dev/managed-by
        value: word-count
    shards:
    - id: counter-000
      sources:
      - journal: examples/words/part-000
      revision: 0          # expected etcd mod revision: 0 creates; -1 does not check
    - id: counter-001
      delete: true
      revision: 1234

A shard's spec is the common one, with each field the shard sets to a non-zero value taking its
place (labels are the union of both), as Gazette pushes common fields down: so ``disable: false``
cannot undo a common ``disable: true``. ``revision`` is the mod revision the change expects
(omitted: 0, the shard must not exist yet); ``delete: true`` deletes the shard; ``comment`` is
for people. Durations are Go durations (``1s``, ``500ms``, ``1m30s``).

Documents are read strictly, as Gazette's gazctl reads them (strict_yaml.py, yaml_shape.py): a
repeated key, an unknown field or a value of the wrong type is an error naming its line and
field path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format

from broker.cli.journalspace import check_stored_durations, format_go_duration, parse_go_duration
from broker.cli.strict_yaml import YamlInputError, line_of, load_yaml
from broker.cli.yaml_shape import check_keys, check_message, shown
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import labels as gl
from broker.protocol.validate import ValidationError, validate_shard_spec

# More shards than this in one document is refused: a generated typo should not go far (and
# Apply takes at most 128 changes per transaction anyway).
shards_max = 10_000

_DURATIONS = ("max_txn_duration", "min_txn_duration")
_SPEC_FIELDS = frozenset(f.name for f in cpb.ShardSpec.DESCRIPTOR.fields)
_CHANGE_KEYS = frozenset({"comment", "delete", "revision"})


class ShardSpaceError(YamlInputError):
    """The shard-space document is malformed; the message names the shard, the field and (when
    known) the line."""

    def __init__(self, path: str, rule: str, *, line: int | None = None) -> None:
        super().__init__(rule, *((path,) if path else ()), line=line)


@dataclass(frozen=True, slots=True)
class ShardChange:
    """One shard of a shard space: its full spec (None when deleted), the revision the change
    expects, and its comment."""

    id: str
    spec: cpb.ShardSpec | None
    revision: int
    comment: str = ""

    def to_change(self) -> cpb.ApplyRequest.Change:
        if self.spec is None:
            return cpb.ApplyRequest.Change(delete=self.id, expect_mod_revision=self.revision)
        return cpb.ApplyRequest.Change(upsert=self.spec, expect_mod_revision=self.revision)


# --- Specs and YAML mappings ------------------------------------------------------------------


def _spec_from_yaml(fields: Mapping[str, Any], path: str, node: Any = None) -> cpb.ShardSpec:
    """A ShardSpec of a shard space's mapping (`fields`, of the loaded `node`), which
    `check_message` accepted."""
    node = fields if node is None else node
    doc = dict(fields)
    for name in _DURATIONS:
        if doc.get(name) is not None:
            try:
                seconds = parse_go_duration(doc[name], f"{path}.{name}")
            except ValidationError as exc:
                raise ShardSpaceError(
                    f"{path}.{name}", exc.rule, line=line_of(fields, name)
                ) from None
            doc[name] = f"{seconds:.9f}s"
    if isinstance(doc.get("labels"), list):
        doc["labels"] = {"labels": doc["labels"]}
    spec = cpb.ShardSpec()
    try:
        json_format.ParseDict(doc, spec, ignore_unknown_fields=False)
    except json_format.ParseError as exc:
        # Not expected after check_message; kept so that nothing reaches the user as a trace.
        message = " ".join(str(exc).split())
        raise ShardSpaceError(
            path, f"is not a valid shard spec: {message}", line=line_of(node)
        ) from None
    return spec


def _check_durations(spec: cpb.ShardSpec) -> None:
    check_stored_durations("shard", spec.id, {name: getattr(spec, name) for name in _DURATIONS})


def spec_to_yaml(spec: cpb.ShardSpec) -> dict[str, Any]:
    """A (possibly partial) ShardSpec as a shard-space mapping: set fields only, Go durations,
    labels as a list."""
    _check_durations(spec)
    doc: dict[str, Any] = json_format.MessageToDict(spec, preserving_proto_field_name=True)
    for name in _DURATIONS:
        if name in doc:
            doc[name] = _go_duration(float(doc[name].rstrip("s")))
    if "labels" in doc:
        doc["labels"] = doc["labels"].get("labels", [])
        if not doc["labels"]:
            del doc["labels"]
    for source in doc.get("sources", []):
        if "min_offset" in source:
            source["min_offset"] = int(source["min_offset"])
    # Gazette's order: the ID first, then the fields as the message declares them.
    return {name: doc[name] for name in ("id", *_field_order()) if name in doc}


def _go_duration(seconds: float) -> str:
    """Go's rendering where it is short ("1m30s", "250ms"); fractional seconds otherwise."""
    millis = seconds * 1000
    if 0 < seconds < 1 and millis == int(millis):
        return f"{int(millis)}ms"
    return format_go_duration(seconds)


def _field_order() -> list[str]:
    return [f.name for f in cpb.ShardSpec.DESCRIPTOR.fields if f.name != "id"]


# --- Push down and hoist ----------------------------------------------------------------------


# ShardSpec's fields that are messages (set when present), and the repeated one.
_MESSAGES = frozenset({"max_txn_duration", "min_txn_duration"})
_REPEATED = frozenset({"sources"})


def _is_set(spec: cpb.ShardSpec, name: str) -> bool:
    """Whether ``name`` has a non-zero value (Gazette's notion of "set" for merging)."""
    if name == "labels":
        return bool(spec.labels.labels)
    if name in _MESSAGES:
        return spec.HasField(name)
    if name in _REPEATED:
        return len(spec.sources) > 0
    return bool(getattr(spec, name))


def _copy_field(src: cpb.ShardSpec, dst: cpb.ShardSpec, name: str) -> None:
    if name in _REPEATED:
        dst.sources.extend(src.sources)
    elif name in _MESSAGES:
        getattr(dst, name).CopyFrom(getattr(src, name))
    else:
        setattr(dst, name, getattr(src, name))


def push_down(common: cpb.ShardSpec, shard: cpb.ShardSpec) -> cpb.ShardSpec:
    """``shard`` with every field it leaves unset taken from ``common``; labels united."""
    out = cpb.ShardSpec()
    out.CopyFrom(shard)
    for name in _field_order():
        if name == "labels":
            continue
        if not _is_set(out, name) and _is_set(common, name):
            _copy_field(common, out, name)
    for label in common.labels.labels:
        gl.add_value(out.labels, label.name, label.value)
    return out


def hoist(specs: Sequence[cpb.ShardSpec]) -> tuple[cpb.ShardSpec, list[cpb.ShardSpec]]:
    """The fields every spec shares (as a common spec without ID), and each spec without
    them: the inverse of ``push_down``."""
    common = cpb.ShardSpec()
    if not specs:
        return common, []
    for name in _field_order():
        if name == "labels":
            continue
        first = specs[0]
        if _is_set(first, name) and all(
            getattr(s, name) == getattr(first, name) for s in specs[1:]
        ):
            _copy_field(first, common, name)
    shared = set.intersection(*({(lb.name, lb.value) for lb in s.labels.labels} for s in specs))
    for name, value in sorted(shared):
        gl.add_value(common.labels, name, value)
    rest: list[cpb.ShardSpec] = []
    for spec in specs:
        own = cpb.ShardSpec()
        own.CopyFrom(spec)
        for name in _field_order():
            if name != "labels" and _is_set(common, name):
                own.ClearField(name)
        del own.labels.labels[:]
        for label in spec.labels.labels:
            if (label.name, label.value) not in shared:
                own.labels.labels.add(name=label.name, value=label.value)
        rest.append(own)
    return common, rest


# --- Documents --------------------------------------------------------------------------------


def parse_shard_space(data: str | bytes) -> list[ShardChange]:
    """Every shard of a shard-space YAML document, fully specified and validated. Raises
    ShardSpaceError naming the first bad shard, field and line."""
    try:
        return _parse(data)
    except ShardSpaceError:
        raise
    except YamlInputError as err:
        raise ShardSpaceError(err.path, err.rule, line=err.line) from None


def _parse(data: str | bytes) -> list[ShardChange]:
    doc = load_yaml(data)
    if not isinstance(doc, Mapping) or "shards" not in doc:
        raise ShardSpaceError(
            "document",
            f"must be a mapping with 'shards' (and 'common') (got {shown(doc)})",
            line=line_of(doc),
        )
    check_keys(doc, ("common", "shards"), "document", line_of(doc))
    common_doc = doc.get("common") or {}
    common_line = line_of(doc, "common")
    if not isinstance(common_doc, Mapping):
        raise ShardSpaceError(
            "common", f"must be a mapping (got {shown(common_doc)})", line=common_line
        )
    if "id" in common_doc:
        raise ShardSpaceError(
            "common.id", "a common spec has no ID", line=line_of(common_doc, "id")
        )
    check_message(common_doc, cpb.ShardSpec.DESCRIPTOR, "common", common_line)
    common = _spec_from_yaml(common_doc, "common")
    shards = doc["shards"]
    if not isinstance(shards, list):
        raise ShardSpaceError(
            "shards", f"must be a list (got {shown(shards)})", line=line_of(doc, "shards")
        )
    if len(shards) > shards_max:
        raise ShardSpaceError("shards", f"must hold at most {shards_max} shards")
    out: list[ShardChange] = []
    seen: set[str] = set()
    for index, node in enumerate(shards):
        path, line = f"shards[{index}]", line_of(shards, index)
        change = _parse_shard(node, common, path, line)
        if change.id in seen:
            raise ShardSpaceError(
                f"{path}.id", f"{change.id!r} is declared twice", line=line_of(node, "id") or line
            )
        seen.add(change.id)
        out.append(change)
    return out


def _parse_shard(node: Any, common: cpb.ShardSpec, path: str, line: int | None) -> ShardChange:
    if not isinstance(node, Mapping):
        raise ShardSpaceError(
            path, f"must be a mapping with at least an 'id' (got {shown(node)})", line=line
        )
    check_message(node, cpb.ShardSpec.DESCRIPTOR, path, line, extra_keys=_CHANGE_KEYS)
    shard_id = node.get("id")
    if not shard_id:
        raise ShardSpaceError(f"{path}.id", "is required", line=line_of(node) or line)
    revision = node.get("revision", 0)
    if isinstance(revision, bool) or not isinstance(revision, int) or revision < -1:
        raise ShardSpaceError(
            f"{path}.revision",
            f"must be an integer >= -1 (got {shown(revision)})",
            line=line_of(node, "revision"),
        )
    for key, kind, what in (("delete", bool, "true or false"), ("comment", str, "a string")):
        if node.get(key) is not None and not isinstance(node[key], kind):
            raise ShardSpaceError(
                f"{path}.{key}", f"must be {what} (got {shown(node[key])})", line=line_of(node, key)
            )
    comment = node.get("comment") or ""
    if node.get("delete"):
        return ShardChange(shard_id, None, revision, comment)
    fields = {k: v for k, v in node.items() if k in _SPEC_FIELDS}
    spec = push_down(common, _spec_from_yaml(fields, path, node))
    try:
        validate_shard_spec(spec)
    except ValidationError as exc:
        raise ShardSpaceError(
            f"{path} ({shard_id})", str(exc), line=line_of(node) or line
        ) from None
    return ShardChange(shard_id, spec, revision, comment)


def shard_space_doc(listing: Sequence[tuple[cpb.ShardSpec, int]]) -> dict[str, Any]:
    """A hoisted shard-space document of ``(spec, mod revision)`` pairs, as ``parse_shard_space``
    reads it back (the revisions guard a later apply against concurrent changes)."""
    for spec, _ in listing:  # Before hoisting, which would lose the ID of a bad one.
        _check_durations(spec)
    common, rest = hoist([spec for spec, _ in listing])
    shards = []
    for own, (_, revision) in zip(rest, listing, strict=True):
        entry = spec_to_yaml(own)
        entry["revision"] = revision
        shards.append(entry)
    doc: dict[str, Any] = {}
    common_doc = spec_to_yaml(common)
    if common_doc:
        doc["common"] = common_doc
    doc["shards"] = shards
    return doc
