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

from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from operator import attrgetter
from typing import Any, Final, Generic, Protocol, TypeVar, runtime_checkable
from uuid import UUID

import msgspec

from gazette_consumer.message.uuid import (
    ZERO_PRODUCER_ID,
    Flag,
    InvalidUUIDError,
    ProducerID,
    parse_uuid,
    uuid_high_clock,
    uuid_low_parts,
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
    if uuid is None:
        return None
    if not isinstance(uuid, UUID):
        raise InvalidUUIDError(f"get_uuid: returned {uuid!r}, expected uuid.UUID or None")
    # By value, not `== NIL_UUID`: UUID.__eq__ is Python code, and this runs per message read.
    return None if uuid.int == 0 else uuid


class InvalidEnvelopeError(ValueError):
    """An Envelope's offsets or message UUID are invalid."""


class Envelope(msgspec.Struct, Generic[MessageT], frozen=True, gc=False):
    """A message read from a journal, with the byte range [begin, end) it was framed from.

    ``producer``, ``clock`` and ``flags`` are the message UUID's parts, parsed once when the
    envelope is built so that the sequencer never re-parses them. A message without a UUID has
    the zero producer, clock 0 and OUTSIDE_TXN, matching how Gazette sequences a nil UUID.

    Build envelopes with `Envelope.of`, which validates the offsets and parses the UUID. The
    constructor trusts its arguments: it is what decoders use once the framing and the UUID
    layout have established them (see `EnvelopeBuilder`), and it costs a tenth of a dataclass's
    because it runs for every message read. Envelopes are immutable and compare by value.

    The garbage collector does not track envelopes (``gc=False``): an envelope refers to its
    message, never the other way round (it is built after the message is decoded, and is
    immutable), so it cannot close a reference cycle, and untracked it costs collections
    nothing. A reader that keeps a long transaction's messages until its ACK (the Sequencer's
    replays: sequencer/decoded.py) keeps one object fewer per message for them to scan. (A
    message made to refer to its own envelope would form a cycle the collector never frees.)
    """

    journal: str
    begin: int
    end: int
    message: MessageT
    uuid: UUID | None
    producer: ProducerID
    clock: int
    flags: int

    @classmethod
    def of(cls, journal: str, begin: int, end: int, message: MessageT) -> Envelope[MessageT]:
        """Build an Envelope, validating its offsets and validating and parsing the UUID."""
        if not 0 <= begin <= end:
            raise InvalidEnvelopeError(
                f"journal {journal}: envelope offsets [{begin}, {end}) must "
                "satisfy 0 <= begin <= end"
            )
        uuid = message_uuid(message)
        if uuid is None:
            return cls(journal, begin, end, message, None, ZERO_PRODUCER_ID, 0, _OUTSIDE_TXN)
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

    @property
    def is_ack(self) -> bool:
        """True for an ACK_TXN message (which read-committed readers consume, not return)."""
        return self.flags == _ACK_TXN


_OUTSIDE_TXN: Final = int(Flag.OUTSIDE_TXN)
_CONTINUE_TXN: Final = int(Flag.CONTINUE_TXN)
_ACK_TXN: Final = int(Flag.ACK_TXN)
_LOW_64: Final = (1 << 64) - 1
_LOW_32: Final = (1 << 32) - 1
_LOW_96: Final = (1 << 96) - 1

UUIDOf = Callable[[Any], UUID | None]
"""Returns a message's UUID, or None (see `message_uuid`, the general one)."""

UUID_ATTRIBUTE: Final[UUIDOf] = attrgetter("uuid")
"""The `UUIDOf` of a message type keeping its UUID (a `uuid.UUID`, or None) in its ``uuid``
attribute, as `JSONMessage` does: `EnvelopeBuilder` reads the attribute itself for it."""

uuid_cache_entries_max_default: Final = 4096
"""Bound on each of an EnvelopeBuilder's two caches of parsed UUID parts."""


class EnvelopeBuilder:
    """Builds the Envelopes of a run of decoded messages at once: the read path's fast path.

    `Envelope.of` validates and parses each UUID from scratch (~2 µs in Python); a reader
    builds hundreds of thousands of envelopes a second from messages of a few producers. This
    parses a UUID with a few integer operations and a small cache instead. All of a UUID but its
    top 32 bits (time_low, which moves with every message) repeats across a producer's messages:
    time_mid and time_hi change every 7 minutes, and the low 64 bits (variant, sequence counter,
    flags, ProducerID) take at most 16 values per producer and flags. So the cache maps those
    low 96 bits to the UUID's parts, with the clock's bits from time_low left out; they are
    validated (RFC 4122 variant, version 1) when they enter the cache, and any time_low is
    valid. The cache is bounded (`cache_entries_max`), and cleared when full.

    `build` returns None, and the caller builds those envelopes with `Envelope.of` (which names
    the error), whenever a message has something the fast path does not take: a UUID that is
    not a `uuid.UUID`, or not of Gazette's layout.

    `uuid_of` reads a message's UUID: `message_uuid` by default; a decoder whose message type
    is known to keep its UUID in an attribute may pass a faster getter, or `UUID_ATTRIBUTE`
    for the ``uuid`` attribute, read inline (the nil UUID and None both mean "no UUID"). Not thread-safe; one per decoder.

    While building, it also measures `lead_run`: how many envelopes at the front of the list
    form a run a read-committed reader can commit at once (`Sequencer.commit_alone_run`):
    OUTSIDE_TXN messages with a UUID, of one producer, each with a larger clock than the one
    before. It reads each message's producer, clock and flags anyway, so this costs a few
    comparisons per message, where checking the list afterwards costs a loop over envelopes
    (~90 ns each). Producers are interned (one object per producer while the cache lasts), so
    "same producer" is an identity test; a producer re-learned after the cache was cleared ends
    the run early, which is safe (a shorter run, the rest go one by one), never longer.

    With `any_flags`, the run is measured whatever its flags (those of its first message):
    `lead_span` and `lead_flags` are its length and flags (`lead_run` is `lead_span` where they
    are OUTSIDE_TXN, else 0). A whole list of one producer's CONTINUE_TXN messages (`lead_span`
    == the list's length) is what a reader that only sequences a long transaction's messages
    looks for (`ChunkDecoder.feed_continuing`), at no cost beyond the same comparisons. Not by
    default: a transaction's messages would then cost those comparisons each, where the run
    of OUTSIDE_TXN messages ends at the first of them.
    """

    __slots__ = (
        "_cache_entries_max",
        "_parts",
        "_producers",
        "_uuid_of",
        "lead_flags",
        "lead_run",
        "lead_span",
    )

    def __init__(
        self,
        uuid_of: UUIDOf = message_uuid,
        *,
        cache_entries_max: int = uuid_cache_entries_max_default,
    ) -> None:
        if cache_entries_max < 1:
            raise ValueError(f"cache_entries_max: must be >= 1 (got {cache_entries_max})")
        self._uuid_of = uuid_of
        self._cache_entries_max = cache_entries_max
        # Low 96 bits of a UUID -> (producer, clock without time_low's bits, flags).
        self._parts: dict[int, tuple[ProducerID, int, int]] = {}
        # Each producer the cache holds, as one object: see `lead_run`. Cleared with `_parts`.
        self._producers: dict[ProducerID, ProducerID] = {}
        self.lead_run = 0
        """Envelopes at the front of the last `build`'s list that form a run (class docstring);
        0 after a build that returned None."""
        self.lead_span = 0
        """Envelopes at the front of the last `build`'s list of one producer, with its first's
        flags (`lead_flags`) and rising clocks, whatever the flags (class docstring); 0 after
        a build that returned None."""
        self.lead_flags = -1
        """The flags of the last `build`'s `lead_span` (-1 if it is 0)."""

    def build(
        self,
        journal: str,
        offsets: Sequence[int],
        messages: Sequence[Any],
        any_flags: bool = False,
    ) -> list[Envelope[Any]] | None:
        """The Envelopes of ``messages[i]``, framed at ``[offsets[i], offsets[i + 1])`` of
        `journal` (so ``len(offsets) == len(messages) + 1``, offsets non-decreasing); None if
        any message needs `Envelope.of`. `any_flags`: see the class docstring (positional, not
        keyword-only: CPython 3.11 fills a keyword-only default from `__kwdefaults__` at every
        call, ~1,600 instructions a call here by cachegrind, where this one costs none)."""
        if len(offsets) != len(messages) + 1:
            raise ValueError(
                f"offsets: {len(offsets)} given for {len(messages)} messages (expected one more)"
            )
        # Locals, not globals, in the loop that runs per message.
        uuid_of, cache, new, low_96 = self._uuid_of, self._parts, Envelope, _LOW_96
        # The UUID read as the attribute itself (a specialised attribute read), where calling
        # `UUID_ATTRIBUTE` would allocate an argument tuple per message.
        direct = uuid_of is UUID_ATTRIBUTE
        out: list[Envelope[Any]] = []
        append = out.append
        self.lead_run = self.lead_span = 0
        self.lead_flags = -1
        # The lead run so far: its producer (None until its first message), flags and last
        # clock. `lead` is True while every message so far belongs to it; `span` is its length
        # once it ended.
        run_producer: ProducerID | None = None
        run_flags = -1 if any_flags else _OUTSIDE_TXN  # -1: its first message's.
        prev = 0
        lead = True
        span = 0
        try:
            # `offsets` is one longer than `messages` (checked above): zip stops with them.
            ends = islice(offsets, 1, None)
            for message, begin, end in zip(messages, offsets, ends, strict=False):
                uuid = message.uuid if direct else uuid_of(message)
                value = 0 if uuid is None else uuid.int
                if not value:  # No UUID, or the nil UUID: at-least-once.
                    if lead:  # Ends the run (commit_alone takes it alone).
                        lead = False
                        span = len(out)
                    append(new(journal, begin, end, message, None, ZERO_PRODUCER_ID, 0, 0))
                    continue
                try:  # A subscript is a specialised instruction; `cache.get` is a call.
                    producer, clock, flags = cache[value & low_96]
                except KeyError:
                    parts = self._learn(value)
                    if parts is None:
                        return None
                    producer, clock, flags = parts
                clock += value >> 92  # See `_learn`.
                if lead:
                    if producer is run_producer and clock > prev and flags == run_flags:
                        prev = clock
                    elif run_producer is None and (flags == run_flags or run_flags == -1):
                        run_producer, prev, run_flags = producer, clock, flags  # Its first.
                    else:
                        lead = False
                        span = len(out)
                append(new(journal, begin, end, message, uuid, producer, clock, flags))
        except (AttributeError, InvalidUUIDError):  # Not a UUID: Envelope.of says what it is.
            return None
        if lead:
            span = len(out)
        if span:
            self.lead_span, self.lead_flags = span, run_flags
            if run_flags == _OUTSIDE_TXN:
                self.lead_run = span
        return out

    def continuation(
        self, uuids: Iterable[UUID], producer: ProducerID, after_clock: int
    ) -> tuple[int, int]:
        """How many UUIDs at the front of `uuids` continue `producer`'s transaction past
        `after_clock` (CONTINUE_TXN, of `producer`, each clock larger than the one before), and
        the last one's clock (`after_clock` if none does). `uuids` is consumed no further than
        the first that does not; one that raises while being produced (a payload that does not
        decode) ends the count there too: the caller decodes it whole, which reports it."""
        cache, low_96, continue_txn = self._parts, _LOW_96, _CONTINUE_TXN
        n, clock = 0, after_clock
        try:
            for uuid in uuids:
                value = uuid.int
                parts = cache.get(value & low_96)
                if parts is None:
                    parts = self._learn(value) if value else None
                    if parts is None:
                        break
                owner, next_clock, flags = parts
                next_clock += value >> 92  # See `_learn`.
                if (
                    flags != continue_txn
                    or next_clock <= clock
                    or (owner is not producer and owner != producer)
                ):
                    break
                clock = next_clock
                n += 1
        except Exception:  # The payload's own decode failed: the whole decode reports it.
            pass
        return n, clock

    def _learn(self, value: int) -> tuple[ProducerID, int, int] | None:
        """Cache and return the parts of UUID `value` (producer, clock base, flags); None if
        it is not of Gazette's layout. The clock is the base plus ``value >> 92``: bits 92-127
        are time_low (the UUID's top 32 bits, the clock's bits 4-35, moving with every
        message) above the top 4 bits of time_mid, which the base subtracts (they are part of
        the cache's key, so the same for every UUID of an entry). One addition per message,
        where masking those 4 bits off would take two more operations."""
        low_parts = uuid_low_parts(value & _LOW_64)
        high_clock = uuid_high_clock((value >> 64) & _LOW_32)
        if low_parts is None or high_clock is None:
            return None
        producer, sequence, flags = low_parts
        if len(self._parts) >= self._cache_entries_max:
            self._parts.clear()  # Bounded: a few producers fill it slowly; start over when full.
            self._producers.clear()
        producer = self._producers.setdefault(producer, producer)
        base = (high_clock | sequence) - ((value >> 92) & 0xF)
        parts = self._parts[value & _LOW_96] = (producer, base, flags)
        return parts
