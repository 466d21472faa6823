"""Shard-space YAML (Gazette's shardspace): common fields pushed down into each shard, hoisted
back out, revisions and deletions, and every malformed document refused with its path."""

from __future__ import annotations

import pytest
import yaml
from google.protobuf.duration_pb2 import Duration

from broker.cli.errors import CommandError
from broker.cli.shardspace import (
    ShardSpaceError,
    hoist,
    parse_shard_space,
    push_down,
    shard_space_doc,
    spec_to_yaml,
)
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import protocol_pb2 as pb

# Gazette's own shardspace fixture (consumer/shardspace/shardspace_test.go), verbatim but for
# the ``delete`` of shard-A, which it pairs with a spec to round-trip the field.
GAZETTE_YAML = """\
common:
  recovery_log_prefix: recovery/logs
  hint_prefix: /hints
  hint_backups: 2
  max_txn_duration: 1s
  min_txn_duration: 1ms
  hot_standbys: 1
  labels:
  - name: name-1
    value: val-1
  disable_wait_for_ack: true
shards:
- comment: This is a comment
  id: shard-A
  sources:
  - journal: journal/A
  labels:
  - name: name-2
    value: val-2
  revision: 123
- id: shard-B
  sources:
  - journal: journal/B
  disable: true
  labels:
  - name: name-3
    value: val-3
  revision: 456
"""


def labels(*pairs: str) -> pb.LabelSet:
    out = pb.LabelSet()
    for i in range(0, len(pairs), 2):
        out.labels.add(name=pairs[i], value=pairs[i + 1])
    return out


def flat(shard: str, journal: str, *extra: str, disable: bool = False) -> cpb.ShardSpec:
    return cpb.ShardSpec(
        id=shard,
        sources=[cpb.ShardSpec.Source(journal=journal)],
        recovery_log_prefix="recovery/logs",
        hint_prefix="/hints",
        hint_backups=2,
        max_txn_duration=Duration(seconds=1),
        min_txn_duration=Duration(nanos=1_000_000),
        disable=disable,
        hot_standbys=1,
        labels=labels("name-1", "val-1", *extra),
        disable_wait_for_ack=True,
    )


def test_gazettes_fixture_pushes_down_into_full_specs() -> None:
    changes = parse_shard_space(GAZETTE_YAML)
    assert [(c.id, c.revision, c.comment) for c in changes] == [
        ("shard-A", 123, "This is a comment"),
        ("shard-B", 456, ""),
    ]
    assert changes[0].spec == flat("shard-A", "journal/A", "name-2", "val-2")
    assert changes[1].spec == flat("shard-B", "journal/B", "name-3", "val-3", disable=True)
    assert changes[1].to_change() == cpb.ApplyRequest.Change(
        upsert=changes[1].spec, expect_mod_revision=456
    )


def test_hoisting_writes_the_fixture_back() -> None:
    listing = [
        (flat("shard-A", "journal/A", "name-2", "val-2"), 123),
        (flat("shard-B", "journal/B", "name-3", "val-3", disable=True), 456),
    ]
    doc = shard_space_doc(listing)
    expected = yaml.safe_load(GAZETTE_YAML)
    del expected["shards"][0]["comment"]
    assert doc == expected
    # And what list writes, apply reads back to the same specs.
    assert [(c.spec, c.revision) for c in parse_shard_space(yaml.safe_dump(doc))] == listing


def test_push_down_fills_only_unset_fields_and_unites_labels() -> None:
    common = cpb.ShardSpec(hot_standbys=2, disable=True, labels=labels("team", "a"))
    shard = cpb.ShardSpec(id="s-01", hot_standbys=1, labels=labels("tier", "gold"))
    out = push_down(common, shard)
    assert out.hot_standbys == 1 and out.disable  # A zero (false) field inherits, as in Gazette.
    assert [(lb.name, lb.value) for lb in out.labels.labels] == [("team", "a"), ("tier", "gold")]
    common2, rest = hoist([out, out])
    assert [push_down(common2, r) for r in rest] == [out, out]


def test_deletions_and_revisions() -> None:
    changes = parse_shard_space(
        "shards:\n"
        "- {id: shard-a, max_txn_duration: 500ms}\n"
        "- {id: shard-b, delete: true, revision: 7}\n"
        "- {id: shard-c, max_txn_duration: 1m30s, revision: -1}\n"
    )
    assert [(c.id, c.spec is None, c.revision) for c in changes] == [
        ("shard-a", False, 0),
        ("shard-b", True, 7),
        ("shard-c", False, -1),
    ]
    assert changes[0].spec is not None and changes[0].spec.max_txn_duration.ToMilliseconds() == 500
    assert changes[2].spec is not None and changes[2].spec.max_txn_duration.seconds == 90
    assert changes[1].to_change() == cpb.ApplyRequest.Change(
        delete="shard-b", expect_mod_revision=7
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("shards: [", ":2: not valid YAML: while parsing a flow node"),
        ("- id: a", "document: must be a mapping with 'shards'"),
        ("shards: []\nextra: 1", r":2: document: unknown field 'extra'"),
        ("common: {id: x}\nshards: []", "common.id: a common spec has no ID"),
        ("common: {hot_standby: 1}\nshards: []", r":1: common: unknown field 'hot_standby'"),
        ("shards: {id: a}", "shards: must be a list"),
        ("shards: [{max_txn_duration: 1s}]", r"shards\[0\].id: is required"),
        ("shards: [{id: shard-a}]", r"shards\[0\] \(shard-a\): max_txn_duration: must be > 0s"),
        (
            "shards: [{id: shard-a, max_txn_duration: soon}]",
            r"shards\[0\].max_txn_duration: must be a duration",
        ),
        (
            "shards: [{id: shard-a, max_txn_duration: 1s, hot_standbys: many}]",
            r":1: shards\[0\]\.hot_standbys: must be an integer \(got 'many'\)",
        ),
        (
            "shards: [{id: shard-a, max_txn_duration: 1s, revision: -2}]",
            r"shards\[0\].revision: must be an integer >= -1",
        ),
        (
            "common: {max_txn_duration: 1s}\nshards: [{id: shard-a}, {id: shard-a}]",
            r"shards\[1\].id: 'shard-a' is declared twice",
        ),
        (
            "common: {max_txn_duration: 1s}\nshards: [{id: 'bad#id'}]",
            r"shards\[0\] \(bad#id\): id: must",
        ),
    ],
)
def test_malformed_documents_are_refused_with_their_path(text: str, message: str) -> None:
    with pytest.raises(ShardSpaceError, match=message):
        parse_shard_space(text)


def test_one_shard_hoists_everything_but_its_id() -> None:
    spec = flat("shard-A", "journal/A")
    doc = shard_space_doc([(spec, 9)])
    assert doc["shards"] == [{"id": "shard-A", "revision": 9}]
    [change] = parse_shard_space(yaml.safe_dump(doc))
    assert (change.spec, change.revision) == (spec, 9)


def test_a_listed_spec_with_an_invalid_duration_is_named_not_a_traceback() -> None:
    # Stored by an older broker: it cannot render, and gazctl says which shard it is.
    spec = flat("shard-A", "journal/A")
    spec.max_txn_duration.CopyFrom(Duration(nanos=2_000_000_000))
    with pytest.raises(CommandError) as info:
        shard_space_doc([(spec, 9)])
    assert str(info.value).startswith(
        "shard 'shard-A': max_txn_duration: nanos must be in [-999999999, 999999999]"
    )
    with pytest.raises(CommandError):
        spec_to_yaml(spec)
