"""The Message interface, and the Envelope that carries a read message with its position.

Journals hold only raw bytes, and messages are arbitrary user types. Gazette therefore asks a
message type to carry the UUID that the publisher assigns: to accept it (``set_uuid``), serialize
it with the rest of the message, and return it when read back (``get_uuid``). Readers sequence
messages by the UUID's producer, clock and flags to deliver each committed message exactly once.

A type that cannot represent a UUID opts out by returning ``None`` from ``get_uuid`` and ignoring
``set_uuid``. Its messages are then delivered at-least-once: each is treated as committed on read
(``OUTSIDE_TXN``) and never de-duplicated. The all-zero UUID means the same thing, because that is
how Gazette's Go types without a UUID serialize.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, runtime_checkable
from uuid import UUID

from gazette_consumer.message.uuid import (
    NIL_UUID,
    ZERO_PRODUCER_ID,
    Flag,
    InvalidUUIDError,
    ProducerID,
    parse_uuid,
)


@runtime_checkable
class Message(Protocol):
    """A user message type that carries its Gazette UUID."""

    def get_uuid(self) -> UUID | None:
        """The UUID set on this message, or None if unset or if the type opted out."""
        ...

    def set_uuid(self, uuid: UUID) -> None:
        """Record the UUID assigned by the publisher. A no-op for types that opted out."""
        ...

    def new_acknowledgement(self, journal: str) -> Message:
        """A new message of this same type, to be published as an ACK_TXN to ``journal``.

        Acknowledgements carry only a UUID; readers use them to commit (or roll back) the
        producer's pending messages and do not hand them to the application.
        """
        ...


MessageT = TypeVar("MessageT")


def message_uuid(message: object) -> UUID | None:
    """The UUID of ``message``, or None if it has none (no get_uuid, None, or the nil UUID)."""
    get_uuid = getattr(message, "get_uuid", None)
    if get_uuid is None:
        return None
    uuid = get_uuid()
    if uuid is None or uuid == NIL_UUID:
        return None
    if not isinstance(uuid, UUID):
        raise InvalidUUIDError(f"get_uuid: returned {uuid!r}, expected uuid.UUID or None")
    return uuid


class InvalidEnvelopeError(ValueError):
    """An Envelope's offsets or message UUID are invalid."""


@dataclass(frozen=True, slots=True)
class Envelope(Generic[MessageT]):
    """A message read from a journal, with the byte range [begin, end) it was framed from.

    ``producer``, ``clock`` and ``flags`` are the message UUID's parts, parsed once when the
    envelope is built so that the sequencer never re-parses them. A message without a UUID has
    the zero producer, clock 0 and OUTSIDE_TXN, matching how Gazette sequences a nil UUID.
    """

    journal: str
    begin: int
    end: int
    message: MessageT
    uuid: UUID | None
    producer: ProducerID
    clock: int
    flags: int

    def __post_init__(self) -> None:
        if not 0 <= self.begin <= self.end:
            raise InvalidEnvelopeError(
                f"journal {self.journal}: envelope offsets [{self.begin}, {self.end}) must "
                "satisfy 0 <= begin <= end"
            )

    @classmethod
    def of(cls, journal: str, begin: int, end: int, message: MessageT) -> Envelope[MessageT]:
        """Build an Envelope, validating and parsing the message's UUID."""
        uuid = message_uuid(message)
        if uuid is None:
            return cls(
                journal, begin, end, message, None, ZERO_PRODUCER_ID, 0, int(Flag.OUTSIDE_TXN)
            )
        try:
            parts = parse_uuid(uuid)
        except InvalidUUIDError as err:
            raise InvalidEnvelopeError(
                f"journal {journal} offset {begin}: message UUID is invalid: {err}"
            ) from err
        return cls(journal, begin, end, message, uuid, parts.producer, parts.clock, parts.flags)

    @property
    def has_uuid(self) -> bool:
        """False if the message opted out of exactly-once (it is delivered at-least-once)."""
        return self.uuid is not None
