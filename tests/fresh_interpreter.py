"""Run code in a fresh Python interpreter, as a Spark worker or a command-line tool starts, and
report which modules it imported: what import-cost tests check (a lazy name imported only when
used, a worker or a URL scheme pulling in no SDK it does not need). The child imports this
checkout's code (PYTHONPATH), whatever the test's own environment says."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

REPO: Final = Path(__file__).resolve().parents[1]
# A fresh interpreter that imports a few packages takes a second or two; this is a hang.
fresh_interpreter_timeout_s: Final = 60.0


def run_fresh(code: str, **env: str) -> str:
    """What `code` prints (stripped) when run by a fresh interpreter, with `env` added to the
    environment. A failure of the child raises CalledProcessError (its stderr captured)."""
    return _run(code, env).strip()


def imported_of(code: str, modules: Sequence[str], **env: str) -> tuple[str, list[str]]:
    """Run `code` in a fresh interpreter: what it printed (stripped), and which of `modules`
    were imported once it had run (in the order given)."""
    probe = (
        f"{code}\n"
        "import sys as _sys\n"
        f"print({_MARK!r} + ','.join(m for m in {tuple(modules)!r} if m in _sys.modules))\n"
    )
    printed, mark, loaded = _run(probe, env).rpartition(_MARK)
    assert mark, "the probe printed no report"
    return printed.strip(), [m for m in loaded.strip().split(",") if m]


_MARK: Final = "\nimported: "


def _run(code: str, env: dict[str, str]) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=fresh_interpreter_timeout_s,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
    )
    return out.stdout
