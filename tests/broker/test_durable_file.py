"""broker.durable_file: a replaced file holds exactly the new content, with no temporary left."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.durable_file import replace_durably


def test_replace_durably_creates_then_replaces_whole(tmp_path: Path) -> None:
    target = tmp_path / "record"
    replace_durably(target, b"first\n")
    assert target.read_bytes() == b"first\n"
    big = bytes(range(256)) * 4096  # Larger than one write may take.
    replace_durably(str(target), big)
    assert target.read_bytes() == big
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record"]


def test_replace_durably_missing_directory_changes_nothing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        replace_durably(tmp_path / "absent" / "record", b"x")
    assert list(tmp_path.iterdir()) == []
