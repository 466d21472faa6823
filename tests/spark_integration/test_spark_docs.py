"""docs/spark.md's examples run as written: every fenced python block marked `<!-- example -->`
runs, in order and in one namespace (as a reader pastes them into one session), against a
broker process this test starts, and prints exactly the `text` block that follows it ("prints").
The journals persist their fragments to a `file://` store; blocks marked
`<!-- example: brokers stopped -->` run once the broker process has exited (it persists what it
holds as it stops), so that they read nothing but the store."""

from __future__ import annotations

import contextlib
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from broker.protocol import labels
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
# Journals of the CSV and protobuf examples, with their content-types.
TYPED_JOURNALS = [
    ("examples/orders-csv", labels.CONTENT_TYPE_CSV),
    ("examples/events", labels.CONTENT_TYPE_PROTO_FIXED),
]
_EXAMPLE = re.compile(
    r"<!-- example(?P<stopped>: brokers stopped)? -->\n```python\n(?P<code>.*?)```\n"
    r"(?:\nprints\n\n```text\n(?P<out>.*?)```\n)?",
    re.DOTALL,
)
# The store the journals persist to, as the broker names it (under its --file-root).
STORE_PATH = "/frag/"


@dataclass(frozen=True)
class Example:
    code: str
    out: str | None  # What it prints, if the page says.
    brokers_stopped: bool  # To run with no broker alive.


def examples(text: str) -> list[Example]:
    """The marked examples, in order."""
    return [Example(m["code"], m["out"], bool(m["stopped"])) for m in _EXAMPLE.finditer(text)]


def test_every_marked_block_is_found() -> None:
    text = DOC.read_text()
    found = examples(text)
    assert len(found) == text.count("<!-- example")  # None is malformed and skipped.
    assert len(found) >= 9
    assert sum(1 for e in found if e.out is not None) >= 8
    stopped = [i for i, e in enumerate(found) if e.brokers_stopped]
    # The fragment-store example, after every example that needs a broker.
    assert stopped and stopped == list(range(stopped[0], len(found)))


# Every example runs one or more Spark jobs: the test's bound grows with their number (the
# suite's 120 s is for one test doing one thing; at load ~15 the examples took 175 s together).
EXAMPLE_TIMEOUT_S = 25


@pytest.mark.timeout(60 + EXAMPLE_TIMEOUT_S * len(examples(DOC.read_text())))
def test_docs_examples_run_as_written(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "broker"
    (root / STORE_PATH.strip("/")).mkdir(parents=True)  # The broker never creates it.
    monkeypatch.setenv("GAZETTE_STORE", f"file://{root}{STORE_PATH}")
    namespace: dict[str, Any] = {"__name__": "docs_spark_md"}
    found = examples(DOC.read_text())
    with broker_process(root) as port:
        broker = f"127.0.0.1:{port}"
        create_journals(broker, JOURNALS, stores=[f"file://{STORE_PATH}"])
        for journal, content_type in TYPED_JOURNALS:
            create_journals(broker, [journal], content_type=content_type)
        monkeypatch.setenv("GAZETTE_BROKER", broker)
        for index, example in enumerate(found):
            if not example.brokers_stopped:
                _run(example, index, namespace)
    # The broker process has exited (SIGTERM, and waited for): nothing but the store is left.
    for index, example in enumerate(found):
        if example.brokers_stopped:
            _run(example, index, namespace)


def _run(example: Example, index: int, namespace: dict[str, Any]) -> None:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(example.code, f"docs/spark.md example {index}", "exec"), namespace)
    if example.out is not None:
        assert printed.getvalue().rstrip() == example.out.rstrip(), f"example {index}"
