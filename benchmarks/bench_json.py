"""The machine-readable output of the benchmark scripts (`--json FILE`), read by bench_all.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_figures(path: str | Path, figures: dict[str, Any]) -> None:
    """Write one script's figures as JSON (a plain function: scripts call it at their end)."""
    Path(path).write_text(json.dumps(figures, indent=2) + "\n")
