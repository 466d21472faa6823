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
from gazette_consumer.sequencer.read_tails import (
    TAIL_BYTES,
    ReadTails,
    tail_digest,
)
from gazette_consumer.source_revisions import (
    SourceFingerprints,
    SourceRecreatedError,
    create_revisions_of,
    fingerprints_of,
    known_fingerprints,
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
    stamp_create_revisions(stamped, {"a/j": 42}, {"a/j": tail_digest(b"x")})
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
    assert fingerprints_of(plain) == {}


def test_fingerprints_ride_with_their_revision_through_encoding_and_merging() -> None:
    one, two = tail_digest(b"one"), tail_digest(b"two")
    cp = build_checkpoint({"a/j": 5, "b/j": 7}, {}, {})
    # Only beside a revision (a fingerprint describes that incarnation).
    stamp_create_revisions(cp, {"a/j": 3}, {"a/j": one, "b/j": two})
    assert fingerprints_of(cp) == {"a/j": one}
    stamp_create_revisions(cp, {"a/j": 3, "b/j": 4}, {"b/j": two})  # a/j's replaced: none.
    decoded = decode_checkpoint(encode_checkpoint(cp))
    assert fingerprints_of(decoded) == {"b/j": two}
    assert create_revisions_of(decoded) == {"a/j": 3, "b/j": 4}
    assert known_fingerprints(decoded) == {"b/j": (7, two)}
    later = build_checkpoint({"a/j": 9}, {}, {})
    stamp_create_revisions(later, {"a/j": 3}, {"a/j": one})
    assert fingerprints_of(merge(decoded, later)) == {"a/j": one, "b/j": two}


def test_a_fingerprint_is_the_readers_else_carried_at_the_same_offset_else_none() -> None:
    taken: dict[tuple[str, int], bytes] = {("a/j", 9): b"A9"}
    prints = SourceFingerprints(
        {"a/j": (5, b"A5"), "b/j": (7, b"B7")}, lambda j, offset: taken.get((j, offset))
    )
    # a/j moved to 9 and the reader holds the bytes below: its; b/j did not move: carried.
    assert prints.at(build_checkpoint({"a/j": 9, "b/j": 7}, {}, {})) == {"a/j": b"A9", "b/j": b"B7"}
    # b/j moved and the reader does not hold the bytes below 8: none, and never again at 7.
    assert prints.at(build_checkpoint({"a/j": 9, "b/j": 8}, {}, {})) == {"a/j": b"A9"}
    assert prints.at(build_checkpoint({"a/j": 9, "b/j": 7}, {}, {})) == {"a/j": b"A9"}


def test_read_tails_hold_the_bytes_below_offsets_of_the_chunks_consumed() -> None:
    tails = ReadTails()
    content = bytes(range(256)) * 8  # 2 KiB, no repeats within TAIL_BYTES.
    tails.add("a/j", 1000, content[:600])
    tails.add("a/j", 1600, content[600:])
    # Across the two chunks, and below offset TAIL_BYTES only the bytes there are.
    assert tails.fingerprint("a/j", 1700) == tail_digest(content[700 - TAIL_BYTES : 700])
    assert tails.fingerprint("a/j", 1000 + TAIL_BYTES) == tail_digest(content[:TAIL_BYTES])
    assert tails.fingerprint("a/j", 1000 + TAIL_BYTES - 1) is None  # Not all held.
    assert tails.fingerprint("a/j", 1000 + len(content) + 1) is None
    assert tails.fingerprint("b/j", 1700) is None
    tails.add("b/j", 0, b"abc")
    assert tails.fingerprint("b/j", 2) == tail_digest(b"ab")
    assert tails.fingerprint("b/j", 0) is None
    # Content skipped (an offset jump): nothing before it is held.
    tails.add("a/j", 5000, b"z" * 300)
    assert tails.fingerprint("a/j", 1700) is None
    assert tails.fingerprint("a/j", 5000 + TAIL_BYTES) == tail_digest(b"z" * TAIL_BYTES)
    # Whatever the chunks' sizes, the bytes below offsets in the last two are held (a live
    # journal of small appends is a chunk each: found by review), older ones as a copy.
    small = ReadTails()
    for i in range(40):
        small.add("d/j", 10 * i, bytes([i]) * 10)
    want = b"".join(bytes([i]) * 10 for i in range(40))
    assert small.fingerprint("d/j", 400) == tail_digest(want[400 - TAIL_BYTES :])
    assert small.fingerprint("d/j", 385) == tail_digest(want[385 - TAIL_BYTES : 385])
    assert small.fingerprint("d/j", 380) == tail_digest(want[380 - TAIL_BYTES : 380])
    assert small.fingerprint("d/j", 379) is None  # Below the copy before the last two.
    big = ReadTails()
    for i in range(4):
        big.add("e/j", 1000 * i, bytes([i]) * 1000)
    assert big.fingerprint("e/j", 2000) == tail_digest(bytes([1]) * TAIL_BYTES)
    assert big.fingerprint("e/j", 2000 + 3) == tail_digest(
        bytes([1]) * (TAIL_BYTES - 3) + bytes([2]) * 3
    )
    assert big.fingerprint("e/j", 1999) is None  # Only TAIL_BYTES kept before the last two.
    seeded = ReadTails()
    seeded.seed("c/j", 700, b"s" * TAIL_BYTES)
    seeded.add("c/j", 700 + TAIL_BYTES, b"t" * 10)
    assert seeded.fingerprint("c/j", 705 + TAIL_BYTES) == tail_digest(
        b"s" * (TAIL_BYTES - 5) + b"t" * 5
    )


def test_the_error_names_the_journal_and_both_revisions() -> None:
    err = SourceRecreatedError("a/j", 3, 8)
    assert "'a/j'" in str(err) and "revision 3, now 8" in str(err)
