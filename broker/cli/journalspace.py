"""Hierarchical journal specs, as ``gazctl journals apply`` reads and ``list --format yaml``
writes them (the layout of Gazette's journalspace).

A node is either a *directory* (its name ends in ``/``) with ``children``, or a *journal* (a leaf).
Every field a node leaves unset is inherited from its parent, so common settings (replication,
stores, codec, labels) are written once at the top::

    name: examples/
    replication: 1
    fragment:
      length: 4194304
      compression_codec: ZSTANDARD
      stores: [file:///tmp/fragments/]
      refresh_interval: 30s
    children:
      - name: examples/words
        labels: [{name: content-type, value: application/x-ndjson}]
      - name: examples/counts

A child's name must extend its parent's (``examples/`` → ``examples/words``); the root may be
a directory with an empty name (journals sharing no prefix). Durations are Go durations
(``30s``, ``1m30s``, ``24h``) because that is what Gazette's YAML uses.

A journal (a leaf, never a directory) may carry the ``revision`` it expects to change, as in
Gazette: the journal's etcd mod revision (0: it must not exist yet; -1: no check). ``gazctl
journals edit`` writes them, so that an apply fails rather than overwrite a concurrent change.
Without one, ``apply`` expects the journal's revision current when it applies.

Documents are read strictly, as Gazette's gazctl reads them (strict_yaml.py, yaml_shape.py): a
repeated key, an unknown field or a value of the wrong type is an error naming its line and
field path, never silently dropped or the cause of a traceback.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from google.protobuf import json_format

from broker.cli.errors import CommandError
from broker.cli.strict_yaml import YamlInputError, line_of, load_yaml
from broker.cli.yaml_shape import check_message, shown
from broker.protocol import protocol_pb2 as pb
from broker.protocol.validate import ValidationError, at, validate_duration, validate_journal_spec

# A journal space of more nodes than this is refused: it would be applied in one etcd
# transaction per batch, and a typo that generates thousands of journals should not go far.
nodes_max = 10_000
# Nesting deeper than this is almost certainly a generated mistake.
depth_max = 32

_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s)")
_DURATION_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_DURATION_FIELDS = ("refresh_interval", "retention", "flush_interval")
_NODE_KEYS = {"name", "children", "delete", "comment", "revision"}


class JournalSpaceError(YamlInputError):
    """The journal-space document is malformed; the message names the node, the field and (when
    known) the line."""

    def __init__(self, path: str, rule: str, *, line: int | None = None) -> None:
        super().__init__(rule, *((path,) if path else ()), line=line)


def parse_go_duration(text: str, path: str) -> float:
    """Seconds of a Go duration string such as ``1h30m`` or ``90s``."""
    if not isinstance(text, str) or not text:
        raise JournalSpaceError(path, f"must be a duration like '30s' or '1h' (got {text!r})")
    pos, total = 0, 0.0
    for match in _DURATION_RE.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text):
        raise JournalSpaceError(path, f"must be a duration like '30s' or '1h' (got {text!r})")
    return total


def format_go_duration(seconds: float) -> str:
    """The shortest Go-style rendering of whole or fractional seconds."""
    if seconds == 0:
        return "0s"
    whole = int(seconds)
    out = ""
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        out += f"{hours}h"
    if minutes:
        out += f"{minutes}m"
    frac = seconds - whole
    if secs or frac or not out:
        out += f"{secs + frac:g}s"
    return out


def _merge(parent: dict[str, Any], child: Mapping[str, Any]) -> dict[str, Any]:
    """Child fields override the parent's; nested mappings (fragment) merge field by field."""
    out = dict(parent)
    for key, value in child.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


def _spec_from_fields(fields: Mapping[str, Any], path: str, line: int | None) -> pb.JournalSpec:
    doc = {k: v for k, v in fields.items() if k not in _NODE_KEYS}
    fragment = dict(doc.get("fragment") or {})
    for name in _DURATION_FIELDS:
        if name in fragment:
            try:
                seconds = parse_go_duration(fragment[name], f"{path}.fragment.{name}")
            except JournalSpaceError as exc:
                raise exc.locate(line=line_of(fields.get("fragment"), name) or line) from None
            fragment[name] = f"{seconds:.9f}s"
    if fragment:
        doc["fragment"] = fragment
    doc["name"] = fields["name"]
    # Gazette writes a LabelSet as a bare list of {name, value}.
    if isinstance(doc.get("labels"), list):
        doc["labels"] = {"labels": doc["labels"]}
    # ... and flags as a Flag's name, or an integer.
    if isinstance(doc.get("flags"), str):
        doc["flags"] = pb.JournalSpec.Flag.Value(doc["flags"])
    spec = pb.JournalSpec()
    try:
        json_format.ParseDict(doc, spec, ignore_unknown_fields=False)
    except json_format.ParseError as exc:
        # Not expected after check_message; kept so that nothing reaches the user as a trace.
        message = " ".join(str(exc).split())
        raise JournalSpaceError(
            path, f"is not a valid journal spec: {message}", line=line
        ) from None
    return spec


_NODE_ONLY_KEYS = _NODE_KEYS - {"name"}


class JournalChange(NamedTuple):
    """One journal of a journal space: its spec (None: `delete: true`), and the revision the
    change expects (None: whatever is current when applied)."""

    spec: pb.JournalSpec | None
    name: str
    revision: int | None


def _walk(
    node: Any, inherited: dict[str, Any], parent_name: str, path: str, depth: int
) -> Iterator[JournalChange]:
    line = line_of(node)
    if depth > depth_max:
        raise JournalSpaceError(path, f"nesting deeper than {depth_max} levels", line=line)
    if not isinstance(node, Mapping):
        raise JournalSpaceError(
            path, f"must be a mapping with at least a 'name' (got {shown(node)})", line=line
        )
    check_message(node, pb.JournalSpec.DESCRIPTOR, path, line, extra_keys=_NODE_ONLY_KEYS)
    name = node.get("name")
    name_line = line_of(node, "name") or line
    is_root_dir = depth == 0 and node.get("children") is not None
    if name is None and is_root_dir:
        name = ""  # Gazette's root of journals sharing no prefix.
    if not isinstance(name, str) or (not name and not is_root_dir):
        raise JournalSpaceError(f"{path}.name", "is required", line=name_line)
    if parent_name and not name.startswith(parent_name):
        raise JournalSpaceError(
            f"{path}.name", f"must extend its parent's name {parent_name!r}", line=name_line
        )
    for key, kind, what in (("delete", bool, "true or false"), ("comment", str, "a string")):
        if node.get(key) is not None and not isinstance(node[key], kind):
            raise JournalSpaceError(
                f"{path}.{key}", f"must be {what} (got {shown(node[key])})", line=line_of(node, key)
            )
    revision = node.get("revision")
    revision_line = line_of(node, "revision") or line
    if revision is not None and (
        isinstance(revision, bool) or not isinstance(revision, int) or revision < -1
    ):
        raise JournalSpaceError(
            f"{path}.revision",
            f"must be an integer >= -1 (got {shown(revision)})",
            line=revision_line,
        )
    fields = _merge(inherited, node)
    fields.pop("revision", None)
    children = node.get("children")
    if children is not None:
        children_line = line_of(node, "children")
        if revision is not None:
            raise JournalSpaceError(
                f"{path}.revision", "only a journal has a revision, not a directory", line=line
            )
        if name and not name.endswith("/"):
            raise JournalSpaceError(
                f"{path}.name", "a node with children must end in '/'", line=name_line
            )
        if not isinstance(children, list):
            raise JournalSpaceError(
                f"{path}.children", f"must be a list (got {shown(children)})", line=children_line
            )
        fields.pop("children", None)
        for i, child in enumerate(children):
            yield from _walk(child, fields, name, f"{path}.children[{i}]", depth + 1)
        return
    if name.endswith("/"):
        raise JournalSpaceError(
            f"{path}.name", "a journal name must not end in '/'", line=name_line
        )
    if node.get("delete"):
        yield JournalChange(None, name, revision)
        return
    spec = _spec_from_fields(fields, path, line)
    try:
        validate_journal_spec(spec)
    except ValidationError as exc:
        raise JournalSpaceError(f"{path} ({name})", str(exc), line=line) from None
    yield JournalChange(spec, name, revision)


def parse_journal_space(data: str | bytes) -> list[tuple[pb.JournalSpec | None, str]]:
    """Every journal of a YAML journal space: ``(spec, name)``, or ``(None, name)`` for a leaf
    marked ``delete: true``. Raises JournalSpaceError naming the first bad node, field and
    line."""
    return [(c.spec, c.name) for c in parse_journal_changes(data)]


def parse_journal_changes(data: str | bytes) -> list[JournalChange]:
    """Like `parse_journal_space`, with each journal's expected revision."""
    try:
        return _parse(data)
    except JournalSpaceError:
        raise
    except YamlInputError as err:
        raise JournalSpaceError(err.path, err.rule, line=err.line) from None


def _parse(data: str | bytes) -> list[JournalChange]:
    doc = load_yaml(data)
    out: list[JournalChange] = []
    seen: set[str] = set()
    for change in _walk(doc, {}, "", "root", 0):
        if change.name in seen:
            raise JournalSpaceError(change.name, "is declared more than once")
        seen.add(change.name)
        out.append(change)
        if len(out) > nodes_max:
            raise JournalSpaceError("document", f"declares more than {nodes_max} journals")
    return out


def journal_space_doc(listing: Sequence[tuple[pb.JournalSpec, int]]) -> dict[str, Any]:
    """A journal space of ``(spec, mod revision)`` pairs that `parse_journal_changes` reads
    back: a root directory named by the journals' longest common directory prefix, and each
    journal's full spec with its revision (not hoisted: an edit stays where it is made)."""
    names = [spec.name for spec, _ in listing]
    common = names[0] if names else ""
    for name in names[1:]:
        while not name.startswith(common):
            common = common[:-1]
    root = common[: common.rfind("/") + 1]
    children = []
    for spec, revision in sorted(listing, key=lambda pair: pair[0].name):
        doc = spec_to_yaml_dict(spec)
        children.append({"name": doc.pop("name"), **doc, "revision": revision})
    return {"name": root, "children": children}


def check_stored_durations(kind: str, name: str, fields: Mapping[str, Any]) -> None:
    """Refuse, naming the spec, a Duration no JSON or YAML can render (mixed signs, nanos out
    of range, ...): brokers refuse to store one since, but a spec stored before (or by an
    older broker) must make gazctl say which spec is bad, not fail on the first."""
    for path, duration in fields.items():
        try:
            with at(path):
                validate_duration(duration)
        except ValidationError as exc:
            raise CommandError(
                f"{kind} {name!r}: {exc} (a stored spec Gazette cannot decode:"
                " apply a corrected one, or delete it)"
            ) from None


def spec_to_yaml_dict(spec: pb.JournalSpec) -> dict[str, Any]:
    """A JournalSpec as the YAML mapping ``parse_journal_space`` reads back."""
    check_stored_durations(
        "journal",
        spec.name,
        {f"fragment.{name}": getattr(spec.fragment, name) for name in _DURATION_FIELDS},
    )
    doc: dict[str, Any] = json_format.MessageToDict(spec, preserving_proto_field_name=True)
    if "labels" in doc:
        doc["labels"] = doc["labels"].get("labels", [])
    fragment = doc.get("fragment", {})
    for name in _DURATION_FIELDS:
        if name in fragment:
            fragment[name] = format_go_duration(float(fragment[name].rstrip("s")))
    if "length" in fragment:
        fragment["length"] = int(fragment["length"])
    return doc
