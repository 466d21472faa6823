"""Publisher: maps, sequences, frames and appends messages, and builds ACK intents.

Each Publisher draws a random ProducerID and owns a strictly monotonic Clock; every message it
publishes gets a UUID of (producer, next clock, flags). Readers use those UUIDs to drop
duplicates (appends are at-least-once) and to hold transactional messages until acknowledged.

- `publish_committed(mapping, msg)`: flag OUTSIDE_TXN; read-committed readers deliver the
  message as soon as they read it. For producers that are not consumers (API servers, tools).
- `publish_uncommitted(mapping, msg)`: flag CONTINUE_TXN; the journal is remembered, and the
  message is delivered only once an ACK_TXN of this producer with a larger clock is read.
- `build_ack_intents()`: one framed ACK_TXN message per journal published to uncommitted since
  the last call, as ``{journal: bytes}`` (the shape checkpoints store). A consumer commits them
  in its checkpoint *before* appending them (`write_ack_intents`), and re-appends them on
  recovery: so every journal of a transaction gets its ACK, or the transaction is rolled back.

Publishing appends through an *appender*, normally an `AppendService`: the message is written
whole into the journal's current batch, and the batch's AsyncAppend is returned; await it to
learn when the message committed, or ignore it (fire and forget) and `flush` the service later.
A message whose batch fails is never dropped silently: its AsyncAppend raises the typed error,
and so does the service's `flush()`; the end of its `async with` block raises AppendsFailedError
for the failed batches that no writer awaited (each failure is reported once).

The UUID is assigned after `start_append` returns, with no await before the write: the
appender serializes writers of a journal, so clocks reach each journal in increasing order
even when many coroutines publish through one Publisher (a smaller clock written after a
larger one would read as a duplicate). `publish_uncommitted` and `build_ack_intents` belong to
one transaction at a time and must not interleave across transactions.

A publish that must wait (the journal's batch is full: back-pressure) appends only once awaited,
so each must be awaited before its transaction closes: one never awaited would be lost with only
Python's "never awaited" warning. The publisher counts them from the call until they finish, and
`build_ack_intents` (an uncommitted one) and `check_finished` (any; a shard's commit calls it)
raise UnfinishedPublishError rather than close a transaction over them.

A message whose frame would exceed the framing's `message_bytes_max` is refused with
MessageTooLargeError, and nothing is appended.

`publish_committed_batch(mapping, messages)` and `publish_uncommitted_batch(mapping, messages)`
publish a sequence of messages as the one-by-one calls would, in order, but a run of them at a
time (consecutive messages to one journal, at most PUBLISH_RUN_MAX): its UUIDs set by C loops
from one reading of the wall clock, its frames encoded in one framing call (`marshal_many`)
and appended in one write. What an application saves per message when it publishes many (an
exactly-once shard's derived messages are read by nobody before the transaction's ACK, so it
may as well publish them when the transaction closes).
"""

from __future__ import annotations

import asyncio
import time
import uuid as uuid_module
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from itertools import repeat
from typing import Any, Final, Generic, Protocol, TypeVar
from uuid import UUID

from gazette_consumer.message.clock import (
    CLOCK_MAX,
    CLOCK_SEQUENCE_BITS,
    G1582_NS100,
    TICK,
    Clock,
    ClockError,
)
from gazette_consumer.message.framing import (
    MESSAGE_BYTES_MAX_DEFAULT,
    MESSAGE_BYTES_MAX_LIMIT,
    Framing,
    FramingConfigError,
    framing_for_content_type,
)
from gazette_consumer.message.json_framing import uuid_slot_setter
from gazette_consumer.message.mapping import Partition
from gazette_consumer.message.message import Message
from gazette_consumer.message.uuid import Flag, ProducerID, new_producer_id
from gazette_consumer.message.uuid import producer_id as as_producer_id


class AppendHandle(Protocol):
    """The batch a writer holds between `start_append` and `release` (an AsyncAppend)."""

    def write(self, data: bytes, /) -> None: ...

    def release(self) -> None: ...

    def abort(self) -> None: ...


A_co = TypeVar("A_co", bound=AppendHandle, covariant=True)
A = TypeVar("A", bound=AppendHandle)


class AsyncJournalAppender(Protocol[A_co]):
    """What a Publisher appends through: `broker.client.AppendService`, or a test double."""

    def start_append(self, journal: str, dependencies: Collection[Any] = ..., /) -> Awaitable[A_co]:
        """Hold `journal`'s current batch (see AppendService.start_append)."""
        ...

    def start_append_nowait(self, journal: str, /) -> A_co | None:
        """The same, if it need not wait; else None."""
        ...


class AppendNowait(Protocol[A_co]):
    """An appender's optional one-call fast path (`AppendService.append_nowait`): write `data`
    to the journal's batch and release it if that needs no wait, else None (nothing written)."""

    def __call__(self, journal: str, data: bytes, /) -> A_co | None: ...


class InvalidMessageError(TypeError):
    """A published object does not implement the Message interface."""


class UnfinishedPublishError(RuntimeError):
    """A transaction was closed while publishes that had to wait (back-pressure) were not
    finished: never awaited, or still running in a task nobody awaited. Their messages were
    not appended, so committing would lose them without a word; await every
    `publish_committed`, `publish_uncommitted` and batch publish before the transaction closes
    (in a shard: before `consume_message` and `finalize_txn` return)."""

    def __init__(self, committed: int, uncommitted: int) -> None:
        self.committed, self.uncommitted = committed, uncommitted
        super().__init__(
            f"{committed + uncommitted} publish(es) not finished when the transaction closed "
            f"({committed} committed, {uncommitted} uncommitted): a publish that must wait "
            "for back-pressure appends only when awaited; await each one before the "
            "transaction closes"
        )


PUBLISH_RUN_MAX: Final = 4096
"""Messages of a batch publish (`Publisher.publish_committed_batch`) sequenced, encoded and
appended as one write: bounds the bytes one write holds (4096 messages of ~200 bytes: ~1 MiB)."""

# Flags as plain ints: reading an enum member through its class costs ~80 ns per message.
_OUTSIDE_TXN: Final = int(Flag.OUTSIDE_TXN)
_CONTINUE_TXN: Final = int(Flag.CONTINUE_TXN)
_ACK_TXN: Final = int(Flag.ACK_TXN)

# The layout of Gazette UUIDs (see `uuid.py`), folded into one expression for the hot path.
_VERSION_1: Final = 0x1000 << 64
_VARIANT: Final = 0x8000 << 48


def _uuid_int(node: int, clock: int, flags: int) -> int:
    return (
        ((clock >> 4) & 0xFFFF_FFFF) << 96
        | ((clock >> 36) & 0xFFFF) << 80
        | ((clock >> 52) & 0x0FFF) << 64
        | _VERSION_1
        | (((clock & 0xF) << 10) | flags) << 48
        | _VARIANT
        | node
    )


# The clock's bits that stay in a UUID's constant part (see `Publisher._sequence`): all but
# time_low's 4..35.
_UUID_KEY_MASK: Final = ~(0xFFFF_FFFF << 4)

_SAFE_UNKNOWN: Final = uuid_module.SafeUUID.unknown
_new_object: Final = object.__new__


def _new_uuid(value: int) -> UUID:
    # uuid.UUID's constructor parses and checks its many argument forms (about 1 µs); a
    # publisher mints one per message from an int it built itself. This sets the same slots
    # the constructor would, through their descriptors (UUID's own __setattr__ refuses);
    # `_check_fast_uuid` proves the result equal at import.
    out = _new_object(UUID)
    _set_int(out, value)
    _set_is_safe(out, _SAFE_UNKNOWN)
    return out


def _slot_setter(name: str) -> Callable[[UUID, object], None]:
    descriptor = UUID.__dict__.get(name)
    setter = getattr(descriptor, "__set__", None)
    if setter is None:  # A future UUID without this slot: `_check_fast_uuid` falls back.
        return lambda out, value: object.__setattr__(out, name, value)
    return setter  # type: ignore[no-any-return]


_set_int: Final = _slot_setter("int")
_set_is_safe: Final = _slot_setter("is_safe")


def _check_fast_uuid() -> Callable[[int], UUID]:
    probe = _uuid_int(0x0123456789AB, 0x1EDCBA98765432F, int(Flag.ACK_TXN))
    try:
        fast = _new_uuid(probe)
        if fast == UUID(int=probe) and hash(fast) == hash(UUID(int=probe)) and str(fast):
            return _new_uuid
    except (AttributeError, TypeError):  # A future UUID with other slots.
        pass
    return lambda value: UUID(int=value)


_make_uuid: Final = _check_fast_uuid()
_FAST_UUID: Final = _make_uuid is _new_uuid
# Consumes an iterator in C (a map whose calls are done for their effect).
_drain: Final[Callable[[Iterable[object]], None]] = deque[object](maxlen=0).extend


class Publisher(Generic[A]):
    """See the module docstring.

    `clock`: pass one to control time (tests, the simulation) and move it forward yourself
    (`update_clock`); without one, the publisher's own clock follows `time_ns` at every
    publish. `producer_id`: random unless given. `message_bytes_max`: the bound on one
    message's encoding, given to each journal's framing.
    """

    def __init__(
        self,
        appender: AsyncJournalAppender[A],
        clock: Clock | None = None,
        *,
        producer_id: ProducerID | None = None,
        message_bytes_max: int = MESSAGE_BYTES_MAX_DEFAULT,
        time_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        if not 1 <= message_bytes_max <= MESSAGE_BYTES_MAX_LIMIT:
            raise FramingConfigError(
                f"message_bytes_max: {message_bytes_max} must be in [1, {MESSAGE_BYTES_MAX_LIMIT}]"
            )
        self._appender = appender
        # The appender's one-call fast path, if it has one (AppendService does).
        self._append_nowait: AppendNowait[A] | None = getattr(appender, "append_nowait", None)
        self._auto_clock = clock is None
        self._clock = clock if clock is not None else Clock.from_unix_nanos(time_ns())
        self._time_ns = time_ns
        self._producer = _checked_producer(producer_id)
        self._node = int.from_bytes(self._producer, "big")
        self._high_clock = -1  # Clock bits above the low 36 that `_high_bits` was built for.
        self._high_bits = 0
        # `_sequence`'s UUID constant, for the clock bits outside time_low and the flags.
        self._uuid_key = -1
        self._uuid_flags = -1
        self._uuid_offset = 0
        self._message_bytes_max = message_bytes_max
        self._framings: dict[str, Framing] = {}
        # Message type → its UUID slot's setter (`uuid_slot_setter`), or None to call its
        # `set_uuid`: one entry per message type published.
        self._uuid_slots: dict[type, Callable[[Any, UUID], None] | None] = {}
        # What a publish that needed no wait returns: a resolved future of the batch it joined,
        # one per batch (awaiting it is one C call, where a coroutine per message cost a frame).
        self._ready_batch: A | None = None
        self._ready: asyncio.Future[A] | None = None
        # Journal → (acknowledgement message, framing) of the open transaction, in first-publish
        # order.
        self._intents: dict[str, tuple[Message, Framing]] = {}
        # Publishes called but not finished (counted from the call, so one never awaited stays
        # counted): a transaction must not close over them (`check_finished`).
        self._unfinished_committed = 0
        self._unfinished_uncommitted = 0

    @property
    def producer_id(self) -> ProducerID:
        return self._producer

    @property
    def clock(self) -> Clock:
        return self._clock

    def update_clock(self, unix_nanos: int | None = None) -> None:
        """Move the clock forward to wall time (now, or `unix_nanos`); never backward."""
        self._clock.update(self._time_ns() if unix_nanos is None else unix_nanos)

    def sequence_uuid(self, flags: Flag | int = Flag.OUTSIDE_TXN) -> UUID:
        """A UUID of this producer with the next clock value (for messages appended by other
        means, which must still be ordered with this publisher's)."""
        if self._auto_clock:
            self.update_clock()
        return _make_uuid(_uuid_int(self._node, self._clock.tick(), _checked_flags(flags)))

    def publish_committed(self, mapping: Callable[[Any], Partition], message: Any) -> Awaitable[A]:
        """Publish `message` to the journal `mapping` chooses, readable at once by
        read-committed readers: ``aa = await publisher.publish_committed(mapping, msg)``
        returns the batch it joined (await that to learn when it committed)."""
        # A plain function returning an awaitable, rather than a coroutine: where the appender
        # takes the message at once (the common case), all the work is done here and what it
        # returns is a resolved future of the batch (shared by the batch's messages; nothing
        # to close if never awaited); else a coroutine that appends once it may. Errors
        # (mapping, marshalling) raise at the call, which `await
        # publisher.publish_committed(...)` cannot tell apart.
        journal, content_type = mapping(message)
        framing = self._framings.get(content_type) or self._framing(content_type)
        append_nowait = self._append_nowait
        if append_nowait is not None:
            # The appender's fast path, if it needs no wait. The clock ticks right before the
            # append, with no await in between, so clocks reach the journal in order; if the
            # appender must wait, nothing saw this clock value, so it is given back rather than
            # skipped, and the message is sequenced again once it may append.
            clock = self._clock
            before = clock.value
            appended = append_nowait(journal, self._sequence(message, framing, _OUTSIDE_TXN))
            if appended is not None:
                ready = self._ready
                if ready is None or appended is not self._ready_batch:
                    ready = self._resolved(appended)
                return ready
            clock.value = before
        self._unfinished_committed += 1
        return self._append_counted(journal, framing, message)

    def publish_uncommitted(
        self, mapping: Callable[[Any], Partition], message: Any
    ) -> Awaitable[A]:
        """Publish `message` as part of the open transaction; it is delivered to read-committed
        readers only after the ACK intent of `build_ack_intents` is appended:
        ``aa = await publisher.publish_uncommitted(mapping, msg)``."""
        # A plain function returning an awaitable, as publish_committed and for the same reason
        # (an exactly-once shard publishing per message calls it per message); errors raise at
        # the call. The journal's ACK intent is noted once its message is appended.
        new_acknowledgement = getattr(message, "new_acknowledgement", None)
        if new_acknowledgement is None:
            raise InvalidMessageError(
                f"{type(message).__name__} is not a Message: it has no new_acknowledgement"
            )
        journal, content_type = mapping(message)
        framing = self._framings.get(content_type) or self._framing(content_type)
        append_nowait = self._append_nowait
        if append_nowait is not None:
            # The appender's fast path, as in publish_committed.
            clock = self._clock
            before = clock.value
            appended = append_nowait(journal, self._sequence(message, framing, _CONTINUE_TXN))
            if appended is not None:
                if journal not in self._intents:
                    self._intents[journal] = (new_acknowledgement(journal), framing)
                ready = self._ready
                if ready is None or appended is not self._ready_batch:
                    ready = self._resolved(appended)
                return ready
            clock.value = before
        self._unfinished_uncommitted += 1
        return self._append_uncommitted(journal, framing, message, new_acknowledgement)

    def _resolved(self, appended: A) -> asyncio.Future[A]:
        """A resolved future of `appended`, kept for the next messages that join that batch."""
        ready: asyncio.Future[A] = asyncio.get_running_loop().create_future()
        ready.set_result(appended)
        self._ready_batch, self._ready = appended, ready
        return ready

    async def _append_uncommitted(
        self,
        journal: str,
        framing: Framing,
        message: Any,
        new_acknowledgement: Callable[[str], Message],
    ) -> A:
        # Counted unfinished from the call (`publish_uncommitted`) until here: a coroutine never
        # awaited never runs this, and stays counted.
        try:
            appended = await self._append(journal, framing, message, _CONTINUE_TXN)
            if journal not in self._intents:
                self._intents[journal] = (new_acknowledgement(journal), framing)
            return appended
        finally:
            self._unfinished_uncommitted -= 1

    async def _append_counted(self, journal: str, framing: Framing, message: Any) -> A:
        """`publish_committed`'s path that waits, counted unfinished as `_append_uncommitted`."""
        try:
            return await self._append(journal, framing, message, _OUTSIDE_TXN)
        finally:
            self._unfinished_committed -= 1

    @property
    def unfinished_publishes(self) -> int:
        """Publishes called but not finished: waiting for back-pressure, or never awaited (a
        message of those is not appended until its publish is awaited)."""
        return self._unfinished_committed + self._unfinished_uncommitted

    def check_finished(self) -> None:
        """Raise UnfinishedPublishError if any publish is unfinished (`unfinished_publishes`):
        what a transaction checks before it closes, as a shard does before its checkpoint."""
        if self._unfinished_committed or self._unfinished_uncommitted:
            raise UnfinishedPublishError(self._unfinished_committed, self._unfinished_uncommitted)

    def publish_committed_batch(
        self, mapping: Callable[[Any], Partition], messages: Sequence[Any]
    ) -> Awaitable[list[A]]:
        """`publish_committed` of each of `messages`, in order, a run at a time (see the module
        docstring); returns the batches they joined, each once, in order. Every message is
        mapped and checked first: a mapping error or an object that is not a Message raises
        with nothing appended. An encoding error (or an appender's) raises with the runs before
        its own appended, and nothing of its run."""
        self._unfinished_committed += 1
        return self._publish_batch(mapping, messages, _OUTSIDE_TXN)

    def publish_uncommitted_batch(
        self, mapping: Callable[[Any], Partition], messages: Sequence[Any]
    ) -> Awaitable[list[A]]:
        """`publish_uncommitted` of each of `messages`, as `publish_committed_batch` does
        `publish_committed`: part of the open transaction, each journal's ACK intent noted
        once a run of its messages is appended."""
        self._unfinished_uncommitted += 1
        return self._publish_batch(mapping, messages, _CONTINUE_TXN)

    async def _publish_batch(
        self, mapping: Callable[[Any], Partition], messages: Sequence[Any], flags: int
    ) -> list[A]:
        # Counted unfinished from the call, as `_append_uncommitted`.
        try:
            return await self._publish_runs(mapping, messages, flags)
        finally:
            if flags == _OUTSIDE_TXN:
                self._unfinished_committed -= 1
            else:
                self._unfinished_uncommitted -= 1

    async def _publish_runs(
        self, mapping: Callable[[Any], Partition], messages: Sequence[Any], flags: int
    ) -> list[A]:
        # Map and check everything first: runs of consecutive messages to one journal, each
        # (journal, framing, its first message's index); the run ends at the next's first.
        # Each message type is checked once (on one of its messages), and every message is
        # mapped, by C loops.
        kinds = dict(zip(map(type, messages), messages, strict=True))
        for message in kinds.values():
            _check_message(message, flags)
        # One UUID setter for every run, if every type in the batch allows the slot's.
        set_slot = self._slot_setter_of(kinds) if _FAST_UUID else None
        partitions = list(map(mapping, messages))
        runs: list[tuple[str, Framing, int]] = []
        if partitions and partitions.count(partitions[0]) == len(partitions):
            journal, content_type = partitions[0]  # The usual case: all to one journal.
            framing = self._framings.get(content_type) or self._framing(content_type)
            runs = [(journal, framing, i) for i in range(0, len(partitions), PUBLISH_RUN_MAX)]
        last: tuple[str, str] | None = None
        for index, partition in enumerate(partitions if not runs else ()):
            if partition != last or index - runs[-1][2] == PUBLISH_RUN_MAX:
                journal, content_type = last = partition
                framing = self._framings.get(content_type) or self._framing(content_type)
                runs.append((journal, framing, index))
        out: list[A] = []
        joined: set[int] = set()  # ids of the batches in `out`.
        for n, (journal, framing, start) in enumerate(runs):
            stop = runs[n + 1][2] if n + 1 < len(runs) else len(messages)
            run = messages[start:stop]
            appended = self._appender.start_append_nowait(journal)
            if appended is None:
                appended = await self._appender.start_append(journal)
            # Held from here to release: no await, so clocks reach the journal in order.
            try:
                self._sequence_run(run, flags, set_slot)
                appended.write(framing.marshal_many(run))
            except BaseException:
                # Nothing of this run was written (a write that fails, a full spill disk,
                # leaves the batch as it was): the batch goes on without it, never held.
                appended.abort()
                raise
            appended.release()
            if id(appended) not in joined:
                joined.add(id(appended))
                out.append(appended)
            if flags == _CONTINUE_TXN and journal not in self._intents:
                self._intents[journal] = (run[0].new_acknowledgement(journal), framing)
        return out

    def _sequence_run(
        self, run: Sequence[Any], flags: int, set_slot: Callable[[Any, UUID], None] | None
    ) -> None:
        """Set the next UUIDs (of `flags`) on the messages of `run`, in order: `_sequence`'s
        clock for each, from one reading of the wall clock; through `set_slot` when given
        (`_slot_setter_of` the run's types), else each message's `set_uuid`. Refuses
        (ClockError) a run the clock cannot tick through, changing nothing."""
        clock = self._clock
        value = clock.value
        if self._auto_clock:
            wall = (self._time_ns() // 100 + G1582_NS100) << CLOCK_SEQUENCE_BITS
            if wall > value:
                value = wall
        count = len(run)
        last = value + count * TICK
        if last > CLOCK_MAX:
            raise ClockError(f"clock: {clock.value} cannot tick {count} times in the uint64 range")
        # A tick leaves the clock's low 4 bits (the sequence) as they are: their UUID bits,
        # with the flags', are the same for the whole run.
        assert TICK & 0xF == 0
        low = (((value & 0xF) << 10) | flags) << 48
        first = value + TICK
        if set_slot is not None and first >> 36 == last >> 36:
            # The whole run within one value of the clock's bits above time_low (a run crosses
            # into the next one every ~7 minutes of clock): its UUIDs are an arithmetic
            # progression (time_low moves by TICK >> 4 a message), built and set by C loops,
            # with no Python frame or big-int arithmetic per message (`_new_uuid` mapped).
            if first >> 36 != self._high_clock:
                self._high_clock = first >> 36
                self._high_bits = _uuid_int(self._node, first & ~0xF_FFFF_FFFF, 0)
            start = self._high_bits | low | ((first >> 4) & 0xFFFF_FFFF) << 96
            step = (TICK >> 4) << 96
            uuids = list(map(_new_object, repeat(UUID, count)))
            _drain(map(_set_int, uuids, range(start, start + count * step, step)))
            _drain(map(_set_is_safe, uuids, repeat(_SAFE_UNKNOWN, count)))
            _drain(map(set_slot, run, uuids))
            clock.value = last
            return
        high_clock, high_bits, make = self._high_clock, self._high_bits, _make_uuid
        bits = high_bits | low
        for message in run:
            value += TICK
            if value >> 36 != high_clock:  # As in `_sequence`.
                high_clock = value >> 36
                high_bits = _uuid_int(self._node, value & ~0xF_FFFF_FFFF, 0)
                bits = high_bits | low
            message.set_uuid(make(bits | ((value >> 4) & 0xFFFF_FFFF) << 96))
        clock.value = value
        self._high_clock, self._high_bits = high_clock, high_bits

    def _slot_setter_of(self, kinds: Iterable[type]) -> Callable[[Any, UUID], None] | None:
        """The UUID slot setter messages of every type of `kinds` may be given their UUID by
        (the same one: JSONMessage's field), or None if any type must have its `set_uuid`
        called."""
        setter = None
        slots = self._uuid_slots
        for kind in kinds:
            if kind in slots:
                slot = slots[kind]
            else:
                slot = slots[kind] = uuid_slot_setter(kind)
            if slot is None or (setter is not None and slot is not setter):
                return None
            setter = slot
        return setter

    def build_ack_intents(self) -> dict[str, bytes]:
        """The framed ACK_TXN message of each journal published to uncommitted since the last
        call, and forget them. On an error (an ACK that cannot be marshalled, or an uncommitted
        publish not finished: UnfinishedPublishError) nothing is forgotten."""
        if self._unfinished_uncommitted:
            # Its journal's intent may be missing, and its message would follow the ACK.
            raise UnfinishedPublishError(0, self._unfinished_uncommitted)
        out: dict[str, bytes] = {}
        for journal, (ack, framing) in self._intents.items():
            ack.set_uuid(self.sequence_uuid(_ACK_TXN))
            out[journal] = framing.marshal(ack)
        self._intents.clear()
        return out

    async def write_ack_intents(
        self, intents: Mapping[str, bytes], dependencies: Collection[Any] = ()
    ) -> list[A]:
        """Append each intent to its journal (see `write_ack_intents`)."""
        return await write_ack_intents(self._appender, intents, dependencies)

    async def _append(self, journal: str, framing: Framing, message: Any, flags: int) -> A:
        appended = self._appender.start_append_nowait(journal)
        if appended is None:
            appended = await self._appender.start_append(journal)
        # Held from here to release: no await, so clocks reach the journal in order.
        try:
            appended.write(self._sequence(message, framing, flags))
        except BaseException:
            appended.abort()  # Nothing was written: the batch goes on without this message.
            raise
        appended.release()
        return appended

    def _sequence(self, message: Any, framing: Framing, flags: int) -> bytes:
        """Set the next UUID (of `flags`) on `message`, and return its frame. Call right
        before appending the frame, with no await in between."""
        kind = type(message)
        set_slot = self._uuid_slots.get(kind)
        set_uuid = None
        if set_slot is None:
            if kind not in self._uuid_slots:
                set_slot = self._uuid_slots[kind] = uuid_slot_setter(kind)
            if set_slot is None:
                set_uuid = getattr(message, "set_uuid", None)
                if set_uuid is None:
                    raise InvalidMessageError(
                        f"{kind.__name__} is not a Message: it has no set_uuid"
                    )
        # Clock.update and Clock.tick, inlined: this runs for every message.
        clock = self._clock
        value = clock.value
        if self._auto_clock:
            wall = (self._time_ns() // 100 + G1582_NS100) << CLOCK_SEQUENCE_BITS
            if wall > value:
                value = wall
        value += TICK
        if value > CLOCK_MAX:  # Nothing changed: the clock is not moved.
            raise ClockError(f"clock: {clock.value} cannot tick past the uint64 range")
        clock.value = value
        # Of the UUID's bits, only the time_low field (clock bits 4..35, at bits 96..127) moves
        # from one message to the next: the rest (the clock's bits from 36 up and its low 4,
        # the flags, the producer, version and variant) changes every ~7 minutes, or with the
        # flags. While it does not, the UUID is the clock shifted into place (time_low at bit 96)
        # plus a constant (`_uuid_offset`: what the shift carried beyond time_low, its bits
        # above and the 4 below, subtracted): two operations on big ints where the fields
        # took nine.
        key = value & _UUID_KEY_MASK
        if key != self._uuid_key or flags != self._uuid_flags:
            self._uuid_key, self._uuid_flags = key, flags
            self._uuid_offset = _uuid_int(self._node, value, flags) - (value << 92)
        bits = (value << 92) + self._uuid_offset
        if _FAST_UUID:
            # `_new_uuid`, inlined (a Python call less per message).
            uuid = _new_object(UUID)
            _set_int(uuid, bits)
            _set_is_safe(uuid, _SAFE_UNKNOWN)
        else:
            uuid = _make_uuid(bits)
        if set_uuid is None:
            set_slot(message, uuid)  # type: ignore[misc]  # Checked above.
        else:
            set_uuid(uuid)
        return framing.marshal(message)

    def _framing(self, content_type: str) -> Framing:
        framing = framing_for_content_type(content_type, message_bytes_max=self._message_bytes_max)
        self._framings[content_type] = framing
        return framing


async def write_ack_intents(
    appender: AsyncJournalAppender[A],
    intents: Mapping[str, bytes],
    dependencies: Collection[Any] = (),
) -> list[A]:
    """Append each ACK intent (journal → framed ACK message) to its journal, each after
    `dependencies` (e.g. the commit of the checkpoint holding the intents). Returns the batches
    to await. Re-appending the same intents (recovery) is harmless: readers ignore an ACK
    whose clock they have already passed. An empty intent is skipped: it holds no message (our
    publishers never build one; a Go checkpoint may hold one, which Go appends as nothing)."""
    out: list[A] = []
    for journal, intent in intents.items():
        if not intent:
            continue
        appended = await appender.start_append(journal, dependencies)
        appended.write(intent)
        appended.release()
        out.append(appended)
    return out


def _check_message(message: Any, flags: int) -> None:
    """Raise InvalidMessageError if `message` lacks what publishing it with `flags` calls."""
    needs = ("set_uuid", "new_acknowledgement") if flags == _CONTINUE_TXN else ("set_uuid",)
    for name in needs:
        if getattr(message, name, None) is None:
            raise InvalidMessageError(
                f"{type(message).__name__} is not a Message: it has no {name}"
            )


def _checked_producer(value: ProducerID | None) -> ProducerID:
    if value is None:
        return new_producer_id()
    return as_producer_id(value)


def _checked_flags(flags: Flag | int) -> int:
    value = int(flags)
    if value not in (Flag.OUTSIDE_TXN, Flag.CONTINUE_TXN, Flag.ACK_TXN):
        raise ValueError(f"flags: must be OUTSIDE_TXN, CONTINUE_TXN or ACK_TXN (got {value:#x})")
    return value
