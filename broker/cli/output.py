"""Rendering of CLI results as a table, YAML or JSON (``--format``)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TextIO

import yaml

OutputFormat = Literal["table", "yaml", "json"]
FORMATS: tuple[OutputFormat, ...] = ("table", "yaml", "json")
FORMAT_HELP = "output format (default: table)"

# Cells longer than this are cut in tables (YAML and JSON always carry the full value).
table_cell_chars_max = 64


def _cell(value: Any) -> str:
    text = "" if value is None else str(value)
    if len(text) > table_cell_chars_max:
        text = text[: table_cell_chars_max - 1] + "…"
    return text


def render_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain aligned text table with a header row."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(c) for c in columns]
    for row in cells:
        for i, text in enumerate(row):
            widths[i] = max(widths[i], len(text))
    lines = ["  ".join(c.upper().ljust(widths[i]) for i, c in enumerate(columns)).rstrip()]
    lines += ["  ".join(t.ljust(widths[i]) for i, t in enumerate(row)).rstrip() for row in cells]
    return "\n".join(lines) + "\n"


def emit(
    out: TextIO,
    fmt: OutputFormat,
    records: Sequence[Mapping[str, Any]],
    columns: Sequence[str],
) -> None:
    """Write records: as a table of ``columns``, or in full as YAML documents / a JSON list."""
    if fmt == "table":
        out.write(render_table(columns, [[r.get(c) for c in columns] for r in records]))
    elif fmt == "yaml":
        out.write(yaml.safe_dump_all(list(records), sort_keys=False, explicit_start=True))
    elif fmt == "json":
        out.write(json.dumps(list(records), indent=2) + "\n")
    else:
        raise ValueError(f"--format: must be one of {', '.join(FORMATS)} (got {fmt!r})")
