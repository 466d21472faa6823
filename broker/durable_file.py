"""Replacing a small file so that a crash (of the process, or of the machine) leaves either the
old content or the new one, whole: never a torn file, never an empty one.

`replace_durably` writes the new content to a sibling ``<name>.tmp``, fsyncs it, renames it
over the file, then fsyncs the directory (without that, the rename itself may be lost in a
machine crash). Used for the records a process must find again after a restart: the embedded
keyspace's snapshot and identity, a quorum member's incarnation, mark and journal revision."""

from __future__ import annotations

import os
from typing import Final

_CREATE_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
_FILE_MODE: Final = 0o644


def write_synced(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` as the whole content of ``path`` (created or truncated) and fsync it."""
    fd = os.open(path, _CREATE_FLAGS, _FILE_MODE)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a directory's entries (files created, renamed or removed in it) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path``'s content with ``data`` atomically and durably (see the module
    docstring). Its directory must exist."""
    target = os.fspath(path)
    tmp = target + ".tmp"
    write_synced(tmp, data)
    os.replace(tmp, target)
    fsync_dir(os.path.dirname(target) or ".")
