"""The hierarchical journal-space YAML: inheritance, validation and round trips."""

from __future__ import annotations

import pytest
from google.protobuf.duration_pb2 import Duration

from broker.cli.errors import CommandError
from broker.cli.journalspace import (
    JournalSpaceError,
    format_go_duration,
    parse_go_duration,
    parse_journal_space,
    spec_to_yaml_dict,
)
from broker.protocol import protocol_pb2 as pb

DOC = """
name: examples/
replication: 2
fragment:
  length: 4194304
  compression_codec: ZSTANDARD
  stores: [file:///tmp/fragments/]
  refresh_interval: 30s
  flush_interval: 1h
children:
  - name: examples/words
    labels: [{name: content-type, value: application/x-ndjson}]
  - name: examples/counts
    replication: 1
    fragment: {compression_codec: GZIP}
  - name: examples/old
    delete: true
"""


def test_children_inherit_and_override() -> None:
    nodes = parse_journal_space(DOC)
    assert [name for _, name in nodes] == ["examples/words", "examples/counts", "examples/old"]
    words, counts, old = (spec for spec, _ in nodes)
    assert old is None
    assert words is not None and counts is not None
    assert words.replication == 2
    assert words.fragment.compression_codec == pb.CompressionCodec.ZSTANDARD
    assert words.fragment.refresh_interval.seconds == 30
    assert words.fragment.flush_interval.seconds == 3600
    assert [(label.name, label.value) for label in words.labels.labels] == [
        ("content-type", "application/x-ndjson")
    ]
    # Overrides apply field by field, the rest of the parent's fragment is kept.
    assert counts.replication == 1
    assert counts.fragment.compression_codec == pb.CompressionCodec.GZIP
    assert counts.fragment.length == 4194304
    assert list(counts.fragment.stores) == ["file:///tmp/fragments/"]


def test_round_trip_through_yaml_dict() -> None:
    spec, _ = parse_journal_space(DOC)[0]
    assert spec is not None
    import yaml

    again = parse_journal_space(yaml.safe_dump(spec_to_yaml_dict(spec)))
    assert again[0][0] == spec


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            "name: a/\nchildren: [{name: b/c}]",
            "root.children[0].name: must extend its parent's name 'a/'",
        ),
        ("name: a/b\nchildren: []", "root.name: a node with children must end in '/'"),
        ("name: a/\n", "root.name: a journal name must not end in '/'"),
        ("- 1", "root: must be a mapping with at least a 'name'"),
        (
            "name: test/a/b\nreplication: 9\nfragment: {length: 4096, compression_codec: NONE}",
            "replication",
        ),
        ("name: a/b\nreplicaton: 1", "<input>:2: root: unknown field 'replicaton'"),
        (
            "name: a/b\nfragment: {flush_interval: soon}",
            "root.fragment.flush_interval: must be a duration",
        ),
        (
            "name: test/\nreplication: 1\nfragment: {length: 4096, compression_codec: NONE, refresh_interval: 30s}\nchildren: [{name: test/x}, {name: test/x}]",
            "declared more than once",
        ),
        (": :\n  - [", "<input>:1: not valid YAML: while parsing a block mapping"),
    ],
)
def test_bad_documents_name_the_node_and_rule(doc: str, message: str) -> None:
    with pytest.raises(JournalSpaceError) as info:
        parse_journal_space(doc)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("1h30m", 5400), ("1m0s", 60), ("250ms", 0.25), ("24h", 86400)],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_go_duration(text, "x") == seconds
    assert parse_go_duration(format_go_duration(seconds), "x") == seconds


def test_a_listed_spec_with_an_invalid_duration_is_named_not_a_traceback() -> None:
    # Stored by an older broker: it cannot render, and gazctl says which journal it is.
    spec = pb.JournalSpec(name="a/mixed")
    spec.fragment.retention.CopyFrom(Duration(seconds=1, nanos=-1))
    with pytest.raises(CommandError) as info:
        spec_to_yaml_dict(spec)
    assert str(info.value).startswith(
        "journal 'a/mixed': fragment.retention: seconds and nanos must have the same sign"
    )
