"""gazctl on bad input: every malformed document is one line on stderr, naming where (file and
line) and what (the field path and the rule), with exit status 2, and nothing applied. Never a
traceback, whatever the bytes.

The tables cover the families around each reported case: duplicate keys (at every level),
unknown fields, wrong types (`fragment: 5` and its kin), malformed YAML, non-UTF-8 bytes, deep
nesting, alias expansion, and input without bound (`-f /dev/zero`). Journal and shard spaces
are both checked, as they share the strict loader. Offline (`--dry-run`): the point is what
gazctl refuses before any RPC.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.cli.gazctl import EXIT_BAD_INPUT, EXIT_FAILED, main, parse_args, run
from broker.cli.journalspace import JournalSpaceError, parse_journal_space
from broker.cli.shardspace import ShardSpaceError, parse_shard_space
from broker.cli.strict_yaml import yaml_bytes_max, yaml_depth_max

JOURNAL_BASE = (
    "name: demo/a\nreplication: 1\n"
    "fragment: {length: 4096, compression_codec: NONE, refresh_interval: 30s}\n"
)
SHARD_BASE = "common: {max_txn_duration: 1s}\nshards:\n- id: shard-000\n"

# (document, regex the one-line message must match). Line numbers are part of the contract.
JOURNAL_CASES: list[tuple[str | bytes, str]] = [
    # Duplicate keys: silently "last wins" before.
    ("name: demo/a\nname: demo/b\n", r":2: duplicate key 'name' \(first at line 1\)"),
    (
        JOURNAL_BASE + "fragment: {length: 8192}\n",
        r":4: duplicate key 'fragment' \(first at line 3\)",
    ),
    (
        "name: demo/a\nfragment:\n  length: 4096\n  length: 8192\n",
        r":4: duplicate key 'length' \(first at line 3\)",
    ),
    (
        "name: demo/\nchildren:\n- name: demo/a\n  replication: 1\n  replication: 2\n",
        r":5: duplicate key 'replication' \(first at line 4\)",
    ),
    # Unknown fields, at every level.
    (JOURNAL_BASE + "replicaton: 1\n", r":4: root: unknown field 'replicaton'"),
    (
        "name: demo/a\nfragment:\n  length: 4096\n  lenght: 1\n",
        r":4: root\.fragment: unknown field 'lenght'",
    ),
    (
        JOURNAL_BASE + "labels:\n- {name: tag, value: x, colour: red}\n",
        r":5: root\.labels\[0\]: unknown field 'colour'",
    ),
    (
        "name: demo/\nchildren:\n- name: demo/a\n  suspend: {levl: FULL}\n",
        r":4: root\.children\[0\]\.suspend: unknown field 'levl'",
    ),
    # Wrong types: tracebacks before.
    (
        "name: demo/a\nreplication: 1\nfragment: 5\n",
        r":3: root\.fragment: must be a mapping \(got 5\)",
    ),
    ("name: demo/a\nfragment: [1, 2]\n", r":2: root\.fragment: must be a mapping \(got a list\)"),
    ("name: demo/a\nlabels: 5\n", r":2: root\.labels: must be a list of labels \(got 5\)"),
    ("name: demo/a\nlabels: [5]\n", r":2: root\.labels\[0\]: must be a mapping \(got 5\)"),
    ("name: demo/a\nlabels: [{name: [x]}]\n", r":2: root\.labels\[0\]\.name: must be a string"),
    (
        "name: demo/a\nreplication: three\n",
        r":2: root\.replication: must be an integer \(got 'three'\)",
    ),
    ("name: demo/a\nreplication: 1.5\n", r":2: root\.replication: must be an integer \(got 1\.5\)"),
    (
        "name: demo/a\nreplication: true\n",
        r":2: root\.replication: must be an integer \(got True\)",
    ),
    (
        "name: demo/a\nreplication: 99999999999999999999\n",
        r":2: root\.replication: must be in \[-2147483648, 2147483647\]",
    ),
    ("name: demo/a\nfragment: {length: .inf}\n", r":2: root\.fragment\.length: must be an integer"),
    ("name: demo/a\nfragment: {compression_codec: 7}\n", r"root\.fragment\.compression_codec"),
    (
        "name: demo/a\nfragment: {compression_codec: BROTLI}\n",
        r":2: root\.fragment\.compression_codec: must be one of",
    ),
    (
        "name: demo/a\nfragment: {stores: s3://bucket/}\n",
        r":2: root\.fragment\.stores: must be a list",
    ),
    (
        "name: demo/a\nfragment: {refresh_interval: 30}\n",
        r"root\.fragment\.refresh_interval: must be a duration",
    ),
    (
        "name: demo/a\nflags: O_BOGUS\n",
        r":2: root\.flags: must be one of NOT_SPECIFIED, O_RDONLY, O_WRONLY, O_RDWR or an integer",
    ),
    ("name: [demo/a]\n", r":1: root\.name: must be a string \(got a list"),
    ("name: demo/\nchildren: 5\n", r":2: root\.children: must be a list"),
    ("name: demo/\nchildren: [5]\n", r"root\.children\[0\]: must be a mapping"),
    ("name: demo/a\ndelete: maybe\n", r":2: root\.delete: must be true or false \(got 'maybe'\)"),
    # Revisions: an integer >= -1, on journals only.
    (JOURNAL_BASE + "revision: x\n", r":4: root\.revision: must be an integer >= -1 \(got 'x'\)"),
    (JOURNAL_BASE + "revision: -2\n", r":4: root\.revision: must be an integer >= -1"),
    (
        "name: demo/\nrevision: 3\nchildren: [{name: demo/a}]\n",
        r"root\.revision: only a journal has a revision, not a directory",
    ),
    ("name: ''\n", r":1: root\.name: is required"),
    ('name: demo/a\nlabels: [{name: tag, value: "\\ud800"}]\n', r":2: .*invalid Unicode"),
    # Not a journal space at all.
    ("", r"root: must be a mapping with at least a 'name' \(got nothing\)"),
    ("- 1\n", r"root: must be a mapping with at least a 'name'"),
    ("just text\n", r"root: must be a mapping with at least a 'name'"),
    ("name: demo/a\n---\nname: demo/b\n", r":2: not valid YAML: expected a single document"),
    ("? [a, b]\n: c\n", r":1: .*key"),
    # Malformed YAML: one line with the position.
    ("name: demo/a\n\tfragment: {}\n", r":2: .*(tab|indentation|found character)"),
    ("name: 'demo/a\n", r":\d+: .*(end of stream|quoted scalar)"),
    ('name: "\\q"\n', r":1: .*escape"),
    ("name: demo/a\x00\n", r":1: not valid YAML: (special|control) characters are not allowed"),
    ("name: &a demo/a\nx: *b\n", r":2: .*undefined alias"),
    ("name: !!python/object:os.system demo\n", r":1: .*(constructor|tag)"),
    # Bytes that are not UTF-8.
    (
        b"name: demo/a\nlabels: [{name: tag, value: \xff\xfe}]\n",
        r":2: not UTF-8 \(byte 0xff at offset 41\)",
    ),
    (b"\xef\xbb\xbfname: demo/\xc3\n", r":1: not UTF-8"),
    # Nesting and expansion without bound.
    # (libyaml's own bound on flow nesting may be met first: either way, one line.)
    ("x: " + "[" * 1000 + "]" * 1000 + "\n", r":1: .*nesting"),
    (
        "x: " + "{a: " * 1000 + "1" + "}" * 1000 + "\n",
        rf":1: nesting deeper than yaml_depth_max \({yaml_depth_max}\)",
    ),
    (
        "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
        + "".join(
            f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n"
            for i in range(9)
        )
        + "name: demo/a\nlabels: *j\n",
        r"expands to more than \d+ values",
    ),
]

SHARD_CASES: list[tuple[str | bytes, str]] = [
    (SHARD_BASE + "  id: shard-001\n", r":4: duplicate key 'id' \(first at line 3\)"),
    ("common: {}\ncommon: {}\nshards: []\n", r":2: duplicate key 'common' \(first at line 1\)"),
    (SHARD_BASE + "  ring: 3\n", r":4: shards\[0\]: unknown field 'ring'"),
    (SHARD_BASE + "  sources: 5\n", r":4: shards\[0\]\.sources: must be a list"),
    (
        SHARD_BASE + "  sources: [{journal: a/b, colour: x}]\n",
        r":4: shards\[0\]\.sources\[0\]: unknown field 'colour'",
    ),
    (
        SHARD_BASE + "  hot_standbys: -1\n",
        r":4: shards\[0\]\.hot_standbys: must be in \[0, 4294967295\]",
    ),
    (SHARD_BASE + "  labels: {name: x}\n", r":4: shards\[0\]\.labels: unknown field 'name'"),
    (SHARD_BASE + "  labels: x\n", r":4: shards\[0\]\.labels: must be a list of labels"),
    (SHARD_BASE + "  disable: 1\n", r":4: shards\[0\]\.disable: must be true or false \(got 1\)"),
    ("common: 5\nshards: []\n", r":1: common: must be a mapping"),
    ("shards: [5]\n", r":1: shards\[0\]: must be a mapping with at least an 'id'"),
    (b"shards: []\n\xff\n", r":2: not UTF-8"),
    ("shards: " + "[" * 1000 + "]" * 1000 + "\n", r":1: .*nesting"),
    (
        "shards:\n" + "".join("  " * i + "- \n" for i in range(1, 200)),
        r"nesting deeper than yaml_depth_max",
    ),
]


def _run(
    tmp_path: Path, noun: str, document: str | bytes, capsys: pytest.CaptureFixture[str]
) -> str:
    path = tmp_path / "input.yaml"
    if isinstance(document, bytes):
        path.write_bytes(document)
    else:
        path.write_text(document, encoding="utf-8", errors="surrogatepass")
    status = main([noun, "apply", "-f", str(path), "--dry-run"])
    captured = capsys.readouterr()
    assert status == EXIT_BAD_INPUT, captured
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"gazctl: {path}"), lines[0]
    assert "Traceback" not in captured.err
    return lines[0]


@pytest.mark.parametrize(("document", "pattern"), JOURNAL_CASES)
def test_bad_journal_spaces_are_one_line_naming_line_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], document: str | bytes, pattern: str
) -> None:
    line = _run(tmp_path, "journals", document, capsys)
    assert re.search(pattern, line), line


@pytest.mark.parametrize(("document", "pattern"), SHARD_CASES)
def test_bad_shard_spaces_are_one_line_naming_line_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], document: str | bytes, pattern: str
) -> None:
    line = _run(tmp_path, "shards", document, capsys)
    assert re.search(pattern, line), line


def test_a_document_over_the_size_limit_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    document = JOURNAL_BASE + "#" * yaml_bytes_max
    line = _run(tmp_path, "journals", document, capsys)
    assert line.endswith(f"larger than yaml_bytes_max ({yaml_bytes_max} bytes)"), line


def test_a_missing_file_and_a_directory_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for path in (tmp_path / "missing.yaml", tmp_path):
        assert main(["journals", "apply", "-f", str(path), "--dry-run"]) == EXIT_BAD_INPUT
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("gazctl: ") and str(path) in err, err


def _gazctl_process(*argv: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run(
        [sys.executable, "-m", "broker.cli.gazctl", *argv],
        input=stdin,
        capture_output=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_dev_zero_fails_fast_with_one_line() -> None:
    started = time.monotonic()
    done = _gazctl_process("journals", "apply", "-f", "/dev/zero", "--dry-run")
    elapsed = time.monotonic() - started
    assert done.returncode == EXIT_BAD_INPUT
    assert done.stderr.decode() == (
        f"gazctl: /dev/zero: larger than yaml_bytes_max ({yaml_bytes_max} bytes)\n"
    )
    assert elapsed < 30, elapsed  # Bounded: it stops reading at the limit.


def test_stdin_that_is_not_utf8_is_one_line() -> None:
    done = _gazctl_process("shards", "apply", "-f", "-", "--dry-run", stdin=b"shards: [\xc0]\n")
    assert done.returncode == EXIT_BAD_INPUT
    assert done.stderr.decode() == "gazctl: <stdin>:1: not UTF-8 (byte 0xc0 at offset 9)\n"


def test_an_unexpected_error_is_one_line_and_debug_shows_its_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug (here: a parsed command missing its file, as no parser would leave it) is still one
    line, exit status 1; --debug (or GAZCTL_DEBUG=1) adds its traceback, for a bug report."""
    args = argparse.Namespace(noun="journals", verb="apply", broker="127.0.0.1:1", debug=False)
    assert asyncio.run(run(args)) == EXIT_FAILED
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("gazctl: unexpected error: AttributeError:"), err
    assert "--debug" in err

    args.debug = True
    assert asyncio.run(run(args)) == EXIT_FAILED
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and "AttributeError" in err
    assert err.splitlines()[-1].startswith("gazctl: unexpected error: AttributeError:")

    monkeypatch.setenv("GAZCTL_DEBUG", "1")
    assert parse_args(["journals", "list"]).debug is True
    monkeypatch.setenv("GAZCTL_DEBUG", "0")
    assert parse_args(["journals", "list"]).debug is False


def test_gazette_yaml_forms_are_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Strictness refuses nothing Gazette's gazctl reads: flags by name, merge keys overriding
    what they merge, anchors and aliases, nulls for unset fields, the message form of labels."""
    document = (
        "name: demo/\n"
        "replication: 1\n"
        "fragment: &frag {length: 4096, compression_codec: NONE, refresh_interval: 30s}\n"
        "labels: {labels: [{name: tag, value: x}]}\n"
        "children:\n"
        "- name: demo/read-only\n"
        "  flags: O_RDONLY\n"
        "- name: demo/merged\n"
        "  fragment: {<<: *frag, length: 8192}\n"
        "  suspend: ~\n"
        "  comment: a merge key, overridden\n"
    )
    path = tmp_path / "space.yaml"
    path.write_text(document)
    assert main(["journals", "apply", "-f", str(path), "--dry-run", "--format", "json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in records] == ["demo/read-only", "demo/merged"]
    assert records[0]["spec"]["flags"] == 1  # O_RDONLY
    assert records[1]["spec"]["fragment"]["length"] == 8192
    assert records[1]["spec"]["fragment"]["refresh_interval"] == "30s"
    assert records[1]["spec"]["labels"] == [{"name": "tag", "value": "x"}]


def test_a_number_where_a_string_is_due_says_to_quote_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = _run(tmp_path, "journals", JOURNAL_BASE + "labels: [{name: tag, value: 1}]\n", capsys)
    assert line.endswith(
        ":4: root.labels[0].value: must be a string (got 1; quote it if it is one)"
    )


# --- Fuzzing: whatever the document, a spec list or one typed error ---------------------------

_KEY_NAMES = [
    *("name", "children", "delete", "comment", "replication", "fragment", "labels", "flags"),
    *("max_append_rate", "suspend", "length", "compression_codec", "stores", "level", "offset"),
    *("refresh_interval", "retention", "flush_interval", "path_postfix_template", "value"),
    *("common", "shards", "id", "sources", "journal", "min_offset", "max_txn_duration"),
    *("hot_standbys", "hint_prefix", "recovery_log_prefix", "hint_backups", "revision"),
]
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["demo/", "demo/a", "30s", "NONE", "O_RDWR", "s3://b/", "x", "", "1h"]),
    st.text(max_size=12),
)
_DOCUMENTS = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(_KEY_NAMES) | st.text(max_size=6), inner, max_size=6)
    ),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(_DOCUMENTS)
def test_any_yaml_document_is_specs_or_one_typed_error(document: object) -> None:
    text = yaml.safe_dump(document, allow_unicode=True)
    for parse, error in (
        (parse_journal_space, JournalSpaceError),
        (parse_shard_space, ShardSpaceError),
    ):
        try:
            parse(text)
        except error as exc:
            assert "\n" not in str(exc)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_are_specs_or_one_typed_error(data: bytes) -> None:
    for parse, error in (
        (parse_journal_space, JournalSpaceError),
        (parse_shard_space, ShardSpaceError),
    ):
        try:
            parse(data)
        except error as exc:
            assert "\n" not in str(exc)
