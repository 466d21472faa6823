"""Strict, bounded YAML for gazctl: what it reads is either exactly what the user wrote, or one
line saying where and why not.

Gazette's gazctl reads specs with yaml.UnmarshalStrict: a repeated key or an unknown field is an
error, not "the last one wins" nor "ignored". So here, and further, because gazctl must never
end in a traceback nor read without bound:

- input is read up to `yaml_bytes_max` bytes; more is refused (`-f /dev/zero` fails at once);
- it must be UTF-8 (an invalid byte is reported with its line and offset);
- a mapping may not repeat a key (both lines are named), and its keys must be plain scalars;
- collections nest at most `yaml_depth_max` deep, and aliases may not expand the document to
  more than `yaml_values_max` values (a "billion laughs" document is refused, not walked);
- only plain YAML types are built (safe loading: no Python objects);
- mappings and lists remember their lines (YamlMap, YamlList), so that the checks that follow
  (unknown fields and wrong types, yaml_shape.py) name the line too.

Every failure is a YamlInputError: a ValidationError rendered on one line as
``<source>:<line>: <path>: <rule>``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any, Final, TypeVar

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import Resolver

from broker.protocol.validation_error import ValidationError

# Bytes of one YAML document. A journal space of the most journals gazctl applies at once
# (journalspace.nodes_max) is a few MiB; more is a mistake, or not YAML at all.
yaml_bytes_max: Final = 16 << 20
# Nesting of collections. A journal space nests two levels per directory (a mapping and its
# children); journalspace.depth_max directories and their specs fit well within this.
yaml_depth_max: Final = 100
# Values of a document once aliases are expanded (each alias is a reference to the anchored
# value: walking it visits that value again).
yaml_values_max: Final = 1_000_000

STDIN = "-"

T = TypeVar("T")


class YamlInputError(ValidationError):
    """Bad YAML input. Rendered as ``<source>:<line>: <path>: <rule>``, each part when known."""

    def __init__(self, rule: str, *context: str, line: int | None = None, source: str = "") -> None:
        self.line = line
        self.source = source
        super().__init__(rule, *context)

    def _render(self) -> str:
        text = super()._render()
        where = self.source or ("<input>" if self.line else "")
        if self.line:
            where += f":{self.line}"
        return f"{where}: {text}" if where else text

    def locate(self, *, source: str | None = None, line: int | None = None) -> YamlInputError:
        """Name the input the error is about and, if it has none yet, its line (in place);
        return self for re-raising."""
        if source is not None:
            self.source = source
        if self.line is None:
            self.line = line
        self.args = (self._render(),)
        return self


class YamlMap(dict[Any, Any]):
    """A mapping as loaded: `line` is where it starts, `key_lines` where each key is."""

    line: int = 0

    def __init__(self) -> None:
        super().__init__()
        self.key_lines: dict[Any, int] = {}


class YamlList(list[Any]):
    """A sequence as loaded: `line` is where it starts, `item_lines` where each item is."""

    line: int = 0

    def __init__(self) -> None:
        super().__init__()
        self.item_lines: list[int] = []


def line_of(value: Any, key: Any = None) -> int | None:
    """The line of `value` (a loaded collection), or of its key or index `key`; None if
    unknown (a value built by code rather than loaded)."""
    if key is not None:
        if isinstance(value, YamlMap):
            return value.key_lines.get(key)
        if isinstance(value, YamlList) and isinstance(key, int) and 0 <= key < len(value):
            return value.item_lines[key]
        return None
    return value.line or None if isinstance(value, YamlMap | YamlList) else None


def _line(node: Node) -> int:
    return int(node.start_mark.line) + 1


# --- Loading ----------------------------------------------------------------------------------


def _construct_mapping(loader: Any, node: MappingNode) -> Iterator[YamlMap]:
    data = YamlMap()
    data.line = _line(node)
    yield data
    first: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # "<<: *defaults": merged keys may be overridden, by design.
        if not isinstance(key_node, ScalarNode):
            raise YamlInputError(
                "a mapping key must be a plain value, not a list or mapping", line=_line(key_node)
            )
        key = loader.construct_object(key_node)
        if key in first:
            raise YamlInputError(
                f"duplicate key {key!r} (first at line {first[key]})", line=_line(key_node)
            )
        first[key] = _line(key_node)
    loader.flatten_mapping(node)
    for key_node, value_node in node.value:
        if not isinstance(key_node, ScalarNode):
            raise YamlInputError(
                "a mapping key must be a plain value, not a list or mapping", line=_line(key_node)
            )
        key = loader.construct_object(key_node)
        data[key] = loader.construct_object(value_node)
        data.key_lines[key] = _line(key_node)


def _construct_sequence(loader: Any, node: SequenceNode) -> Iterator[YamlList]:
    data = YamlList()
    data.line = _line(node)
    yield data
    data.item_lines = [_line(child) for child in node.value]
    data.extend(loader.construct_object(child) for child in node.value)


def _bounded_compose_node(self: Any, parent: Node | None, index: Any) -> Node | None:
    """Composer.compose_node, refusing to nest deeper than yaml_depth_max (composing recurses:
    without a bound, a deep document ends in RecursionError)."""
    self._depth += 1
    try:
        if self._depth > yaml_depth_max:
            mark = self.peek_event().start_mark
            raise YamlInputError(
                f"nesting deeper than yaml_depth_max ({yaml_depth_max})", line=mark.line + 1
            )
        node: Node | None = Composer.compose_node(self, parent, index)
        return node
    finally:
        self._depth -= 1


if yaml.__with_libyaml__:
    from yaml._yaml import CParser

    class _Loader(Composer, CParser, SafeConstructor, Resolver):
        """libyaml's parser (C, several times faster than PyYAML's own), with PyYAML's composer
        (Python: where nesting is bounded) and the safe constructor."""

        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            Composer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)
            self._depth = 0

        compose_node = _bounded_compose_node

else:  # pragma: no cover -- PyYAML without libyaml.

    class _Loader(yaml.SafeLoader):  # type: ignore[no-redef]
        def __init__(self, stream: str) -> None:
            super().__init__(stream)
            self._depth = 0

        compose_node = _bounded_compose_node


_Loader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)
_Loader.add_constructor("tag:yaml.org,2002:seq", _construct_sequence)


def read_input(path: str) -> bytes:
    """The bytes of `path` ("-": standard input), at most `yaml_bytes_max` of them: more is
    refused without reading further. OSError (missing file, a directory) is left to the
    caller, who names the path."""
    if path == STDIN:
        data = sys.stdin.buffer.read(yaml_bytes_max + 1)
    else:
        with open(path, "rb") as f:
            data = f.read(yaml_bytes_max + 1)
    if len(data) > yaml_bytes_max:
        raise YamlInputError(
            f"larger than yaml_bytes_max ({yaml_bytes_max} bytes)", source=source_name(path)
        )
    return data


def source_name(path: str) -> str:
    return "<stdin>" if path == STDIN else path


def parse_file(path: str, parse: Callable[[bytes], T]) -> T:
    """`parse` of the bytes of `path` (read_input), its YamlInputErrors naming the file."""
    try:
        return parse(read_input(path))
    except YamlInputError as err:
        raise err.locate(source=source_name(path)) from None


def load_yaml(data: bytes | str) -> Any:
    """One YAML document of `data` (see the module docstring for what is refused); None for an
    empty one. Raises YamlInputError."""
    if isinstance(data, bytes):
        if len(data) > yaml_bytes_max:
            raise YamlInputError(f"larger than yaml_bytes_max ({yaml_bytes_max} bytes)")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            line = data.count(b"\n", 0, err.start) + 1
            raise YamlInputError(
                f"not UTF-8 (byte 0x{data[err.start]:02x} at offset {err.start})", line=line
            ) from None
    else:
        text = data
    loader = _Loader(text)
    try:
        document = loader.get_single_data()
    except yaml.MarkedYAMLError as err:
        raise _marked_error(err) from None
    except yaml.reader.ReaderError as err:
        raise YamlInputError(
            f"not valid YAML: {_reader_problem(err)}", line=_reader_line(text, err)
        ) from None
    except yaml.YAMLError as err:
        raise YamlInputError(f"not valid YAML: {' '.join(str(err).split())}") from None
    finally:
        loader.dispose()
    _check_expansion(document)
    return document


def _reader_problem(err: yaml.reader.ReaderError) -> str:
    character = err.character
    code = ord(character) if isinstance(character, str) else int(character)
    return f"{err.reason} (character #x{code:04x})"


def _reader_line(text: str, err: yaml.reader.ReaderError) -> int:
    # libyaml reports a byte offset into the UTF-8 text; PyYAML's own reader a character one.
    if yaml.__with_libyaml__:
        return text.encode("utf-8", "surrogatepass").count(b"\n", 0, err.position) + 1
    return text.count("\n", 0, err.position) + 1


def _marked_error(err: yaml.MarkedYAMLError) -> YamlInputError:
    mark = err.problem_mark or err.context_mark
    parts = [part for part in (err.context, err.problem) if part]
    text = " ".join(" ".join(parts).split())
    return YamlInputError(
        f"not valid YAML: {text}" if text else "not valid YAML",
        line=mark.line + 1 if mark is not None else None,
    )


def _check_expansion(document: Any) -> None:
    """Walk the document (iteratively) counting values, aliases expanded: refuse one that
    expands beyond yaml_values_max, before anything else walks it."""
    pending = [document]
    visited = 0
    while pending:
        value = pending.pop()
        visited += 1
        if visited > yaml_values_max:
            raise YamlInputError(
                f"expands to more than {yaml_values_max} values (yaml_values_max):"
                " aliases referring to aliases?"
            )
        if isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
