"""gazctl commands that need no broker: dry-run apply, and its errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker.cli.gazctl import EXIT_BAD_INPUT, main

SPACE = """
name: demo/
replication: 1
fragment: {length: 4096, compression_codec: ZSTANDARD, refresh_interval: 30s}
children: [{name: demo/words}, {name: demo/counts, replication: 3}, {name: demo/gone, delete: true}]
"""


def test_dry_run_prints_the_plan_as_a_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "space.yaml"
    path.write_text(SPACE)
    assert main(["journals", "apply", "-f", str(path), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "ACTION", "REPLICATION", "CODEC", "STORES"]
    assert lines[1].split() == ["demo/words", "upsert", "1", "ZSTANDARD"]
    assert lines[2].split() == ["demo/counts", "upsert", "3", "ZSTANDARD"]
    assert lines[3].split() == ["demo/gone", "delete"]


def test_dry_run_json_carries_full_specs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "space.yaml"
    path.write_text(SPACE)
    assert main(["journals", "apply", "-f", str(path), "--dry-run", "--format", "json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert records[1]["spec"]["fragment"]["refresh_interval"] == "30s"
    assert records[1]["spec"]["replication"] == 3


def test_invalid_space_exits_2_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "space.yaml"
    path.write_text(SPACE.replace("length: 4096", "length: 12"))
    assert main(["journals", "apply", "-f", str(path), "--dry-run"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "root.children[0] (demo/words): fragment.length: must be in [1024," in err
