"""Instructions a benchmark script executes, counted by valgrind (cachegrind or callgrind): a
figure that does not move with the machine's load (read_instructions.py,
publish_instructions.py run themselves under it, N messages minus none)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

_TOTAL = re.compile(r"^(?:==\d+== )?(?:I\s+refs|Collected)\s*:\s*([\d,]+)", re.MULTILINE)


def instructions(
    tool: str, out: Path, script: str, args: list[str], env: dict[str, str] | None = None
) -> int:
    """Run `script` with `args` under valgrind's `tool`: the instructions it executed."""
    cmd = [
        "valgrind",
        f"--tool={tool}",
        f"--{tool}-out-file={out}",
        *(["--cache-sim=no"] if tool == "cachegrind" else []),
        sys.executable,
        script,
        *args,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-4000:]}")
    found = _TOTAL.search(done.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{done.stderr[-4000:]}")
    return int(found.group(1).replace(",", ""))
