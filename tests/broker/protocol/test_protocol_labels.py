"""LabelSet helpers keep (name, value) order; well-known names and meta-labels."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import (
    add_value,
    journal_meta_labels,
    label_set,
    remove,
    set_value,
    shard_meta_labels,
    union,
    value_of,
    values_of,
)
from broker.protocol.validate import validate_label_set


def _pairs(labels: pb.LabelSet) -> list[tuple[str, str]]:
    return [(label.name, label.value) for label in labels.labels]


def test_add_set_and_remove_keep_order() -> None:
    labels = pb.LabelSet()
    add_value(labels, "bb", "3")  # Insert into empty.
    add_value(labels, "aa", "0")  # Insert at the beginning.
    add_value(labels, "bb", "1")  # Insert in the middle.
    add_value(labels, "aa", "2")  # Insert in the middle.
    add_value(labels, "bb", "3")  # Repeat: no-op.
    add_value(labels, "bb", "4")  # Insert at the end.
    assert _pairs(labels) == [("aa", "0"), ("aa", "2"), ("bb", "1"), ("bb", "3"), ("bb", "4")]

    set_value(labels, "bb", "5")  # Replace a run at the end.
    set_value(labels, "cc", "6")  # Insert at the end.
    set_value(labels, "00", "6")  # Insert at the beginning.
    assert _pairs(labels) == [("00", "6"), ("aa", "0"), ("aa", "2"), ("bb", "5"), ("cc", "6")]

    set_value(labels, "00", "7")  # Replace at the beginning.
    set_value(labels, "aa", "8")  # Replace a run in the middle.
    assert _pairs(labels) == [("00", "7"), ("aa", "8"), ("bb", "5"), ("cc", "6")]

    add_value(labels, "bb", "9")
    add_value(labels, "00", "00")
    remove(labels, "bb")  # Remove from the middle.
    remove(labels, "bb")  # Not found.
    assert _pairs(labels) == [("00", "00"), ("00", "7"), ("aa", "8"), ("cc", "6")]
    remove(labels, "0")  # Not found, before the beginning.
    remove(labels, "00")  # Remove from the beginning.
    remove(labels, "dd")  # Not found, past the end.
    remove(labels, "cc")  # Remove from the end.
    assert _pairs(labels) == [("aa", "8")]
    remove(labels, "aa")
    assert _pairs(labels) == []


def test_values_of_and_value_of() -> None:
    labels = label_set(
        [("DDDD", "111"), ("aaa", "222"), ("aaa", "333"), ("aaa", "444"), ("ccc", ""), ("ff", "5")]
    )
    validate_label_set(labels)
    cases = [
        ("aa", [], ""),
        ("aaa", ["222", "333", "444"], "222"),
        ("bbb", [], ""),
        ("ccc", [""], ""),
        ("ddd", [], ""),
        ("DDDD", ["111"], "111"),
        ("eee", [], ""),
        ("ff", ["5"], "5"),
        ("zz", [], ""),
    ]
    for name, values, value in cases:
        assert values_of(labels, name) == values, name
        assert value_of(labels, name) == value, name


def test_prefix_suffix_marks_selector_labels() -> None:
    labels = label_set([("a", "aa"), ("c", "cc"), ("d", "dd")])
    add_value(labels, "b:prefix", "bb.1")
    set_value(labels, "d:prefix", "dd.2")
    assert [(lb.name, lb.value, lb.prefix) for lb in labels.labels] == [
        ("a", "aa", False),
        ("b", "bb.1", True),
        ("c", "cc", False),
        ("d", "dd.2", True),
    ]


def test_label_set_sorts_and_deduplicates() -> None:
    labels = label_set([("b", "2"), ("a", "1"), ("b", "1"), ("a", "1")])
    assert _pairs(labels) == [("a", "1"), ("b", "1"), ("b", "2")]
    assert label_set() == pb.LabelSet()


@settings(max_examples=200)
@given(st.lists(st.tuples(st.sampled_from(["aa", "bb", "cc", "Zz"]), st.text("xy=%", max_size=3))))
def test_any_insertion_order_gives_the_sorted_unique_set(pairs: list[tuple[str, str]]) -> None:
    labels = label_set(pairs)
    assert _pairs(labels) == sorted(set(pairs))


def test_journal_meta_labels() -> None:
    assert _pairs(journal_meta_labels("a/b/c")) == [
        ("name", "a/b/c"),
        ("prefix", "a/"),
        ("prefix", "a/b/"),
    ]
    assert _pairs(journal_meta_labels("abcd")) == [("name", "abcd")]
    assert _pairs(shard_meta_labels("shard-1")) == [("id", "shard-1")]


def test_union_prefers_left_values() -> None:
    lhs = label_set([("bbb", "val-1"), ("bbb", "val-2"), ("ccc", "val-3")])
    rhs = label_set([("aaa", "val-4"), ("aaa", "val-5"), ("bbb", "val-6"), ("ddd", "val-7")])
    assert _pairs(union(lhs, rhs)) == [
        ("aaa", "val-4"),
        ("aaa", "val-5"),
        ("bbb", "val-1"),
        ("bbb", "val-2"),
        ("ccc", "val-3"),
        ("ddd", "val-7"),
    ]


def test_well_known_names() -> None:
    assert gl.CONTENT_TYPE == "content-type"
    assert gl.CONTENT_TYPE_JSON_LINES == "application/x-ndjson"
    assert gl.CONTENT_TYPE_PROTO_FIXED == "application/x-protobuf-fixed"
    assert gl.CONTENT_TYPE_RECOVERY_LOG == "application/x-gazette-recoverylog"
    assert gl.SINGLE_VALUE_LABELS == {
        "content-type",
        "app.gazette.dev/instance",
        "app.gazette.dev/managed-by",
        "app.gazette.dev/message-subtype",
        "app.gazette.dev/message-type",
        "gazette.dev/replication-mode",
        "gazette.dev/checkpoint-ahead",
        "app.gazette.dev/region",
    }
    assert gl.TAG not in gl.SINGLE_VALUE_LABELS
