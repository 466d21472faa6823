"""The Publisher's batch publishes (`publish_committed_batch`, `publish_uncommitted_batch`)
against one-by-one publishing: byte-identical journals, the same ACK intents and clock, runs
split at journal changes and at PUBLISH_RUN_MAX; bad input refused with nothing appended."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from uuid import UUID

import msgspec
import pytest

from broker.client.append_service import AppendService
from broker.client.route_cache import JournalClient
from gazette_consumer.message import CONTENT_TYPE_JSON_LINES, JSONMessage
from gazette_consumer.message.clock import CLOCK_MAX, TICK, Clock, ClockError
from gazette_consumer.message.framing import MessageTooLargeError
from gazette_consumer.message.mapping import Partition
from gazette_consumer.message.publisher import (
    PUBLISH_RUN_MAX,
    InvalidMessageError,
    Publisher,
)
from gazette_consumer.message.uuid import Flag, build_uuid, get_clock, new_producer_id
from tests.broker.broker_testkit import Cluster, journal_spec, local_content

BATCH_A, BATCH_B, ONE_A, ONE_B = "test/batch-a", "test/batch-b", "test/one-a", "test/one-b"


class Event(JSONMessage):
    n: int = 0
    pad: str = ""


@pytest.fixture
async def env() -> AsyncIterator[tuple[Cluster, AppendService]]:
    cluster = Cluster()
    client: JournalClient | None = None
    try:
        broker = await cluster.start_broker("zone-a", "broker-a")
        for journal in (BATCH_A, BATCH_B, ONE_A, ONE_B):
            await cluster.create(journal_spec(journal), [broker])
        client = JournalClient(broker.endpoint)
        async with AppendService(client) as service:
            yield cluster, service
    finally:
        if client is not None:
            await client.close()
        await cluster.close()


def content(cluster: Cluster, journal: str) -> bytes:
    return local_content(cluster.brokers[0], journal)[1]


def by_parity(even: str, odd: str):  # type: ignore[no-untyped-def]
    partitions = [Partition(even, CONTENT_TYPE_JSON_LINES), Partition(odd, CONTENT_TYPE_JSON_LINES)]
    # Runs of three to one journal, then the other: runs end where the journal changes.
    return lambda message: partitions[(message.n // 3) % 2]


@pytest.mark.parametrize("committed", [True, False])
async def test_a_batch_appends_what_one_by_one_appends(
    env: tuple[Cluster, AppendService], committed: bool
) -> None:
    cluster, service = env
    producer, start = new_producer_id(), Clock.from_unix(1_700_000_000).value
    batch = Publisher(service, Clock(start), producer_id=producer)
    one = Publisher(service, Clock(start), producer_id=producer)
    count = PUBLISH_RUN_MAX + 10  # One journal's run longer than a write: split.
    to_batch = by_parity(BATCH_A, BATCH_B)
    to_one = by_parity(ONE_A, ONE_B)
    head = [Event(n=n) for n in range(12)]  # Alternating journals every three.
    tail = [Event(n=6, pad="x") for _ in range(count)]  # All to the A journals.
    messages_batch = head + tail
    messages_one = [Event(n=m.n, pad=m.pad) for m in messages_batch]
    if committed:
        appended = await batch.publish_committed_batch(to_batch, messages_batch)
        for message in messages_one:
            await one.publish_committed(to_one, message)
    else:
        appended = await batch.publish_uncommitted_batch(to_batch, messages_batch)
        for message in messages_one:
            await one.publish_uncommitted(to_one, message)
    assert appended and len(set(map(id, appended))) == len(appended)
    for aa in appended:
        await aa
    await service.flush()
    assert service.stats.failed == 0
    assert content(cluster, BATCH_A) == content(cluster, ONE_A) != b""
    assert content(cluster, BATCH_B) == content(cluster, ONE_B) != b""
    assert [m.uuid for m in messages_batch] == [m.uuid for m in messages_one]
    assert batch.clock == one.clock
    assert batch.clock.value == start + len(messages_batch) * TICK
    batch_acks, one_acks = batch.build_ack_intents(), one.build_ack_intents()
    if committed:
        assert batch_acks == one_acks == {}
    else:
        assert list(batch_acks) == [BATCH_A, BATCH_B] and list(one_acks) == [ONE_A, ONE_B]
        assert list(batch_acks.values()) == list(one_acks.values())


async def test_an_auto_clock_batch_gets_rising_uuids_from_wall_time(
    env: tuple[Cluster, AppendService],
) -> None:
    cluster, service = env
    publisher = Publisher(service)
    messages = [Event(n=0) for _ in range(50)]
    before = publisher.clock.value
    await publisher.publish_committed_batch(by_parity(BATCH_A, BATCH_B), messages)
    await service.flush()
    decode = msgspec.json.Decoder(Event).decode
    written = [decode(line).uuid for line in content(cluster, BATCH_A).splitlines()]
    assert written == [m.uuid for m in messages]
    clocks = [get_clock(u) for u in written]
    assert clocks[0] > before and all(b - a == TICK for a, b in itertools.pairwise(clocks))


async def test_bad_input_is_refused_with_nothing_appended(
    env: tuple[Cluster, AppendService],
) -> None:
    cluster, service = env
    publisher = Publisher(service, Clock(Clock.from_unix(1_700_000_000).value))
    to = by_parity(BATCH_A, BATCH_B)
    with pytest.raises(InvalidMessageError, match="has no set_uuid"):
        await publisher.publish_committed_batch(to, [Event(n=0), object()])

    class NoAck:
        n = 0

        def set_uuid(self, uuid: object) -> None:
            pass

    with pytest.raises(InvalidMessageError, match="has no new_acknowledgement"):
        await publisher.publish_uncommitted_batch(to, [Event(n=0), NoAck()])

    def failing(message: Event) -> Partition:
        if message.n == 4:
            raise LookupError("no partition for 4")
        return Partition(BATCH_A, CONTENT_TYPE_JSON_LINES)

    with pytest.raises(LookupError, match="no partition for 4"):
        await publisher.publish_uncommitted_batch(failing, [Event(n=n) for n in range(6)])
    clock = publisher.clock.value
    await service.flush()
    assert service.stats.releases == 0
    assert content(cluster, BATCH_A) == content(cluster, BATCH_B) == b""
    assert publisher.build_ack_intents() == {}
    assert publisher.clock.value == clock


async def test_a_run_that_fails_to_encode_or_tick_appends_nothing_of_its_own(
    env: tuple[Cluster, AppendService],
) -> None:
    cluster, service = env
    publisher = Publisher(service, Clock(Clock.from_unix(1_700_000_000).value))
    to = by_parity(BATCH_A, BATCH_B)
    # The first run (n 0-2, to A) is appended; the second (n 3-5, to B) holds a message over
    # the framing's bound and raises, naming it: nothing of it is appended.
    small = publisher._framing(CONTENT_TYPE_JSON_LINES)  # Bound it low.
    small.message_bytes_max = 200
    messages = [Event(n=n, pad="y" * (300 if n == 4 else 0)) for n in range(9)]
    with pytest.raises(MessageTooLargeError):
        await publisher.publish_uncommitted_batch(to, messages)
    await service.flush()
    assert len(content(cluster, BATCH_A).splitlines()) == 3
    assert content(cluster, BATCH_B) == b""
    assert list(publisher.build_ack_intents()) == [BATCH_A]

    stuck = Publisher(service, Clock(CLOCK_MAX - 3 * TICK))
    with pytest.raises(ClockError, match="cannot tick"):
        await stuck.publish_committed_batch(to, [Event(n=0) for _ in range(3)] + [Event(n=1)])
    assert stuck.clock.value == CLOCK_MAX - 3 * TICK
    await service.flush()
    assert len(content(cluster, BATCH_A).splitlines()) == 3  # Nothing more.


class OwnSetter(JSONMessage):
    """Overrides set_uuid: a batch holding it must call it, not set the field's slot."""

    n: int = 0
    seen: list[UUID] = msgspec.field(default_factory=list)

    def set_uuid(self, uuid: UUID) -> None:
        self.seen.append(uuid)
        self.uuid = uuid


@pytest.mark.parametrize("committed", [True, False])
async def test_runs_across_the_clocks_upper_bits_get_one_by_ones_uuids(
    env: tuple[Cluster, AppendService], committed: bool
) -> None:
    # A run's UUIDs are built as a progression while the clock's bits above time_low stay
    # the same (they change every 2**36 clock values): start just below such a boundary, so
    # that one run crosses it, and the next runs (wholly above it) need the new upper bits.
    cluster, service = env
    producer = new_producer_id()
    start = (Clock.from_unix(1_700_000_000).value | 0xF_FFFF_FFFF) - 2 * TICK
    batch = Publisher(service, Clock(start), producer_id=producer)
    one = Publisher(service, Clock(start), producer_id=producer)
    to_batch = by_parity(BATCH_A, BATCH_B)
    to_one = by_parity(ONE_A, ONE_B)
    runs = [[Event(n=n) for n in range(6)], [Event(n=n) for n in range(6)], [Event(n=0)]]
    flags = Flag.OUTSIDE_TXN if committed else Flag.CONTINUE_TXN
    for run in runs:
        if committed:
            await batch.publish_committed_batch(to_batch, run)
        else:
            await batch.publish_uncommitted_batch(to_batch, run)
        for message in [Event(n=m.n) for m in run]:
            if committed:
                await one.publish_committed(to_one, message)
            else:
                await one.publish_uncommitted(to_one, message)
    await service.flush()
    assert content(cluster, BATCH_A) == content(cluster, ONE_A) != b""
    assert content(cluster, BATCH_B) == content(cluster, ONE_B) != b""
    uuids = [m.uuid for run in runs for m in run]
    expected = [build_uuid(producer, start + (1 + n) * TICK, flags) for n in range(len(uuids))]
    assert uuids == expected
    assert batch.clock == one.clock


async def test_a_run_mixing_message_types_calls_each_own_set_uuid(
    env: tuple[Cluster, AppendService],
) -> None:
    cluster, service = env
    producer, start = new_producer_id(), Clock.from_unix(1_700_000_000).value
    batch = Publisher(service, Clock(start), producer_id=producer)
    one = Publisher(service, Clock(start), producer_id=producer)
    messages_batch: list[JSONMessage] = [Event(n=0), OwnSetter(n=0), Event(n=1), OwnSetter(n=1)]
    messages_one: list[JSONMessage] = [Event(n=0), OwnSetter(n=0), Event(n=1), OwnSetter(n=1)]
    await batch.publish_committed_batch(
        lambda _m: Partition(BATCH_A, CONTENT_TYPE_JSON_LINES), messages_batch
    )
    for message in messages_one:
        await one.publish_committed(lambda _m: Partition(ONE_A, CONTENT_TYPE_JSON_LINES), message)
    await service.flush()
    assert content(cluster, BATCH_A) == content(cluster, ONE_A) != b""
    own = [m for m in messages_batch if isinstance(m, OwnSetter)]
    assert [m.seen for m in own] == [[m.uuid] for m in own]
    expected = [build_uuid(producer, start + (1 + n) * TICK, Flag.OUTSIDE_TXN) for n in range(4)]
    assert [m.uuid for m in messages_batch] == expected
