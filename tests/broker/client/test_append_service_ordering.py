"""AppendService against real in-process brokers: per-journal release order, batching of many
small appends into few RPCs, and the responses that writers of one batch share."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import pytest

from broker.client.append_service import AppendService
from broker.client.async_append import AppendState, AsyncAppendStateError
from broker.client.route_cache import JournalClient
from broker.protocol import protocol_pb2 as pb
from tests.broker.broker_testkit import (
    Cluster,
    content_from_start,
    one_broker_with,
)

JOURNALS = ["test/ordered-a", "test/ordered-b", "test/ordered-c"]


@pytest.fixture
async def env() -> AsyncIterator[tuple[Cluster, JournalClient]]:
    async with one_broker_with(JOURNALS) as pair:
        yield pair


async def test_concurrent_writers_commit_in_release_order_per_journal(
    env: tuple[Cluster, JournalClient],
) -> None:
    cluster, client = env
    released: dict[str, list[bytes]] = {journal: [] for journal in JOURNALS}
    batches = []

    async def writer(w: int) -> None:
        for i in range(150):
            journal = JOURNALS[(w + i) % len(JOURNALS)]
            aa = await service.start_append(journal)
            line = f"writer {w} message {i}\n".encode()
            aa.write(line)
            aa.release()
            released[journal].append(line)
            batches.append(aa)
            if i % 7 == w % 7:
                # Let other writers and the senders run, so that writers interleave and
                # batches are sent while later ones fill.
                await asyncio.sleep(0)

    # Small batches, so that each journal goes through many of them.
    async with AppendService(client, batch_bytes_max=512) as service:
        await asyncio.gather(*(writer(w) for w in range(6)))
    # Leaving the block waited for every batch.
    assert all(aa.done() and aa.exception() is None for aa in batches)
    for journal in JOURNALS:
        assert content_from_start(cluster, journal) == b"".join(released[journal]), journal
    assert service.stats.releases == 6 * 150
    assert service.stats.failed == 0 and service.stats.retries == 0
    assert 3 * 2 <= service.stats.committed == service.stats.batches == service.stats.rpcs


async def test_many_small_appends_are_batched_into_few_rpcs(
    env: tuple[Cluster, JournalClient],
) -> None:
    cluster, client = env
    journal = JOURNALS[0]
    batch_bytes_max = 8 << 10
    lines = [f"message {i:05d}\n".encode() for i in range(3000)]
    async with AppendService(client, batch_bytes_max=batch_bytes_max) as service:
        handles = []
        for line in lines:  # No await but start_append's: the senders run only when it yields.
            aa = await service.start_append(journal)
            aa.write(line)
            aa.release()
            handles.append(aa)
        responses = [await aa for aa in handles]

    assert content_from_start(cluster, journal) == b"".join(lines)
    distinct = list(dict.fromkeys(handles))  # Batches, in order.
    assert len(distinct) == service.stats.batches == service.stats.rpcs
    assert service.stats.rpcs * 20 <= len(lines)  # Many releases per Append RPC.
    # Writers of one batch share its response: the span of the whole batch.
    spans = [(aa.result().commit.begin, aa.result().commit.end) for aa in distinct]
    assert spans[0][0] == 0 and spans[-1][1] == sum(map(len, lines))
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    assert all(end - begin <= batch_bytes_max + len(lines[0]) for begin, end in spans)
    for aa, response in zip(handles, responses, strict=True):
        assert response.commit == aa.result().commit and response.status == pb.OK
    assert all(aa.state is AppendState.DONE for aa in distinct)


async def test_abort_drops_only_the_aborting_writers_bytes(
    env: tuple[Cluster, JournalClient],
) -> None:
    cluster, client = env
    journal = JOURNALS[1]
    async with AppendService(client) as service:
        first = await service.start_append(journal)
        first.write(b"kept 1\n")
        first.release()
        second = await service.start_append(journal)
        assert second is first  # Joined the same batch (it was not sent yet).
        second.write(b"dropped ")
        second.write(b"entirely\n")
        second.abort()
        third = await service.start_append(journal)
        third.write(b"kept 2\n")
        third.release()
        with pytest.raises(AsyncAppendStateError):
            third.write(b"after release\n")
        with pytest.raises(AsyncAppendStateError):
            third.release()
        response = await third
    assert content_from_start(cluster, journal) == b"kept 1\nkept 2\n"
    assert (service.stats.releases, service.stats.aborts) == (2, 1)
    assert (response.commit.begin, response.commit.end) == (0, 14)


async def test_a_batch_nobody_wrote_to_is_not_sent(env: tuple[Cluster, JournalClient]) -> None:
    cluster, client = env
    async with AppendService(client) as service:
        aa = await service.start_append(JOURNALS[2])
        aa.write(b"never sent\n")
        aa.abort()
        response = await aa
    assert response.status == pb.OK and not response.HasField("commit")
    assert service.stats.rpcs == 0 and service.stats.batches == 1
    assert content_from_start(cluster, JOURNALS[2]) == b""


async def test_a_writer_holding_a_journal_makes_the_next_one_wait(
    env: tuple[Cluster, JournalClient],
) -> None:
    cluster, client = env
    journal = JOURNALS[0]
    async with AppendService(client) as service:
        held = await service.start_append(journal)
        held.write(b"first\n")
        other = asyncio.create_task(service.start_append(journal))
        await asyncio.sleep(0)  # Give the task a turn to reach the wait.
        assert not other.done()  # It waits for the holder, however long it takes.
        held.release()
        second = await asyncio.wait_for(other, 10)
        second.write(b"second\n")
        second.release()
        await service.flush()
        assert held.done() and second.done()
    assert content_from_start(cluster, journal) == b"first\nsecond\n"
