"""The quorum replication RPC's envelopes: every protocol message round-trips; anything else
is refused with a typed error naming what was wrong."""

from __future__ import annotations

import pytest

from broker.quorum.entry import Entry, EntryId, LogBase
from broker.quorum.messages import (
    AddFollower,
    BecomeLeader,
    Heartbeat,
    NewTerm,
    NewTermResponse,
    ReplicaResponse,
    Replicate,
    ReplyStatus,
    Snapshot,
    Truncate,
)
from broker.quorum.read_index import REFUSED, ReadIndexAnswer, ReadIndexAsk
from broker.quorum_shell.wire import (
    ENVELOPE_BYTES_MAX,
    Envelope,
    WireDecodeError,
    decode_envelope,
    encode_envelope,
)

ANSWER = NewTermResponse(3, "m1", "fenced", EntryId(2, 7), EntryId(2, 5), (EntryId(2, 7),))
MESSAGES = [
    NewTerm(3, "m0!coordinator", ("m0", "m1", "m2")),
    ANSWER,
    BecomeLeader(3, "m0!coordinator", ("m0", "m1", "m2"), (ANSWER,)),
    AddFollower(3, "m0!coordinator", ANSWER),
    Heartbeat(3, "m0", 9, 11, ("m1", "m2")),
    Truncate(3, "m0", EntryId(2, 6)),
    Truncate(3, "m0", EntryId(2, 6), EntryId(3, 11)),
    Snapshot(3, "m0", LogBase(2, 4, 64), 8, EntryId(3, 11)),
    Replicate(3, "m0", EntryId(3, 8), (Entry(3, 9, 100, 103, b"\x00\xffa"),), 8, 64),
    Replicate(3, "m0", EntryId(3, 9), (), 9, 64),
    Snapshot(3, "m0", LogBase(2, 4, 64), 8),
    Replicate(3, "m0", EntryId(3, 8), (Entry(3, 9, 0, 1, b"a", (("owner", "x"),)),), 8, 0),
    Replicate(3, "m0", EntryId(3, 8), (Entry(3, 9, 0, 1, b"a", ()),), 8, 0),
    Snapshot(3, "m0", LogBase(2, 4, 64, (("a", "1"), ("b", "2"))), 8),
    ReplicaResponse(3, "m1", ReplyStatus.GAP, EntryId(3, 2)),
    # A member back from a lost disk: its nonce, and a leader's alignment echoing it.
    ReplicaResponse(3, "m1", ReplyStatus.LOST, EntryId(0, 0), 1 << 61),
    NewTermResponse(3, "m1", "fenced", EntryId(0, 0), EntryId(0, 0), (), False, 12345),
    Truncate(3, "m0", EntryId(0, 0), EntryId(3, 11), 1 << 61),
    Snapshot(3, "m0", LogBase(2, 4, 64), 8, EntryId(3, 11), 12345),
    # The read index (read-your-writes through followers).
    ReadIndexAsk(3, "m1", 17),
    ReadIndexAnswer(3, "m0", 17, 1 << 40),
    ReadIndexAnswer(4, "m2", 17, REFUSED),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips(message: object) -> None:
    envelope = Envelope("a/journal", "m1", message)
    assert decode_envelope(encode_envelope(envelope)) == envelope


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"\xff", "not JSON"),
        (b'{"format":2}', "format must be 1"),
        (b'{"format":1,"journal":1,"to":"m"}', "must be strings"),
        (b'{"format":1,"journal":"j","to":"m","message":{"@":"os.system"}}', "unknown type"),
        (b'{"format":1,"journal":"j","to":"m","message":{"@":"Truncate","term":1}}', "fields"),
        (
            b'{"format":1,"journal":"j","to":"m","message":{"@":"EntryId","term":1,"index":2}}',
            "not a quorum message",
        ),
        (b'{"format":1,"journal":"j","to":"m","message":{"@b":"!!"}}', "message"),
        (b" " * (ENVELOPE_BYTES_MAX + 1), "max"),
    ],
)
def test_malformed_envelopes_are_refused(raw: bytes, why: str) -> None:
    with pytest.raises(WireDecodeError, match=why):
        decode_envelope(raw)


def test_only_messages_are_encoded() -> None:
    with pytest.raises(TypeError, match="not a quorum message"):
        encode_envelope(Envelope("j", "m", EntryId(1, 1)))


def test_registers_are_left_out_at_their_default_and_defaulted_when_absent() -> None:
    """Brokers without registers on the wire still decode what a journal without registers
    sends (no `registers` key), and this one decodes what they send."""
    plain = Envelope("j", "m1", Snapshot(3, "m0", LogBase(2, 4, 64), 8))
    raw = encode_envelope(plain)
    assert b"registers" not in raw
    assert decode_envelope(raw) == plain
    bad = raw.replace(b'"end":64', b'"end":64,"registers":[[1,2]]')
    with pytest.raises(WireDecodeError, match="registers"):
        decode_envelope(bad)


def test_the_nonce_is_left_out_at_zero() -> None:
    """Members that are not lost send no nonce: brokers without the field decode them."""
    for message in (
        Truncate(3, "m0", EntryId(2, 6), EntryId(3, 9)),
        ReplicaResponse(3, "m1", ReplyStatus.OK, EntryId(3, 2)),
        ANSWER,
    ):
        raw = encode_envelope(Envelope("j", "m1", message))
        assert b"nonce" not in raw and decode_envelope(raw).message == message
    raw = encode_envelope(Envelope("j", "m1", Truncate(3, "m0", EntryId(2, 6), nonce=7)))
    assert b'"nonce":7' in raw


def test_the_leaders_head_is_optional_on_the_wire() -> None:
    """A broker that does not send the leader's head on Truncate and Snapshot is decoded with
    ORIGIN there (a lost member it aligns then does not vote: Rules.may_vote)."""
    old = Envelope("j", "m1", Truncate(3, "m0", EntryId(2, 6)))
    raw = encode_envelope(old)
    assert b"leader_head" not in raw
    assert decode_envelope(raw) == old
    new = encode_envelope(Envelope("j", "m1", Truncate(3, "m0", EntryId(2, 6), EntryId(3, 9))))
    assert b"leader_head" in new
