"""A small real disk for fault tests: a tmpfs mounted for the test (root only), which fills up
as a real disk does (ENOSPC), and can be filled to the last byte by another file, or grown."""

from __future__ import annotations

import contextlib
import errno
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_disk(path: Path, size: int) -> Iterator[Path]:
    """A tmpfs of `size` bytes at `path` (created), unmounted afterwards; the test is skipped,
    saying why, where mounting is not allowed (not root)."""
    path.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


@contextlib.contextmanager
def small_disks(paths: Sequence[Path], size: int) -> Iterator[list[Path]]:
    """A `small_disk` of `size` bytes at each of `paths` (one per broker, say)."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(small_disk(path, size)) for path in paths]


def fill(path: Path) -> Path:
    """A file taking every byte left on the file system of `path` (another tenant of the
    disk); returns it: unlink it to give the space back."""
    filler = path / "filler"
    with filler.open("wb", buffering=0) as out:
        for size in (1 << 16, 1 << 12, 1):
            try:
                while True:
                    out.write(b"\0" * size)
            except OSError as err:
                if err.errno != errno.ENOSPC:
                    raise
    return filler


def resize(path: Path, size: int) -> None:
    """Grow (or shrink) the tmpfs at `path` to `size` bytes, mounted as it is."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True)
