"""A scripted $EDITOR for the tests of ``gazctl ... edit``: a real program, run by gazctl as a
user's editor would be, doing one scripted step per invocation.

    editor = ScriptedEditor(tmp_path, [Replace("replication: 1", "replication: 2"), Keep()])
    monkeypatch.setenv("EDITOR", editor.command)

Each invocation records the file as the editor saw it (`seen`), then applies its step:
`Replace` substitutes text (failing loudly if absent), `Empty` empties the file, `Keep` saves
it unchanged, `Fail` exits with a status, and `Run` runs a command first (e.g. a concurrent
`gazctl journals apply`) then applies its inner step.
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

_SCRIPT = r"""
import json, subprocess, sys
from pathlib import Path

plan_path, target = Path(sys.argv[1]), Path(sys.argv[2])
plan = json.loads(plan_path.read_text())
seen = plan_path.with_suffix(".seen")
views = json.loads(seen.read_text()) if seen.exists() else []
text = target.read_text()
views.append(text)
seen.write_text(json.dumps(views))
if len(views) > len(plan):
    sys.exit(f"editor: invoked {len(views)} times, planned {len(plan)}")
step = plan[len(views) - 1]
if step["kind"] == "run":
    subprocess.run(step["argv"], check=True)
    step = step["then"]
if step["kind"] == "replace":
    if step["old"] not in text:
        sys.exit(f"editor: {step['old']!r} not in the file")
    target.write_text(text.replace(step["old"], step["new"], 1))
elif step["kind"] == "empty":
    target.write_text("\n")
elif step["kind"] == "fail":
    sys.exit(step["status"])
"""


@dataclass
class Replace:
    old: str
    new: str
    kind: str = "replace"


@dataclass
class Empty:
    kind: str = "empty"


@dataclass
class Keep:
    kind: str = "keep"


@dataclass
class Fail:
    status: int = 3
    kind: str = "fail"


@dataclass
class Run:
    argv: list[str]
    then: Any = field(default_factory=Keep)
    kind: str = "run"


class ScriptedEditor:
    def __init__(self, directory: Path, steps: list[Any]) -> None:
        self._script = directory / "editor.py"
        self._script.write_text(_SCRIPT)
        self._plan = directory / "editor-plan.json"
        self._plan.write_text(json.dumps([asdict(s) for s in steps]))

    @property
    def command(self) -> str:
        """The $EDITOR value: gazctl appends the file's path."""
        return shlex.join([sys.executable, str(self._script), str(self._plan)])

    @property
    def seen(self) -> list[str]:
        """The file as the editor saw it, at each invocation."""
        path = self._plan.with_suffix(".seen")
        views: list[str] = json.loads(path.read_text()) if path.exists() else []
        return views
