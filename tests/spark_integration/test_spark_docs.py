"""docs/spark.md's examples run as written: every fenced python block marked `<!-- example -->`
runs, in order and in one namespace (as a reader pastes them into one session), against a
broker this test starts, and prints exactly the `text` block that follows it ("prints")."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from typing import Any

import pytest

from tests.spark_integration.spark_testkit import REPO, broker_process, create_journals

pytestmark = pytest.mark.spark

DOC = REPO / "docs" / "spark.md"
JOURNALS = [
    "examples/orders",
    "examples/returns",
    "examples/totals",
    "examples/copy",
    *(f"examples/by-key/part-{i}" for i in range(3)),
]
_EXAMPLE = re.compile(
    r"<!-- example -->\n```python\n(?P<code>.*?)```\n(?:\nprints\n\n```text\n(?P<out>.*?)```\n)?",
    re.DOTALL,
)


def examples(text: str) -> list[tuple[str, str | None]]:
    """(code, what it prints, or None) of each marked example, in order."""
    return [(m["code"], m["out"]) for m in _EXAMPLE.finditer(text)]


def test_every_marked_block_is_found() -> None:
    text = DOC.read_text()
    found = examples(text)
    assert len(found) == text.count("<!-- example -->")  # None is malformed and skipped.
    assert len(found) >= 8
    assert sum(1 for _code, out in found if out is not None) >= 7


def test_docs_examples_run_as_written(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broker").mkdir()
    with broker_process(tmp_path / "broker") as port:
        broker = f"127.0.0.1:{port}"
        create_journals(broker, JOURNALS)
        monkeypatch.setenv("GAZETTE_BROKER", broker)
        namespace: dict[str, Any] = {"__name__": "docs_spark_md"}
        for index, (code, expected) in enumerate(examples(DOC.read_text())):
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                exec(compile(code, f"docs/spark.md example {index}", "exec"), namespace)
            if expected is not None:
                assert printed.getvalue().rstrip() == expected.rstrip(), f"example {index}"
