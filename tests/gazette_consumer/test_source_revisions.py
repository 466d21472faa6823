"""The create revisions a checkpoint records per source (source_revisions.py): kept through
encoding, merging and copying, and invisible to Gazette's message."""

from __future__ import annotations

from broker.protocol import consumer_pb2 as cpb
from gazette_consumer.checkpoint import (
    build_checkpoint,
    decode_checkpoint,
    encode_checkpoint,
    equivalent,
    merge,
)
from gazette_consumer.source_revisions import (
    SourceRecreatedError,
    create_revisions_of,
    stamp_create_revisions,
)


def test_revisions_survive_encoding_and_merging_and_a_later_stamp_replaces_one() -> None:
    cp = build_checkpoint({"a/j": 5, "b/j": 7}, {}, {})
    # A journal the checkpoint does not read, and a revision 0 (never stamped), are left out.
    stamp_create_revisions(cp, {"a/j": 2**40 + 3, "b/j": 0, "c/j": 9})
    assert create_revisions_of(cp) == {"a/j": 2**40 + 3}
    stamp_create_revisions(cp, {"a/j": 11, "b/j": 12})
    decoded = decode_checkpoint(encode_checkpoint(cp))
    assert create_revisions_of(decoded) == {"a/j": 11, "b/j": 12}
    later = build_checkpoint({"b/j": 9}, {}, {})
    stamp_create_revisions(later, {"b/j": 13})
    assert create_revisions_of(merge(decoded, later)) == {"a/j": 11, "b/j": 13}


def test_gazettes_message_reads_a_stamped_checkpoint_as_the_same_checkpoint() -> None:
    plain = build_checkpoint({"a/j": 5}, {}, {"out/j": b"ack"})
    stamped = cpb.Checkpoint()
    stamped.CopyFrom(plain)
    stamp_create_revisions(stamped, {"a/j": 42})
    data = encode_checkpoint(stamped)
    assert data != encode_checkpoint(plain)
    # Gazette's decoder skips the unknown field: the same offsets, producers and intents.
    as_gazette = cpb.Checkpoint()
    as_gazette.ParseFromString(data)
    as_gazette.DiscardUnknownFields()
    assert equivalent(as_gazette, plain)
    assert as_gazette.SerializeToString(deterministic=True) == encode_checkpoint(plain)
    # A checkpoint without the field (Go's, or an older one's) records nothing.
    assert create_revisions_of(plain) == {}


def test_the_error_names_the_journal_and_both_revisions() -> None:
    err = SourceRecreatedError("a/j", 3, 8)
    assert "'a/j'" in str(err) and "revision 3, now 8" in str(err)
