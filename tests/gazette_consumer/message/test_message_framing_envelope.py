"""The Message interface and Envelope: UUID parts parsed once, and the at-least-once opt-out."""

from __future__ import annotations

from uuid import UUID

import pytest

from gazette_consumer.message.framing import Frame, decode_envelope
from gazette_consumer.message.json_framing import JSONFraming, JSONMessage
from gazette_consumer.message.message import (
    Envelope,
    InvalidEnvelopeError,
    Message,
    message_uuid,
)
from gazette_consumer.message.uuid import (
    NIL_UUID,
    ZERO_PRODUCER_ID,
    Flag,
    InvalidUUIDError,
    ProducerID,
    build_uuid,
)

JOURNAL = "a/journal"
PRODUCER = ProducerID(bytes([0x01, 0x02, 0x03, 0x04, 0x05, 0x06]))


class Event(JSONMessage):
    name: str = ""


class NoUUID:
    """A type that cannot carry a UUID, so it opts out (at-least-once delivery)."""

    def get_uuid(self) -> UUID | None:
        return None

    def set_uuid(self, uuid: UUID) -> None:
        pass

    def new_acknowledgement(self, journal: str) -> Message:
        return NoUUID()


def test_envelope_parses_the_uuid_parts_once() -> None:
    u = build_uuid(PRODUCER, 12345, Flag.CONTINUE_TXN)
    env = Envelope.of(JOURNAL, 10, 20, Event(uuid=u, name="x"))
    assert (env.journal, env.begin, env.end) == (JOURNAL, 10, 20)
    assert (env.uuid, env.producer, env.clock, env.flags) == (u, PRODUCER, 12345, 1)
    assert env.has_uuid
    assert env.message.name == "x"


@pytest.mark.parametrize("message", [NoUUID(), Event(), Event(uuid=NIL_UUID), object()])
def test_messages_without_uuid_are_outside_txn_with_zero_producer_and_clock(
    message: object,
) -> None:
    env = Envelope.of(JOURNAL, 0, 5, message)
    assert env.uuid is None
    assert not env.has_uuid
    assert (env.producer, env.clock, env.flags) == (ZERO_PRODUCER_ID, 0, Flag.OUTSIDE_TXN)


def test_message_protocol_is_satisfied_by_the_opt_out_type() -> None:
    assert isinstance(NoUUID(), Message)
    assert isinstance(Event(), Message)
    assert not isinstance(object(), Message)


def test_invalid_message_uuid_names_journal_and_offset() -> None:
    v4 = UUID("9f1e0a52-36c2-4e4f-8d4c-6fd26b1c1a1e")
    with pytest.raises(InvalidEnvelopeError, match=f"journal {JOURNAL} offset 77: message UUID"):
        Envelope.of(JOURNAL, 77, 80, Event(uuid=v4))


def test_get_uuid_must_return_a_uuid() -> None:
    class Wrong:
        def get_uuid(self) -> str:
            return "83fc2f81-cc5f-11e9-8aaa-010203040506"

    with pytest.raises(InvalidUUIDError, match=r"expected uuid\.UUID or None"):
        message_uuid(Wrong())


def test_envelope_offsets_are_validated() -> None:
    with pytest.raises(InvalidEnvelopeError, match=r"offsets \[9, 3\) must satisfy"):
        Envelope.of(JOURNAL, 9, 3, NoUUID())
    with pytest.raises(InvalidEnvelopeError, match="0 <= begin"):
        Envelope.of(JOURNAL, -1, 3, NoUUID())


def test_decode_envelope_from_a_frame() -> None:
    framing = JSONFraming()
    u = build_uuid(PRODUCER, 99, Flag.ACK_TXN)
    data = framing.marshal(Event(uuid=u, name="ack"))
    [frame] = framing.unpack(JOURNAL, 300, data)
    assert isinstance(frame, Frame)
    env = decode_envelope(framing.new_decoder(Event), frame)
    assert (env.begin, env.end, env.clock, env.flags) == (300, 300 + len(data), 99, Flag.ACK_TXN)
    assert env.message == Event(uuid=u, name="ack")
