"""AppendService.append_nowait, the publisher's one-call path: it joins the journal's open batch
exactly as start_append_nowait + write + release would, and declines (writing nothing) wherever
those would have to wait."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.client.append_buffer import BufferBudget
from broker.client.append_service import AppendService
from broker.client.route_cache import JournalClient
from tests.broker.broker_testkit import (
    Cluster,
    content_from_start,
    one_broker_with,
)

J = "test/nowait-a"
K = "test/nowait-b"


@pytest.fixture
async def env() -> AsyncIterator[tuple[Cluster, JournalClient]]:
    async with one_broker_with((J, K)) as pair:
        yield pair


async def test_append_nowait_joins_the_open_batch_in_order_with_other_writers(
    env: tuple[Cluster, JournalClient],
) -> None:
    cluster, client = env
    async with AppendService(client) as service:
        # No queue for the journal yet: the first append must go through start_append.
        assert service.append_nowait(J, b"never\n") is None
        first = await service.start_append(J)
        first.write(b"one\n")
        first.release()
        second = service.append_nowait(J, b"two\n")
        third = service.append_nowait(J, b"three\n")
        assert second is first and third is first  # One batch: one RPC.
        held = await service.start_append(J)
        held.write(b"four\n")
        assert service.append_nowait(J, b"not while held\n") is None
        assert service.append_nowait(K, b"other journals go on\n") is None  # No queue yet.
        held.abort()  # Drops only the holder's bytes.
        assert service.append_nowait(J, b"five\n") is held
        response = await held
        assert (response.commit.begin, response.commit.end) == (0, 19)
        assert service.stats.releases == 4 and service.stats.aborts == 1
        assert service.stats.batches == 1 and service.stats.rpcs == 1
    assert content_from_start(cluster, J) == b"one\ntwo\nthree\nfive\n"


async def test_append_nowait_starts_a_new_batch_once_one_is_being_sent(
    env: tuple[Cluster, JournalClient],
) -> None:
    cluster, client = env
    async with AppendService(client, batch_bytes_max=8) as service:
        first = await service.start_append(J)
        first.write(b"0123456789\n")  # Past batch_bytes_max: the next append chains a batch.
        first.release()
        second = service.append_nowait(J, b"next\n")
        assert second is not None and second is not first
        await service.flush()
        assert first.done() and second.done()
        assert (await first).commit.end == (await second).commit.begin
    assert content_from_start(cluster, J) == b"0123456789\nnext\n"


async def test_append_nowait_declines_when_full_or_closed(
    env: tuple[Cluster, JournalClient], tmp_path: Path
) -> None:
    _, client = env
    service = AppendService(client, memory_bytes_max=4, spill_bytes_max=4, spill_dir=tmp_path)
    async with service:
        aa = await service.start_append(J)
        aa.write(b"12345678")  # Fills memory and spill files: the budget is full.
        aa.release()
        assert service.budget.full
        assert service.append_nowait(J, b"x\n") is None
        await service.flush()
        assert not service.budget.full
        assert service.append_nowait(J, b"x\n") is None  # The drained queue was dropped.
    assert service.append_nowait(J, b"x\n") is None  # Closed.


async def test_append_nowait_spills_within_the_open_batch_once_memory_is_short(
    env: tuple[Cluster, JournalClient], tmp_path: Path
) -> None:
    # The in-memory write is append_nowait's own; a write memory cannot take goes to the
    # batch's spill file, in order after what is in memory, and the batch stays one RPC.
    cluster, client = env
    service = AppendService(client, memory_bytes_max=10, spill_bytes_max=100, spill_dir=tmp_path)
    async with service:
        first = await service.start_append(J)
        first.write(b"one\n")
        first.release()
        assert service.append_nowait(J, b"two\n") is first  # 8 bytes: still in memory.
        assert not first._buffer.spilled and service.budget.memory_bytes == 8
        assert service.append_nowait(J, b"three\n") is first  # 14 > 10: spilled.
        assert first._buffer.spilled and service.budget.spill_bytes == 6
        assert service.append_nowait(J, b"four\n") is first  # Spilled stays spilled.
        assert (service.budget.memory_bytes, service.budget.spill_bytes) == (8, 11)
        response = await first
        assert (response.commit.begin, response.commit.end) == (0, 19)
        assert service.stats.batches == 1 and service.stats.releases == 4
    assert content_from_start(cluster, J) == b"one\ntwo\nthree\nfour\n"


def test_write_released_marks_the_bytes_released_in_memory_and_spilled(tmp_path: Path) -> None:
    budget = BufferBudget(memory_bytes_max=6, spill_bytes_max=100, spill_dir=tmp_path)
    buffer = budget.new_buffer()
    buffer.write_released(b"abcd")
    buffer.write_released(b"efgh")  # Past memory: spills.
    assert buffer.spilled and (budget.memory_bytes, budget.spill_bytes) == (4, 4)
    buffer.write(b"unreleased")
    buffer.rollback()  # An aborting writer drops only its own bytes.
    assert b"".join(bytes(c) for c in buffer.chunks(3)) == b"abcdefgh"
    assert buffer.checkpoint() == 0  # Nothing new since the last release.
    buffer.close()
    assert (budget.memory_bytes, budget.spill_bytes) == (0, 0)
