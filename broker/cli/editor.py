"""The edit-apply loop of ``gazctl journals edit`` and ``gazctl shards edit``.

The selected specs are written as YAML to a temporary file, under a header of '#' comments, and
the file is opened in the user's editor: ``$GAZ_EDITOR``, else ``$EDITOR``, else ``vi``, run
by ``/bin/sh`` with the file's path as its last argument (so an editor may be a command with
arguments, as in Gazette). When the editor exits:

- an empty file (whitespace only) cancels: nothing is applied, exit status 0;
- an unchanged file cancels too (exit 0), unless an earlier attempt failed: then the edits
  that failed are kept in the file, whose path is told, and the command fails (exit 1);
- otherwise the text is applied. If that is refused (bad YAML, invalid specs, or a revision
  changed meanwhile), the editor opens again on the user's text, the error in the header; at
  most `edit_attempts_max` times, after which the command fails, keeping the file.

An editor that exits with a non-zero status fails the command (the file is kept). Unlike
Gazette's, a cancellation after a failed attempt is an error: what was asked was not done.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TextIO, TypeVar

from broker.cli.errors import CommandError
from broker.protocol.status import StatusError
from broker.protocol.validate import ValidationError

T = TypeVar("T")

# Times the editor is opened on refused edits before the command gives up.
edit_attempts_max = 16
EDITOR_VARS = ("GAZ_EDITOR", "EDITOR")
DEFAULT_EDITOR = "vi"

_HEADER = (
    "# Edit the {what} below; they are applied when you save and exit the editor.",
    "# Lines beginning with '#' at the top are ignored. An empty file cancels, as does",
    "# exiting without a change. Each journal or shard keeps its 'revision': the apply is",
    "# refused if it was changed meanwhile.",
)


class EditError(CommandError):
    """The edit did not end in an apply: the editor failed, the user cancelled after a refused
    attempt, or attempts ran out. `path` is the file holding the last edits, if kept."""

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(message + (f"; last edits saved to {path}" if path else ""))
        self.path = path


@dataclass(frozen=True)
class Edited(Generic[T]):
    """The outcome of an edit loop: what `apply` returned, or None if the user cancelled."""

    applied: T | None
    cancelled: str = ""


def editor_command(env: Mapping[str, str] = os.environ) -> str:
    for var in EDITOR_VARS:
        if env.get(var, "").strip():
            return env[var]
    return DEFAULT_EDITOR


def _document(what: str, body: str, error: str) -> str:
    lines = [line.format(what=what) for line in _HEADER]
    if error:
        lines.append("#")
        lines += [f"# Error: {part}" for part in error.splitlines() or [""]]
    return "\n".join(lines) + "\n" + body


def strip_header(text: str) -> str:
    """The text without its leading comment lines (the header)."""
    lines = text.splitlines(keepends=True)
    start = 0
    while start < len(lines) and lines[start].startswith("#"):
        start += 1
    return "".join(lines[start:])


async def run_editor(command: str, path: str) -> None:
    """Run `command` on `path`, attached to this terminal; raise EditError if it fails."""
    proc = await asyncio.create_subprocess_exec("/bin/sh", "-c", f'{command} "$1"', "sh", path)
    status = await proc.wait()
    if status != 0:
        raise EditError(f"editor {command!r} exited with status {status}; nothing applied", path)


async def edit_loop(
    what: str,
    body: str,
    apply: Callable[[str], Awaitable[T]],
    *,
    file_prefix: str,
    editor: str | None = None,
    stderr: TextIO,
) -> Edited[T]:
    """Edit `body` (YAML of `what`, e.g. "journal specs") until `apply` takes it or the user
    cancels (see the module docstring). `apply` raises ValidationError or StatusError to refuse
    the text; any other error ends the loop, keeping the file."""
    command = editor or editor_command()
    fd, path = tempfile.mkstemp(prefix=file_prefix, suffix=".yaml")
    os.close(fd)
    before, error, failed_once = body, "", False
    for _ in range(edit_attempts_max):
        await asyncio.to_thread(Path(path).write_text, _document(what, before, error))
        await run_editor(command, path)
        text = strip_header(await asyncio.to_thread(Path(path).read_text))
        if not text.strip():
            os.unlink(path)
            print("gazctl: cancelled; empty file", file=stderr)
            return Edited(None, "empty file")
        if text == before:
            if failed_once:
                raise EditError(f"cancelled with no change to the refused edits ({error})", path)
            os.unlink(path)
            print("gazctl: cancelled; nothing changed", file=stderr)
            return Edited(None, "nothing changed")
        try:
            applied = await apply(text)
        except (ValidationError, StatusError) as err:
            before, error, failed_once = text, str(err), True
            print(f"gazctl: edit refused, reopening the editor: {err}", file=stderr)
            continue
        except Exception as err:
            raise EditError(f"applying the edits failed: {err}", path) from err
        os.unlink(path)
        return Edited(applied)
    raise EditError(f"edits refused {edit_attempts_max} times; last error: {error}", path)
