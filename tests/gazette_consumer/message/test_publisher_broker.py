"""Publisher through a real AppendService and in-process broker: UUIDs that parse back from
the journal, transactions and their ACK intents, and refused messages that append nothing."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from broker.client.append_service import AppendService
from broker.client.route_cache import JournalClient
from gazette_consumer.message import (
    CONTENT_TYPE_JSON_LINES,
    Envelope,
    Flag,
    JSONFraming,
    JSONMessage,
    MessageEncodeError,
    MessageTooLargeError,
    UnknownContentTypeError,
    decode_envelope,
)
from gazette_consumer.message.clock import TICK, Clock
from gazette_consumer.message.mapping import Partition, Partitions, modulo_mapping
from gazette_consumer.message.publisher import InvalidMessageError, Publisher
from gazette_consumer.message.uuid import build_uuid
from tests.broker.broker_testkit import Cluster, journal_spec, local_content

JOURNALS = ["test/pub-a", "test/pub-b"]
PARTITIONS = Partitions.of_journals(JOURNALS, CONTENT_TYPE_JSON_LINES)


class Event(JSONMessage):
    key: str = ""
    n: int = 0


def to(journal: str):  # type: ignore[no-untyped-def]
    partition = Partition(journal, CONTENT_TYPE_JSON_LINES)
    return lambda message: partition


@dataclass
class Env:
    cluster: Cluster
    service: AppendService

    def envelopes(self, journal: str) -> list[Envelope[Event]]:
        begin, data = local_content(self.cluster.brokers[0], journal)
        framing = JSONFraming()
        decoder = framing.new_decoder(Event)
        out = []
        for frame in framing.unpack(journal, begin, data):
            assert not isinstance(frame, Exception), frame
            out.append(decode_envelope(decoder, frame))
        return out


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    cluster = Cluster()
    client: JournalClient | None = None
    try:
        broker = await cluster.start_broker("zone-a", "broker-a")
        for journal in JOURNALS:
            await cluster.create(journal_spec(journal), [broker])
        client = JournalClient(broker.endpoint)
        async with AppendService(client) as service:
            yield Env(cluster, service)
    finally:
        if client is not None:
            await client.close()
        await cluster.close()


async def test_committed_messages_carry_uuids_that_parse_back(env: Env) -> None:
    publisher = Publisher(env.service)
    mapping = modulo_mapping(lambda event: event.key, PARTITIONS)
    sent = [Event(key=f"key-{i % 7}", n=i) for i in range(60)]
    for event in sent:
        await publisher.publish_committed(mapping, event)
    await env.service.flush()

    received: dict[int, Envelope[Event]] = {}
    for journal in JOURNALS:
        envelopes = env.envelopes(journal)
        assert envelopes, journal  # Seven keys spread over both journals.
        # Clocks strictly increase in journal order, and are of this producer.
        assert all(a.clock < b.clock for a, b in itertools.pairwise(envelopes))
        for envelope in envelopes:
            assert envelope.producer == publisher.producer_id
            assert envelope.flags == Flag.OUTSIDE_TXN
            assert mapping(envelope.message).journal == journal
            received[envelope.message.n] = envelope
    assert sorted(received) == list(range(60))
    # The UUID the publisher set on each message is the one read back.
    assert all(received[event.n].uuid == event.get_uuid() for event in sent)
    clocks = [received[n].clock for n in range(60)]
    assert clocks == sorted(clocks) and len(set(clocks)) == 60


async def test_uncommitted_publishes_then_ack_intents_per_journal(env: Env) -> None:
    clock = Clock.from_unix(1_700_000_000)
    publisher = Publisher(env.service, clock)
    for n in range(3):
        await publisher.publish_uncommitted(to(JOURNALS[0]), Event(n=n))
    await publisher.publish_uncommitted(to(JOURNALS[1]), Event(n=3))
    last_published = clock.value

    intents = publisher.build_ack_intents()
    assert list(intents) == JOURNALS  # One per journal, in first-publish order.
    assert publisher.build_ack_intents() == {}  # And then none.
    acks = {}
    for journal, intent in intents.items():
        (frame,) = JSONFraming().unpack(journal, 0, intent)
        assert not isinstance(frame, Exception)
        acks[journal] = decode_envelope(JSONFraming().new_decoder(Event), frame)
    assert all(ack.flags == Flag.ACK_TXN for ack in acks.values())
    assert all(ack.producer == publisher.producer_id for ack in acks.values())
    assert last_published < acks[JOURNALS[0]].clock < acks[JOURNALS[1]].clock

    appended = await publisher.write_ack_intents(intents)
    for aa in appended:
        await aa
    for journal in JOURNALS:
        envelopes = env.envelopes(journal)
        assert [e.flags for e in envelopes[:-1]] == [Flag.CONTINUE_TXN] * (len(envelopes) - 1)
        assert envelopes[-1].uuid == acks[journal].uuid  # The ACK comes last.
        assert all(e.clock < envelopes[-1].clock for e in envelopes[:-1])
    assert [e.message.n for e in env.envelopes(JOURNALS[0])[:-1]] == [0, 1, 2]

    # An empty intent (a Go checkpoint may hold one: Go appends it as an empty append) is no
    # message: nothing is appended for it; the others are (again: readers skip a repeated ACK).
    counts = [len(env.envelopes(journal)) for journal in JOURNALS]
    again = await publisher.write_ack_intents({JOURNALS[0]: intents[JOURNALS[0]], JOURNALS[1]: b""})
    assert len(again) == 1
    await again[0]
    assert [len(env.envelopes(journal)) for journal in JOURNALS] == [counts[0] + 1, counts[1]]
    assert env.envelopes(JOURNALS[0])[-1].uuid == acks[JOURNALS[0]].uuid

    # A new transaction acknowledges only the journals it touched.
    await publisher.publish_uncommitted(to(JOURNALS[1]), Event(n=4))
    assert list(publisher.build_ack_intents()) == [JOURNALS[1]]


async def test_an_oversized_message_is_refused_and_nothing_is_appended(env: Env) -> None:
    publisher = Publisher(env.service, message_bytes_max=100)
    with pytest.raises(MessageTooLargeError, match="message_bytes_max 100"):
        await publisher.publish_committed(to(JOURNALS[0]), Event(key="x" * 100))
    with pytest.raises(MessageTooLargeError):
        await publisher.publish_uncommitted(to(JOURNALS[0]), Event(key="y" * 100))
    assert publisher.build_ack_intents() == {}  # The refused message opened no transaction.
    fits = Event(key="fits")
    await (await publisher.publish_committed(to(JOURNALS[0]), fits))
    assert [e.message for e in env.envelopes(JOURNALS[0])] == [fits]
    assert env.service.stats.committed_bytes == len(JSONFraming().marshal(fits))
    # Refused before the journal's batch was even taken: no abort was needed.
    assert (env.service.stats.aborts, env.service.stats.releases) == (0, 1)


class Loose(JSONMessage):
    anything: object = None


async def test_a_message_exactly_at_the_bound_is_published_and_one_past_is_refused(
    env: Env,
) -> None:
    # The bound is on the document, the newline aside.
    framing = JSONFraming()
    size = len(framing.marshal(Event(key=""))) - 1  # The document of an empty key.
    publisher = Publisher(env.service, message_bytes_max=size + 10)
    at_bound = Event(key="k" * 10)
    await (await publisher.publish_committed(to(JOURNALS[0]), at_bound))
    with pytest.raises(MessageTooLargeError, match=f"message_bytes_max {size + 10}"):
        publisher.publish_committed(to(JOURNALS[0]), Event(key="k" * 11))
    assert [e.message for e in env.envelopes(JOURNALS[0])] == [at_bound]


async def test_a_message_json_cannot_encode_is_refused_with_a_typed_error(env: Env) -> None:
    publisher = Publisher(env.service)
    with pytest.raises(MessageEncodeError, match="Loose message is not JSON-encodable"):
        publisher.publish_committed(to(JOURNALS[0]), Loose(anything=object()))
    fine = Loose(anything=[1, "two"])
    await (await publisher.publish_committed(to(JOURNALS[0]), fine))
    assert env.service.stats.releases == 1


async def test_bad_messages_and_mappings_are_refused_before_appending(env: Env) -> None:
    publisher = Publisher(env.service)
    with pytest.raises(InvalidMessageError, match="set_uuid"):
        await publisher.publish_committed(to(JOURNALS[0]), {"not": "a message"})
    with pytest.raises(InvalidMessageError, match="new_acknowledgement"):
        await publisher.publish_uncommitted(to(JOURNALS[0]), object())
    unknown = Partition(JOURNALS[0], "application/unknown")
    with pytest.raises(UnknownContentTypeError):
        await publisher.publish_committed(lambda message: unknown, Event())
    assert env.service.stats.batches == 0 and env.service.stats.releases == 0


async def test_uuids_stay_exact_across_the_publishers_cached_clock_bits(env: Env) -> None:
    # The publisher rebuilds a UUID's upper clock bits only when they change (every 2**36
    # clock values); start just below such a boundary, and the ticks cross it.
    start = (Clock.from_unix(1_700_000_000).value | 0xF_FFFF_FFFF) - 2 * TICK
    publisher = Publisher(env.service, Clock(start))
    events = [Event(n=n) for n in range(5)]
    for event in events:
        await publisher.publish_committed(to(JOURNALS[0]), event)
    await env.service.flush()
    expected = [
        build_uuid(publisher.producer_id, start + (1 + n) * TICK, Flag.OUTSIDE_TXN)
        for n in range(5)
    ]
    assert [event.get_uuid() for event in events] == expected
    assert [e.uuid for e in env.envelopes(JOURNALS[0])] == expected


async def test_a_publisher_fills_the_next_batch_while_the_last_one_is_appended(env: Env) -> None:
    # What acknowledged publishing rests on (bench_messages' "publish, acknowledged"): a
    # publisher that never awaits its batches still lets the journal's worker seal and send the
    # open batch, once every `writer_yield_bytes`, and goes on filling the next batch while that
    # one is appended; the batch commits meanwhile. Lost, encoding and appending would take
    # turns: a publish awaiting its batch's commit, or a writer that never yields (the batch
    # would grow until the buffers are full, and only then be sent).
    yield_bytes = 4096
    service = AppendService(
        env.service.client,
        writer_yield_bytes=yield_bytes,
        memory_bytes_max=256 << 10,  # Bounds the loop below, were the first batch never sent.
        spill_bytes_max=0,
    )
    framing = JSONFraming()
    async with service:
        publisher = Publisher(service)
        batches = []  # Each batch the messages joined, once, in order.
        frames: list[int] = []  # Each message's frame length.
        while not batches or not batches[0].done():
            event = Event(key="k" * 100, n=len(frames))
            joined = await publisher.publish_committed(to(JOURNALS[0]), event)
            frames.append(len(framing.marshal(event)))  # Its UUID as appended.
            if not batches or joined is not batches[-1]:
                batches.append(joined)
        # The first batch took the messages released before the publisher's first yield (the
        # first to reach yield_bytes), and was then sealed and sent; the rest went on into
        # later batches until it committed.
        released = list(itertools.accumulate(frames))
        reached = [n + 1 for n, total in enumerate(released) if total >= yield_bytes]
        assert reached, f"the first batch committed after {len(frames)} messages, before a yield"
        before_yield = reached[0]
        assert len(frames) > before_yield and len(batches) >= 2
        first = await batches[0]
        assert first.commit.end - first.commit.begin == released[before_yield - 1]
        await service.flush()
        ends = [(await batch).commit for batch in batches]
    # One batch after the other, contiguous, every message once and in order.
    assert all(a.end == b.begin for a, b in itertools.pairwise(ends))
    assert [e.message.n for e in env.envelopes(JOURNALS[0])] == list(range(len(frames)))
    assert service.stats.committed == len(batches) and service.stats.failed == 0
