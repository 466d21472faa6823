"""`gazette demo` (what `make demo` runs) works end to end on the embedded default."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.demo import LINES, run


async def test_demo_round_trip_persists_every_byte(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await run(tmp_path) == 0
    out = capsys.readouterr().out
    assert b"".join(LINES).decode() in out
    files = sorted((tmp_path / "fragments" / "demo" / "greetings").iterdir())
    assert files, "the broker persisted no fragment on stop"
    assert all(f.suffix == ".zst" for f in files)


async def test_demo_runs_again_on_the_same_data_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The second run finds the first run's fragments in the store: the broker refuses to
    # re-write those offsets, so the demo continues explicitly at the persisted head.
    assert await run(tmp_path) == 0
    assert await run(tmp_path) == 0
    out = capsys.readouterr().out
    length = len(b"".join(LINES))
    assert f"continuing after {length} bytes persisted by an earlier run" in out
    assert f"appended [{length:>3}," in out
