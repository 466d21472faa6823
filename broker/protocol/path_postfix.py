"""Path postfixes: Gazette's `JournalSpec.Fragment.path_postfix_template`, evaluated.

A postfix places a fragment file one or more "directories" below its journal, between the
journal name and the content name, usually to partition files by time Hive-style:

    date={{.Spool.FirstAppendTime.Format "2006-01-02"}}/hour={{.Spool.FirstAppendTime.Format "15"}}
    -> <store>/<journal>/date=2019-11-19/hour=22/<begin>-<end>-<sha1>.gz

Gazette evaluates the template as a Go text/template over a value shaped
`struct { Spool; *JournalSpec }`, where the Spool embeds the fragment being persisted (with
`BackingStore` already set to the store written) and carries `FirstAppendTime`, the UTC wall
time of the fragment's first commit. Go's field promotion makes `.Spool.Begin`,
`.Spool.Fragment.Begin` and `.Begin` the same value, and `.Name` the journal spec's name.

This module evaluates the subset of that language that postfix templates use, without I/O:

- literal text, comments (`{{/* ... */}}`) and trim markers (`{{- ` and ` -}}`);
- a string constant (`{{ "text" }}`);
- field references: `.Spool.<F>`, `.Spool.Fragment.<F>` and `.<F>` for the fragment fields
  Journal, Begin, End, CompressionCodec, BackingStore, ModTime, PathPostfix; `.Name`,
  `.Replication`, `.MaxAppendRate` (also under `.JournalSpec.`);
- `FirstAppendTime` (under `.Spool.` or not) with one method: `.Format "<Go layout>"` (every
  Go layout element; the time is UTC), `.Unix`, `.Year`, `.YearDay`, `.Month`, `.Day`,
  `.Weekday`, `.Hour`, `.Minute`, `.Second`, `.Nanosecond`.

Anything else (functions such as printf, pipelines, variables, if / range / with, fields
without a printable value such as `.Spool.Sum`) raises `PostfixTemplateError` naming the
construct. Journal specs are validated with `check_template`, so a template this broker could
not evaluate is refused when it is applied rather than when its first fragment is persisted.
"""

from __future__ import annotations

import enum
import functools
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from broker.protocol import protocol_pb2 as pb
from broker.protocol.go_time import GO_ZERO_TIME, LayoutChunk, parse_layout, time_method
from broker.protocol.tokens import (
    JOURNAL_NAME_LEN_MAX,
    PATH_SYMBOLS,
    validate_path_component,
    validate_token,
)
from broker.protocol.validation_error import ValidationError

# Parsed templates kept for reuse (each journal spec names one; most clusters use a handful).
parsed_templates_max: Final = 256
# Characters of a template shown in an error message.
_shown_chars_max: Final = 80


class PostfixTemplateError(ValidationError):
    """A path postfix template cannot be evaluated. `construct` is the offending piece."""

    def __init__(self, rule: str, construct: str, template: str) -> None:
        self.construct = construct
        self.template = template
        super().__init__(f"{rule} (got {_quote(template)})")


def _quote(text: str) -> str:
    if len(text) > _shown_chars_max:
        text = text[:_shown_chars_max] + "..."
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


# --- Values a template reads --------------------------------------------------------------------


class Field(enum.Enum):
    JOURNAL = "Journal"
    BEGIN = "Begin"
    END = "End"
    COMPRESSION_CODEC = "CompressionCodec"
    BACKING_STORE = "BackingStore"
    MOD_TIME = "ModTime"
    PATH_POSTFIX = "PathPostfix"
    FIRST_APPEND_TIME = "FirstAppendTime"
    NAME = "Name"
    REPLICATION = "Replication"
    MAX_APPEND_RATE = "MaxAppendRate"


_FRAGMENT_FIELDS: Final = {
    f.value: f
    for f in (
        Field.JOURNAL,
        Field.BEGIN,
        Field.END,
        Field.COMPRESSION_CODEC,
        Field.BACKING_STORE,
        Field.MOD_TIME,
        Field.PATH_POSTFIX,
    )
}
_SPOOL_FIELDS: Final = {**_FRAGMENT_FIELDS, "FirstAppendTime": Field.FIRST_APPEND_TIME}
_SPEC_FIELDS: Final = {f.value: f for f in (Field.NAME, Field.REPLICATION, Field.MAX_APPEND_RATE)}
_ROOT_FIELDS: Final = {**_SPOOL_FIELDS, **_SPEC_FIELDS}
# Fields Gazette's value has, but whose printed form is no use in a path (structs, label sets).
_UNPRINTABLE_FIELDS: Final = frozenset(
    {"Spool", "JournalSpec", "Fragment", "Sum", "Registers", "Labels", "Flags", "Suspend", "File"}
)
_TIME_METHODS: Final = frozenset(
    {"Format", "Unix", "Year", "YearDay", "Month", "Day", "Weekday", "Hour", "Minute", "Second"}
    | {"Nanosecond"}
)


@dataclass(frozen=True, slots=True)
class PostfixValues:
    """The values a template may read. The defaults are Go's zero values, which is what
    Gazette validates templates against."""

    journal: str = ""
    begin: int = 0
    end: int = 0
    compression_codec: int = 0
    backing_store: str = ""
    mod_time: int = 0
    path_postfix: str = ""
    first_append_time: datetime = GO_ZERO_TIME
    name: str = ""
    replication: int = 0
    max_append_rate: int = 0

    @classmethod
    def of(
        cls, fragment: pb.Fragment, first_append_time_s: float, spec: pb.JournalSpec
    ) -> PostfixValues:
        """The values of a fragment about to be persisted (`backing_store` set, as Gazette
        sets it before evaluating), first committed at `first_append_time_s` (Unix seconds)."""
        return cls(
            journal=fragment.journal,
            begin=fragment.begin,
            end=fragment.end,
            compression_codec=int(fragment.compression_codec),
            backing_store=fragment.backing_store,
            mod_time=fragment.mod_time,
            path_postfix=fragment.path_postfix,
            first_append_time=datetime.fromtimestamp(first_append_time_s, UTC),
            name=spec.name,
            replication=spec.replication,
            max_append_rate=spec.max_append_rate,
        )

    def text_of(self, field: Field) -> str:
        """The field printed as Go's text/template prints it (enums by name)."""
        if field is Field.COMPRESSION_CODEC:
            codec = self.compression_codec
            known = codec in pb.CompressionCodec.values()
            return pb.CompressionCodec.Name(codec) if known else str(codec)
        value = {
            Field.JOURNAL: self.journal,
            Field.BEGIN: self.begin,
            Field.END: self.end,
            Field.BACKING_STORE: self.backing_store,
            Field.MOD_TIME: self.mod_time,
            Field.PATH_POSTFIX: self.path_postfix,
            Field.NAME: self.name,
            Field.REPLICATION: self.replication,
            Field.MAX_APPEND_RATE: self.max_append_rate,
        }[field]
        return str(value)


# --- Templates ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TextNode:
    text: str


@dataclass(frozen=True, slots=True)
class FieldNode:
    field: Field


@dataclass(frozen=True, slots=True)
class TimeNode:
    """A method of FirstAppendTime; `layout` is the parsed layout of Format."""

    method: str
    layout: tuple[LayoutChunk, ...] = ()


Node = TextNode | FieldNode | TimeNode


@dataclass(frozen=True, slots=True)
class PostfixTemplate:
    """A parsed template. `render` is pure: the same values give the same postfix."""

    text: str
    nodes: tuple[Node, ...]

    def render(self, values: PostfixValues) -> str:
        out: list[str] = []
        for node in self.nodes:
            if isinstance(node, TextNode):
                out.append(node.text)
            elif isinstance(node, FieldNode):
                out.append(values.text_of(node.field))
            else:
                out.append(time_method(values.first_append_time, node.method, node.layout))
        return "".join(out)


_SPACE: Final = " \t\r\n"  # Go's template whitespace.
_FIELD_CHAIN: Final = re.compile(r"(?:\.[^\W\d]\w*)+")
_STRING: Final = re.compile(r'"(?:[^"\\\n]|\\.)*"|`[^`]*`')
_WORD: Final = re.compile(r"[|()]|[^\s|()]+")
_ESCAPE: Final = re.compile(
    r'\\(?:([abfnrtv\\"])|x([0-9A-Fa-f]{2})|u([0-9A-Fa-f]{4})|U([0-9A-Fa-f]{8}))'
)
_SIMPLE_ESCAPES: Final = dict(zip('abfnrtv\\"', '\a\b\f\n\r\t\v\\"', strict=True))
_SUPPORTED: Final = (
    'supported: text, "strings", fields such as .Spool.Begin, .Spool.FirstAppendTime.Format "2006"'
)


@functools.lru_cache(maxsize=parsed_templates_max)
def parse_template(template: str) -> PostfixTemplate:
    """Parse `template`, raising PostfixTemplateError on anything outside the subset."""
    nodes: list[Node] = []
    pos, trim_leading = 0, False
    while True:
        start = template.find("{{", pos)
        literal = template[pos:] if start == -1 else template[pos:start]
        if trim_leading:
            literal = literal.lstrip(_SPACE)
        if start == -1:
            if literal:
                nodes.append(TextNode(literal))
            return PostfixTemplate(template, tuple(nodes))
        body = start + 2
        if template.startswith("-", body) and template[body + 1 : body + 2] in tuple(_SPACE):
            literal = literal.rstrip(_SPACE)
            body += 2
        if literal:
            nodes.append(TextNode(literal))
        if template.startswith("/*", body):
            pos, trim_leading = _end_of_comment(template, start, body)
            continue
        body_end, pos, trim_leading = _end_of_action(template, start, body)
        nodes.extend(_parse_action(template[body:body_end], template))


def _right_delim(template: str, i: int) -> tuple[int, bool] | None:
    """(index after "}}", whether it trims) if a closing delimiter starts at `i`."""
    if template.startswith("}}", i):
        return i + 2, False
    if template[i : i + 1] in tuple(_SPACE) and template.startswith("-}}", i + 1):
        return i + 4, True
    return None


def _end_of_comment(template: str, start: int, body: int) -> tuple[int, bool]:
    close = template.find("*/", body + 2)
    if close == -1:
        raise PostfixTemplateError(
            f"has an unclosed comment at offset {start}", template[start:], template
        )
    delim = _right_delim(template, close + 2)
    if delim is None:
        raise PostfixTemplateError(
            f"has a comment that ends before its closing delimiter at offset {start}",
            template[start : close + 2],
            template,
        )
    return delim


def _end_of_action(template: str, start: int, body: int) -> tuple[int, int, bool]:
    """(end of the action's body, index after it, whether it trims), skipping strings."""
    i = body
    while i < len(template):
        delim = _right_delim(template, i)
        if delim is not None:
            return i, delim[0], delim[1]
        quoted = _STRING.match(template, i)
        i = quoted.end() if quoted else i + 1
    raise PostfixTemplateError(
        f"has an unclosed action at offset {start}", template[start:], template
    )


def _tokens(body: str, template: str) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(body):
        if body[i] in _SPACE:
            i += 1
            continue
        match = _FIELD_CHAIN.match(body, i) or _STRING.match(body, i)
        if match is None or (match.end() < len(body) and body[match.end()] not in _SPACE):
            word = _WORD.match(body, i)
            construct = word.group(0) if word else body[i:]
            raise PostfixTemplateError(
                f"uses unsupported construct {_quote(construct)} ({_SUPPORTED})",
                construct,
                template,
            )
        out.append(match.group(0))
        i = match.end()
    return out


def _parse_action(body: str, template: str) -> list[Node]:
    tokens = _tokens(body, template)
    if not tokens:
        raise PostfixTemplateError("has an empty action", "{{}}", template)
    first, args = tokens[0], tokens[1:]
    if first[0] in '"`':
        if args:
            raise PostfixTemplateError(
                f"gives arguments to the string {first}, which is not a method",
                body.strip(),
                template,
            )
        return [TextNode(_unquote(first, template))]
    if len(args) > 1 or (args and args[0][0] not in '"`'):
        raise PostfixTemplateError(
            f"gives {first} arguments it does not take ({' '.join(args)})",
            body.strip(),
            template,
        )
    return [_resolve(first, args[0] if args else None, template)]


def _resolve(chain: str, arg: str | None, template: str) -> Node:
    """The node of a field reference such as .Spool.FirstAppendTime.Format "2006"."""
    segments = chain[1:].split(".")
    scope: dict[str, Field] = _ROOT_FIELDS
    if segments[0] == "Spool":
        scope, segments = _SPOOL_FIELDS, segments[1:]
        if segments[:1] == ["Fragment"]:
            scope, segments = _FRAGMENT_FIELDS, segments[1:]
    elif segments[0] == "JournalSpec":
        scope, segments = _SPEC_FIELDS, segments[1:]
    field = scope.get(segments[0]) if segments else None
    if field is None:
        name = segments[0] if segments else chain
        if not segments or name in _UNPRINTABLE_FIELDS:
            raise PostfixTemplateError(
                f"refers to field {_quote(chain)}, which has no value usable in a path"
                f" ({_SUPPORTED})",
                chain,
                template,
            )
        raise PostfixTemplateError(f"refers to unknown field {_quote(chain)}", chain, template)
    rest = segments[1:]
    if field is not Field.FIRST_APPEND_TIME:
        if rest:
            raise PostfixTemplateError(f"refers to unknown field {_quote(chain)}", chain, template)
        if arg is not None:
            raise PostfixTemplateError(
                f"gives {chain} an argument it does not take", chain, template
            )
        return FieldNode(field)
    if len(rest) != 1 or rest[0] not in _TIME_METHODS:
        raise PostfixTemplateError(
            f"must call one method of FirstAppendTime (one of {', '.join(sorted(_TIME_METHODS))})"
            f" (at {_quote(chain)})",
            chain,
            template,
        )
    method = rest[0]
    if (method == "Format") != (arg is not None):
        wants = "one string argument, the layout" if method == "Format" else "no argument"
        raise PostfixTemplateError(f"{chain} takes {wants}", chain, template)
    layout = parse_layout(_unquote(arg, template)) if arg is not None else ()
    return TimeNode(method, layout)


def _unquote(token: str, template: str) -> str:
    """A Go string constant's value (raw `...` or interpreted "...")."""
    inner = token[1:-1]
    if token[0] == "`":
        return inner
    out: list[str] = []
    i = 0
    while i < len(inner):
        if inner[i] != "\\":
            out.append(inner[i])
            i += 1
            continue
        match = _ESCAPE.match(inner, i)
        if match is None:
            raise PostfixTemplateError(
                f"has an unsupported escape in the string {token}", token, template
            )
        simple, *hexes = match.groups()
        out.append(_SIMPLE_ESCAPES[simple] if simple else chr(int(next(h for h in hexes if h), 16)))
        i = match.end()
    return "".join(out)


# --- Evaluation ---------------------------------------------------------------------------------


def evaluate(template: str, values: PostfixValues) -> str:
    """The postfix `template` gives for `values`, checked to be a valid path postfix (a clean
    relative path of the path alphabet, as listings require to parse it back)."""
    if not template:
        return ""
    postfix = parse_template(template).render(values)
    try:
        validate_path_component(postfix, 0, JOURNAL_NAME_LEN_MAX)
    except ValidationError as err:
        raise PostfixTemplateError(
            f"renders {_quote(postfix)}, which is not a valid path postfix: {err.rule}",
            postfix,
            template,
        ) from None
    return postfix


def postfix_of(fragment: pb.Fragment, first_append_time_s: float, spec: pb.JournalSpec) -> str:
    """The postfix of `fragment` under `spec` (see `PostfixValues.of`)."""
    template = spec.fragment.path_postfix_template
    if not template:
        return ""
    return evaluate(template, PostfixValues.of(fragment, first_append_time_s, spec))


def check_template(template: str) -> None:
    """Validate a template when a spec is applied: it parses, and it evaluates over Go's zero
    values (as Gazette checks) to text of the path alphabet. (Whether "/"s fall in place
    depends on real values, e.g. an empty name: that is checked when a fragment is persisted.)"""
    rendered = parse_template(template).render(PostfixValues())
    try:
        validate_token(rendered, 0, JOURNAL_NAME_LEN_MAX, PATH_SYMBOLS)
    except ValidationError as err:
        raise PostfixTemplateError(
            f"renders text that cannot be part of a path: {err.rule}", rendered, template
        ) from None
