"""The Publisher's one-call path through `AppendService.append_nowait`, against its general path
(start_append, write, release): byte-identical journals, concurrent publishers kept in clock
order, and a clock that cannot tick refusing the message without appending anything."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Collection
from typing import Any
from uuid import UUID

import msgspec
import pytest

from broker.client.append_service import AppendService
from broker.client.async_append import AsyncAppend
from broker.client.route_cache import JournalClient
from gazette_consumer.message import CONTENT_TYPE_JSON_LINES, JSONMessage
from gazette_consumer.message.clock import CLOCK_MAX, Clock, ClockError
from gazette_consumer.message.mapping import Partition
from gazette_consumer.message.publisher import Publisher, UnfinishedPublishError
from gazette_consumer.message.uuid import ProducerID, get_clock, new_producer_id
from tests.broker.broker_testkit import Cluster, journal_spec, local_content

FAST, GENERAL = "test/fast", "test/general"


class Event(JSONMessage):
    n: int = 0


class GeneralOnly:
    """An AppendService seen only through the appender protocol's required methods, so that
    a Publisher over it takes the general path."""

    def __init__(self, service: AppendService) -> None:
        self._service = service

    def start_append(self, journal: str, dependencies: Collection[Any] = ()) -> Any:
        return self._service.start_append(journal, dependencies)

    def start_append_nowait(self, journal: str) -> AsyncAppend | None:
        return self._service.start_append_nowait(journal)


def to(journal: str):  # type: ignore[no-untyped-def]
    partition = Partition(journal, CONTENT_TYPE_JSON_LINES)
    return lambda message: partition


@pytest.fixture
async def env() -> AsyncIterator[tuple[Cluster, AppendService]]:
    cluster = Cluster()
    client: JournalClient | None = None
    try:
        broker = await cluster.start_broker("zone-a", "broker-a")
        for journal in (FAST, GENERAL):
            await cluster.create(journal_spec(journal), [broker])
        client = JournalClient(broker.endpoint)
        # Yield to the event loop often, so that the fast path is declined now and then.
        async with AppendService(client, writer_yield_bytes=300) as service:
            yield cluster, service
    finally:
        if client is not None:
            await client.close()
        await cluster.close()


def content(cluster: Cluster, journal: str) -> bytes:
    return local_content(cluster.brokers[0], journal)[1]


async def test_fast_and_general_paths_append_the_same_bytes(
    env: tuple[Cluster, AppendService],
) -> None:
    cluster, service = env
    producer, start = new_producer_id(), Clock.from_unix(1_700_000_000).value
    fast = Publisher(service, Clock(start), producer_id=producer)
    general = Publisher(GeneralOnly(service), Clock(start), producer_id=producer)
    for n in range(40):
        await fast.publish_committed(to(FAST), Event(n=n))
        await general.publish_committed(to(GENERAL), Event(n=n))
        if n % 10 == 9:
            await fast.publish_uncommitted(to(FAST), Event(n=n))
            await general.publish_uncommitted(to(GENERAL), Event(n=n))
            await fast.write_ack_intents(fast.build_ack_intents())
            await general.write_ack_intents(general.build_ack_intents())
    await service.flush()
    assert service.stats.failed == 0
    assert content(cluster, FAST) == content(cluster, GENERAL) != b""
    assert fast.clock == general.clock  # No clock value was skipped either way.


async def test_concurrent_publishers_reach_the_journal_in_clock_order(
    env: tuple[Cluster, AppendService],
) -> None:
    cluster, service = env
    publisher = Publisher(service)

    async def publish(first: int) -> None:
        for n in range(first, first + 30):
            await publisher.publish_committed(to(FAST), Event(n=n))

    await asyncio.gather(*(publish(i * 100) for i in range(4)))
    await service.flush()
    decode = msgspec.json.Decoder(Event).decode
    events = [decode(line) for line in content(cluster, FAST).splitlines()]
    assert sorted(e.n for e in events) == sorted(n + i * 100 for i in range(4) for n in range(30))
    # Interleaved publishers, one clock: the journal holds the clocks in increasing order.
    clocks = [get_clock(e.uuid) for e in events]
    assert all(a < b for a, b in itertools.pairwise(clocks))


async def test_a_clock_that_cannot_tick_refuses_the_message(
    env: tuple[Cluster, AppendService],
) -> None:
    cluster, service = env
    clock = Clock(CLOCK_MAX)
    publisher = Publisher(service, clock)
    for publish in (publisher.publish_committed, publisher.publish_uncommitted):
        with pytest.raises(ClockError, match="cannot tick past"):
            await publish(to(FAST), Event(n=1))
    assert clock.value == CLOCK_MAX
    assert publisher.build_ack_intents() == {}
    await service.flush()
    assert service.stats.releases == 0 and content(cluster, FAST) == b""


async def test_publish_uncommitted_appends_at_the_call_on_the_fast_path(
    env: tuple[Cluster, AppendService],
) -> None:
    """The fast path does the whole publish in the call (it returns the batch, resolved),
    noting the ACK intent with it; the general path, only once awaited. Either way the
    journal and the intents are the same."""
    cluster, service = env
    producer, start = new_producer_id(), Clock.from_unix(1_700_000_000).value
    fast = Publisher(service, Clock(start), producer_id=producer)
    general = Publisher(GeneralOnly(service), Clock(start), producer_id=producer)
    await general.publish_committed(to(GENERAL), Event(n=0))
    # Opens the journal's queue (until it idles): the fast path is open.
    await fast.publish_committed(to(FAST), Event(n=0))
    never_awaited = fast.publish_uncommitted(to(FAST), Event(n=1))
    # Already appended: what it returns is the batch, resolved (nothing to close or await).
    assert asyncio.isfuture(never_awaited) and never_awaited.done()
    assert never_awaited.result() is await fast.publish_committed(to(FAST), Event(n=2))
    pending = general.publish_uncommitted(to(GENERAL), Event(n=1))
    # Not appended yet (not awaited): no intents can be built over it.
    with pytest.raises(UnfinishedPublishError, match=r"\(0 committed, 1 uncommitted\)"):
        general.build_ack_intents()
    assert general.unfinished_publishes == 1
    await pending
    assert general.unfinished_publishes == 0
    await general.publish_committed(to(GENERAL), Event(n=2))
    await service.flush()
    assert content(cluster, FAST) == content(cluster, GENERAL) != b""
    fast_acks, general_acks = fast.build_ack_intents(), general.build_ack_intents()
    assert list(fast_acks) == [FAST] and list(general_acks) == [GENERAL]
    assert fast_acks[FAST] == general_acks[GENERAL]
    assert fast.clock == general.clock


async def test_unfinished_publishes_are_counted_from_the_call_until_they_finish(
    env: tuple[Cluster, AppendService],
) -> None:
    """A publish that waits appends only once awaited: counted from the call, whether it is
    never awaited, fails or is cancelled; a transaction cannot close over one."""
    cluster, service = env
    general = Publisher(GeneralOnly(service))
    never = general.publish_committed(to(GENERAL), Event(n=0))
    batch = general.publish_uncommitted_batch(to(GENERAL), [Event(n=1)])
    assert general.unfinished_publishes == 2
    with pytest.raises(
        UnfinishedPublishError, match=r"^2 publish\(es\) .* \(1 committed, 1 uncommitted\)"
    ):
        general.check_finished()
    # A batch publish that fails (mapping error) is finished: nothing of it appended.
    failing = general.publish_committed_batch(lambda m: 1 / 0, [Event(n=2)])  # type: ignore
    with pytest.raises(ZeroDivisionError):
        await failing
    # One cancelled while it waits is finished too.
    entered, gate = asyncio.Event(), asyncio.Event()

    async def blocked_start_append(journal: str, dependencies: Collection[Any] = ()) -> Any:
        entered.set()
        await gate.wait()
        raise AssertionError("never reached")

    blocked = GeneralOnly(service)
    blocked.start_append_nowait = lambda journal: None  # type: ignore[method-assign]
    blocked.start_append = blocked_start_append  # type: ignore[method-assign]
    waiting = Publisher(blocked)
    task = asyncio.ensure_future(waiting.publish_uncommitted(to(GENERAL), Event(n=3)))
    await entered.wait()
    assert waiting.unfinished_publishes == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert waiting.unfinished_publishes == 0
    assert waiting.build_ack_intents() == {}
    await batch
    assert general.unfinished_publishes == 1
    with pytest.raises(UnfinishedPublishError, match=r"\(1 committed, 0 uncommitted\)"):
        general.check_finished()
    assert list(general.build_ack_intents()) == [GENERAL]  # Only uncommitted ones block it.
    await never
    general.check_finished()
    await service.flush()
    # Each appended once awaited (so in the order they were awaited), nothing of the failed.
    appended = [
        msgspec.json.decode(line, type=Event).n for line in content(cluster, GENERAL).splitlines()
    ]
    assert appended == [1, 0]


async def test_publish_uncommitted_fast_path_matches_the_general_path_under_declines(
    env: tuple[Cluster, AppendService],
) -> None:
    """Many uncommitted messages to two journals, the appender declining the fast path now and
    then (it yields every 300 bytes): the same bytes and intents as the general path."""
    cluster, service = env
    producer, start = new_producer_id(), Clock.from_unix(1_700_000_000).value
    fast = Publisher(service, Clock(start), producer_id=producer)
    general = Publisher(GeneralOnly(service), Clock(start), producer_id=producer)
    fast_out: list[bytes] = []
    general_out: list[bytes] = []
    for n in range(60):
        await fast.publish_uncommitted(to(FAST), Event(n=n))
        await general.publish_uncommitted(to(GENERAL), Event(n=n))
        if n % 20 == 19:
            fast_acks, general_acks = fast.build_ack_intents(), general.build_ack_intents()
            assert list(fast_acks) == [FAST] and list(general_acks) == [GENERAL]
            fast_out.append(fast_acks[FAST])
            general_out.append(general_acks[GENERAL])
            await fast.write_ack_intents(fast_acks)
            await general.write_ack_intents(general_acks)
    await service.flush()
    assert service.stats.failed == 0
    assert fast_out == general_out
    assert content(cluster, FAST) == content(cluster, GENERAL) != b""
    assert fast.clock == general.clock


# A committed, an uncommitted and an ACK message, as a publisher with Gazette's TestUUIDBuilding
# producer and clock (Unix 1567304621.981273734, see test_message_uuid.py) frames them: byte for
# byte what the publisher wrote before its fast path built UUIDs inline and returned resolved
# futures. The second message's UUID is Gazette's fixture time (two ticks) with flags 0.
GOLDEN = (
    b'{"n":1,"UUID":"83fc2f8b-cc5f-11e9-8000-010203040506"}\n'
    b'{"n":2,"UUID":"83fc2f95-cc5f-11e9-8000-010203040506"}\n'
    b'{"n":3,"UUID":"83fc2f9f-cc5f-11e9-8001-010203040506"}\n'
    b'{"n":0,"UUID":"83fc2fa9-cc5f-11e9-8002-010203040506"}\n'
)


async def test_the_fast_path_frames_messages_byte_for_byte_as_before(
    env: tuple[Cluster, AppendService],
) -> None:
    cluster, service = env
    publisher = Publisher(
        service,
        Clock.from_unix(1567304621, 981273734),
        producer_id=ProducerID(bytes([1, 2, 3, 4, 5, 6])),
    )
    await publisher.publish_committed(to(FAST), Event(n=1))  # Opens the journal's queue.
    committed = publisher.publish_committed(to(FAST), Event(n=2))
    uncommitted = publisher.publish_uncommitted(to(FAST), Event(n=3))
    # Both took the fast path: appended at the call, the batch handed back resolved.
    assert asyncio.isfuture(committed) and asyncio.isfuture(uncommitted)
    assert await committed is await uncommitted
    await publisher.write_ack_intents(publisher.build_ack_intents())
    await service.flush()
    assert content(cluster, FAST) == GOLDEN


class OwnSetter(JSONMessage):
    """Overrides set_uuid: the publisher must call it, not set the field's slot itself."""

    n: int = 0
    set_calls: int = 0

    def set_uuid(self, uuid: UUID) -> None:
        self.set_calls += 1
        self.uuid = uuid


class Frozen(JSONMessage, frozen=True):
    n: int = 0


async def test_the_uuid_reaches_the_message_and_the_journal_by_either_setter(
    env: tuple[Cluster, AppendService],
) -> None:
    # Event keeps JSONMessage's set_uuid (its slot is set directly); OwnSetter does not.
    cluster, service = env
    publisher = Publisher(service)
    published = [Event(n=0), OwnSetter(n=1), Event(n=2), OwnSetter(n=3)]
    for message in published:
        await (await publisher.publish_committed(to(FAST), message))
    # Called at least once (twice where the fast path declined and the message was sequenced
    # again on the general path).
    assert all(m.set_calls >= 1 for m in published if isinstance(m, OwnSetter))
    lines = content(cluster, FAST).splitlines()
    written = [msgspec.json.decode(line, type=Event) for line in lines]
    assert [w.uuid for w in written] == [m.get_uuid() for m in published]
    assert len({w.uuid for w in written}) == len(published)


async def test_a_frozen_message_is_refused_as_its_set_uuid_refuses(
    env: tuple[Cluster, AppendService],
) -> None:
    # Its set_uuid raises (a frozen struct): the publisher must not set the slot around it.
    cluster, service = env
    publisher = Publisher(service)
    frozen = Frozen(n=1)
    with pytest.raises(AttributeError):
        publisher.publish_committed(to(FAST), frozen)
    assert frozen.get_uuid() is None
    await service.flush()
    assert content(cluster, FAST) == b""
