"""What a checkpoint records of its sources (source_revisions.py): create revisions and content
fingerprints, kept through encoding, merging and copying, invisible to Gazette's message, and
fingerprints taken in the background for sources that had none."""

from __future__ import annotations

import asyncio

from broker.protocol import consumer_pb2 as cpb
from gazette_consumer.checkpoint import (
    build_checkpoint,
    decode_checkpoint,
    encode_checkpoint,
    equivalent,
    merge,
)
from gazette_consumer.source_revisions import (
    FINGERPRINT_RETRY_S,
    Fingerprint,
    SourceMarks,
    SourceRecreatedError,
    create_revisions_of,
    fingerprints_of,
)

FP = Fingerprint(5, bytes(range(20)))


def test_marks_survive_encoding_and_merging_and_a_later_stamp_replaces_them() -> None:
    cp = build_checkpoint({"a/j": 5, "b/j": 7}, {}, {})
    # A journal the checkpoint does not read, and a revision 0 (unknown), are left out.
    SourceMarks({"a/j": 2**40 + 3, "b/j": 0, "c/j": 9}, {"a/j": FP}).stamp(cp)
    assert create_revisions_of(cp) == {"a/j": 2**40 + 3}
    assert fingerprints_of(cp) == {"a/j": FP}
    SourceMarks({"a/j": 11, "b/j": 12}).stamp(cp)
    decoded = decode_checkpoint(encode_checkpoint(cp))
    assert create_revisions_of(decoded) == {"a/j": 11, "b/j": 12}
    assert fingerprints_of(decoded) == {}  # Replaced by the later stamp, which had none.
    later = build_checkpoint({"b/j": 9}, {}, {})
    SourceMarks({"b/j": 13}, {"b/j": FP}).stamp(later)
    merged = merge(decoded, later)
    assert create_revisions_of(merged) == {"a/j": 11, "b/j": 13}
    assert fingerprints_of(merged) == {"b/j": FP}


def test_gazettes_message_reads_a_stamped_checkpoint_as_the_same_checkpoint() -> None:
    plain = build_checkpoint({"a/j": 5}, {}, {"out/j": b"ack"})
    stamped = cpb.Checkpoint()
    stamped.CopyFrom(plain)
    SourceMarks({"a/j": 42}, {"a/j": FP}).stamp(stamped)
    data = encode_checkpoint(stamped)
    assert data != encode_checkpoint(plain)
    # Gazette's decoder skips the unknown fields: the same offsets, producers and intents.
    as_gazette = cpb.Checkpoint()
    as_gazette.ParseFromString(data)
    as_gazette.DiscardUnknownFields()
    assert equivalent(as_gazette, plain)
    assert as_gazette.SerializeToString(deterministic=True) == encode_checkpoint(plain)
    # A checkpoint without them (Go's, or an older one's) records nothing.
    assert create_revisions_of(plain) == {} and fingerprints_of(plain) == {}


async def test_a_source_without_a_fingerprint_gets_one_in_the_background() -> None:
    now = [0.0]
    asked: list[tuple[str, int]] = []
    answers: list[Fingerprint | Exception | None] = [RuntimeError("broker down"), None, FP]
    gate = asyncio.Event()

    async def fetch(journal: str, offset: int) -> Fingerprint | None:
        asked.append((journal, offset))
        await gate.wait()
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    marks = SourceMarks({"a/j": 3, "b/j": 4}, fetch=fetch, clock=lambda: now[0])

    def commit(offset: int) -> cpb.Checkpoint:
        cp = build_checkpoint({"a/j": offset, "b/j": 0}, {}, {})
        marks.stamp(cp)
        return cp

    commit(10)
    commit(20)  # One read per journal at a time; never of one read through 0.
    gate.set()
    await marks.fetched()  # It failed: tried again only after FINGERPRINT_RETRY_S.
    assert fingerprints_of(commit(21)) == {}
    now[0] += FINGERPRINT_RETRY_S
    commit(31)
    await marks.fetched()  # Unreadable (None): the same.
    commit(32)
    now[0] += FINGERPRINT_RETRY_S
    commit(42)
    await marks.fetched()
    assert asked == [("a/j", 10), ("a/j", 31), ("a/j", 42)]
    # Checkpoints from then on carry the fingerprint; no more reads.
    assert fingerprints_of(commit(50)) == {"a/j": FP}
    now[0] += FINGERPRINT_RETRY_S
    commit(60)
    await marks.fetched()
    assert len(asked) == 3
    await marks.close()


async def test_close_cancels_a_read_under_way() -> None:
    started, never = asyncio.Event(), asyncio.Event()

    async def fetch(journal: str, offset: int) -> Fingerprint | None:
        started.set()
        await never.wait()
        return FP

    marks = SourceMarks({"a/j": 3}, fetch=fetch)
    marks.stamp(build_checkpoint({"a/j": 10}, {}, {}))
    await started.wait()
    await marks.close()
    cp = build_checkpoint({"a/j": 11}, {}, {})
    marks.stamp(cp)
    assert fingerprints_of(cp) == {}


def test_the_error_names_the_journal_and_both_revisions() -> None:
    err = SourceRecreatedError("a/j", 3, 8)
    assert "'a/j'" in str(err) and "revision 3, now 8" in str(err)
