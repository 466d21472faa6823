"""Well-known label names, and helpers over `LabelSet` messages.

A LabelSet is kept sorted and unique over (name, value), so that two sets compare equal exactly
when they hold the same labels, and lookups can bisect. The helpers here maintain that order;
they do not validate (see `validate.validate_label_set`).

Names follow Gazette's labels package, so that journals and shards labelled by Gazette's own
tools mean the same thing here.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from operator import attrgetter

from broker.protocol import protocol_pb2 as pb

# Media type of a journal's content (RFC 1521). Only one value is allowed.
CONTENT_TYPE = "content-type"
CONTENT_TYPE_CSV = "text/csv"
CONTENT_TYPE_JSON_LINES = "application/x-ndjson"
# 4-byte magic word, 4-byte little-endian length, then the packed protobuf message.
CONTENT_TYPE_PROTO_FIXED = "application/x-protobuf-fixed"
# A shard's recovery log journal must carry this content type.
CONTENT_TYPE_RECOVERY_LOG = "application/x-gazette-recoverylog"

# Type of the journal's messages; requires CONTENT_TYPE. Only one value is allowed.
MESSAGE_TYPE = "app.gazette.dev/message-type"
# Sub-type of a union MESSAGE_TYPE; requires MESSAGE_TYPE. Only one value is allowed.
MESSAGE_SUB_TYPE = "app.gazette.dev/message-subtype"
# Free-form tags; any number of values.
TAG = "app.gazette.dev/tag"
# Tool or process which manages the spec. Only one value is allowed.
MANAGED_BY = "app.gazette.dev/managed-by"
# Application release the spec belongs to. Only one value is allowed.
INSTANCE = "app.gazette.dev/instance"
# Geographic region. Only one value is allowed.
REGION = "app.gazette.dev/region"

# How a journal's appends are replicated (docs/design/quorum.md). Absent or "all-replicas":
# Gazette's mode, every route member acknowledges each append. "quorum": a majority commits,
# with terms and fencing. Only one value is allowed; any other value is refused. A label and
# not a JournalSpec field, so that Go clients and gazctl read and write such specs unchanged.
REPLICATION_MODE = "gazette.dev/replication-mode"
REPLICATION_MODE_ALL_REPLICAS = "all-replicas"
REPLICATION_MODE_QUORUM = "quorum"
REPLICATION_MODES = (REPLICATION_MODE_ALL_REPLICAS, REPLICATION_MODE_QUORUM)

# What a shard's primary does when its checkpoint is ahead of a source journal's write head
# (the journal lost content the shard had read: gazette_consumer/source_heads.py). "fail" (or
# absent): the shard FAILS naming the journal. "rewind": the journal is read again from its
# start. "wait": Gazette's behaviour, resume at the checkpoint once the head passes it (what was
# appended below it is skipped). A ShardSpec label; only one value is allowed.
CHECKPOINT_AHEAD = "gazette.dev/checkpoint-ahead"
CHECKPOINT_AHEAD_FAIL = "fail"
CHECKPOINT_AHEAD_REWIND = "rewind"
CHECKPOINT_AHEAD_WAIT = "wait"
CHECKPOINT_AHEAD_POLICIES = (CHECKPOINT_AHEAD_FAIL, CHECKPOINT_AHEAD_REWIND, CHECKPOINT_AHEAD_WAIT)

SINGLE_VALUE_LABELS = frozenset(
    {
        CHECKPOINT_AHEAD,
        CONTENT_TYPE,
        INSTANCE,
        MANAGED_BY,
        MESSAGE_SUB_TYPE,
        MESSAGE_TYPE,
        REGION,
        REPLICATION_MODE,
    }
)

# Meta-labels: derived from a spec's identity at selection time, never stored in the spec.
# "name" is a journal's name; "prefix" is each prefix of it ending in '/'; "id" is a shard's ID.
META_NAME = "name"
META_PREFIX = "prefix"
META_ID = "id"
JOURNAL_RESERVED_LABELS = (META_NAME, META_PREFIX)
SHARD_RESERVED_LABELS = (META_ID,)

# Suffix of a label name which asks a selector to match values by prefix ("team:prefix=a/").
PREFIX_SUFFIX = ":prefix"


def _split_prefix(name: str) -> tuple[str, bool]:
    if name.endswith(PREFIX_SUFFIX):
        return name[: -len(PREFIX_SUFFIX)], True
    return name, False


def _label_key(label: pb.Label) -> tuple[str, str]:
    return label.name, label.value


_label_name = attrgetter("name")


def _name_range(label_set: pb.LabelSet, name: str) -> tuple[int, int]:
    """[begin, end) indices of labels named `name` (an empty range at its insertion point).
    Bisects the set: O(log n) reads of labels, none of the others."""
    labels = label_set.labels
    begin = bisect_left(labels, name, key=_label_name)
    return begin, bisect_right(labels, name, lo=begin, key=_label_name)


def add_value(label_set: pb.LabelSet, name: str, value: str) -> None:
    """Insert label `name`=`value` in order, keeping other values of `name`; a no-op if present.

    A `name` ending in ":prefix" adds a prefix-matching label, meaningful only in a selector.
    One insertion costs O(log n) comparisons and one move of the labels after it; to build a
    set of many labels, use `label_set`, which sorts once."""
    name, prefix = _split_prefix(name)
    labels = label_set.labels
    index = bisect_left(labels, (name, value), key=_label_key)
    if index < len(labels) and _label_key(labels[index]) == (name, value):
        return
    labels.insert(index, pb.Label(name=name, value=value, prefix=prefix))


def set_value(label_set: pb.LabelSet, name: str, value: str) -> None:
    """Make `value` the only value of label `name`."""
    name, prefix = _split_prefix(name)
    begin, end = _name_range(label_set, name)
    del label_set.labels[begin:end]
    label_set.labels.insert(begin, pb.Label(name=name, value=value, prefix=prefix))


def remove(label_set: pb.LabelSet, name: str) -> None:
    """Remove every label named `name`."""
    begin, end = _name_range(label_set, name)
    del label_set.labels[begin:end]


def values_of(label_set: pb.LabelSet, name: str) -> list[str]:
    """Values of label `name`, in order; empty if absent."""
    begin, end = _name_range(label_set, name)
    return [label_set.labels[index].value for index in range(begin, end)]


def value_of(label_set: pb.LabelSet, name: str) -> str:
    """The first value of label `name`, or "" if absent."""
    labels = label_set.labels
    begin = bisect_left(labels, name, key=_label_name)
    return labels[begin].value if begin < len(labels) and labels[begin].name == name else ""


def label_set(pairs: Iterable[tuple[str, str]] = ()) -> pb.LabelSet:
    """A LabelSet of (name, value) pairs in any order, sorted and de-duplicated (a pair given
    twice keeps the first one's ":prefix" marking). One sort: O(n log n)."""
    first: dict[tuple[str, str], bool] = {}
    for raw_name, value in pairs:
        name, prefix = _split_prefix(raw_name)
        first.setdefault((name, value), prefix)
    return pb.LabelSet(
        labels=[
            pb.Label(name=name, value=value, prefix=prefix)
            for (name, value), prefix in sorted(first.items())
        ]
    )


def is_quorum_journal(label_set: pb.LabelSet) -> bool:
    """Whether a (validated) journal's labels select quorum replication."""
    return value_of(label_set, REPLICATION_MODE) == REPLICATION_MODE_QUORUM


def journal_meta_labels(journal: str) -> pb.LabelSet:
    """Meta-labels a journal is matched with besides its own labels: "name" (the journal name)
    and one "prefix" per path component boundary, so "prefix=a/b/" selects "a/b/c" and
    "a/b/c/d" but not "a/bc". (For arbitrary prefixes, select "name:prefix=a/b".)"""
    pairs = [(META_NAME, journal)]
    pairs += [(META_PREFIX, journal[: index + 1]) for index, ch in enumerate(journal) if ch == "/"]
    return label_set(pairs)


def shard_meta_labels(shard_id: str) -> pb.LabelSet:
    """Meta-labels a shard is matched with besides its own labels: "id"."""
    return label_set([(META_ID, shard_id)])


def union(lhs: pb.LabelSet, rhs: pb.LabelSet) -> pb.LabelSet:
    """Labels of either set; where both have a name, the values of `lhs` win.

    Both sets must be sorted (as every valid LabelSet is): the labels of `rhs` under names
    `lhs` lacks are merged in by one stable sort of two sorted runs, which is linear."""
    left = list(lhs.labels)
    names = {label.name for label in left}
    kept = [label for label in rhs.labels if label.name not in names]
    out = pb.LabelSet()
    out.labels.extend(sorted(left + kept, key=_label_name) if kept else left)
    return out
