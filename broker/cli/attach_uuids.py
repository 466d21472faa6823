"""``gazctl attach-uuids``: give each line of text input a Gazette message UUID.

    gazctl attach-uuids [--template T] [--max-length N] [--skip-header] [FILE ...]

As Gazette's: for each line of each file (stdin without files), write the template with
``{{.UUID}}`` replaced by a new v1 UUID and ``{{.Line}}`` by the line (without its line ending),
to stdout. The default template ``{{.UUID}},{{.Line}}`` plus a newline prefixes CSV rows. All
UUIDs share one new random producer ID and a clock started at the current time and ticked per
line, and are flagged OUTSIDE_TXN: committed, so readers process them at once. Appending the
output to a journal (``gazctl journals append``) then gives exactly-once consumers messages
they deduplicate should the append be repeated; write it to a file first, then append that.

Only the ``{{.UUID}}`` and ``{{.Line}}`` actions of Go's text/template are supported (spaces
inside the braces allowed); any other ``{{...}}`` is refused before any output. Lines are
bytes: they are copied as read, whatever their encoding. A line longer than --max-length
bytes fails the command (exit 2), naming the file and line, after the lines before it.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import BinaryIO

from broker.protocol.validate import ValidationError

DEFAULT_TEMPLATE = "{{.UUID}},{{.Line}}\n"
# Gazette's default: 4 MiB.
line_bytes_max_default = 4 << 20
_ACTION = re.compile(r"\{\{\s*(.*?)\s*\}\}", re.DOTALL)
_FIELDS = {".UUID": "uuid", ".Line": "line"}


@dataclass(frozen=True)
class Template:
    """A template split into literal bytes and the fields between them."""

    literals: tuple[bytes, ...]
    fields: tuple[str, ...]  # "uuid" or "line"; len(literals) == len(fields) + 1

    def render(self, uuid: bytes, line: bytes) -> bytes:
        out = [self.literals[0]]
        for name, literal in zip(self.fields, self.literals[1:], strict=True):
            out.append(uuid if name == "uuid" else line)
            out.append(literal)
        return b"".join(out)


def parse_template(text: str) -> Template:
    literals: list[bytes] = []
    fields: list[str] = []
    pos = 0
    for match in _ACTION.finditer(text):
        field = _FIELDS.get(match.group(1))
        if field is None:
            raise ValidationError(
                f"only {{{{.UUID}}}} and {{{{.Line}}}} are supported (got {match.group(0)!r})",
                "--template",
            )
        literals.append(text[pos : match.start()].encode())
        fields.append(field)
        pos = match.end()
    rest = text[pos:]
    if "{{" in rest:
        raise ValidationError(f"unclosed action {rest[rest.index('{{') :]!r}", "--template")
    literals.append(rest.encode())
    return Template(tuple(literals), tuple(fields))


def attach(
    inputs: Sequence[tuple[str, BinaryIO]],
    out: BinaryIO,
    template: Template,
    *,
    line_bytes_max: int = line_bytes_max_default,
    skip_header: bool = False,
) -> int:
    """Write every line of `inputs` ((name, stream) pairs) through `template`; the number of
    lines written."""
    from gazette_consumer.message.clock import Clock
    from gazette_consumer.message.uuid import Flag, build_uuid, new_producer_id

    producer = new_producer_id()
    clock = Clock.from_unix_nanos(time.time_ns())
    written = 0
    for name, source in inputs:
        number = 0
        while True:
            # One byte past the limit (and a line ending) tells a line that is too long.
            raw = source.readline(line_bytes_max + 2)
            if not raw:
                break
            number += 1
            line = raw[:-1] if raw.endswith(b"\n") else raw
            line = line[:-1] if line.endswith(b"\r") else line
            if len(line) > line_bytes_max or (
                not raw.endswith(b"\n") and len(raw) > line_bytes_max
            ):
                raise ValidationError(
                    f"{name}: line {number} is longer than {line_bytes_max} bytes", "--max-length"
                )
            if skip_header and number == 1:
                continue
            clock.update(time.time_ns())
            uuid = str(build_uuid(producer, clock.tick(), Flag.OUTSIDE_TXN)).encode()
            out.write(template.render(uuid, line))
            written += 1
    out.flush()
    return written


def run(paths: Sequence[str], template_text: str, max_length: int, skip_header: bool) -> int:
    if max_length <= 0:
        raise ValidationError(f"must be > 0 (got {max_length})", "--max-length")
    template = parse_template(template_text)
    opened: list[tuple[str, BinaryIO]] = []
    try:
        for path in paths:
            opened.append((path, open(path, "rb")))  # Closed below.
        inputs = opened or [("stdin", sys.stdin.buffer)]
        attach(
            inputs, sys.stdout.buffer, template, line_bytes_max=max_length, skip_header=skip_header
        )
    finally:
        for _, stream in opened:
            stream.close()
    return 0
