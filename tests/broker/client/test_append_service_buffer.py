"""Append buffers: memory, then spill files, then backpressure. The buffer alone (its
accounting, rollback and read-back), and the AppendService spilling to disk and waiting for
room against a real in-process broker."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.client.append_buffer import AppendBuffer, AppendBufferError, BufferBudget
from broker.client.append_service import AppendService
from broker.client.route_cache import JournalClient
from tests.broker.broker_testkit import (
    Cluster,
    local_content,
    one_broker_with,
    wait_until,
)

J = "test/spilled"


def read_back(buffer: AppendBuffer, chunk_bytes_max: int = 1 << 20) -> bytes:
    return b"".join(bytes(chunk) for chunk in buffer.chunks(chunk_bytes_max))


def test_writes_stay_in_memory_within_the_budget(tmp_path: Path) -> None:
    budget = BufferBudget(memory_bytes_max=10, spill_bytes_max=100, spill_dir=tmp_path)
    buffer = budget.new_buffer()
    buffer.write(b"0123")
    buffer.write(memoryview(b"4567"))
    assert (buffer.size, buffer.spilled) == (8, False)
    assert (budget.memory_bytes, budget.spill_bytes) == (8, 0)
    assert read_back(buffer, 3) == b"01234567"
    assert [bytes(c) for c in buffer.chunks(3)] == [b"012", b"345", b"67"]
    buffer.close()
    assert (budget.memory_bytes, budget.spill_bytes, buffer.size) == (0, 0, 0)
    buffer.close()  # Idempotent: refunds once.
    assert budget.memory_bytes == 0
    with pytest.raises(AppendBufferError):
        buffer.write(b"x")


def test_writes_beyond_memory_spill_to_a_file_and_stay_in_order(tmp_path: Path) -> None:
    budget = BufferBudget(memory_bytes_max=10, spill_bytes_max=100, spill_dir=tmp_path)
    other = budget.new_buffer()
    other.write(b"abcdef")  # Another batch uses most of the memory.
    buffer = budget.new_buffer()
    buffer.write(b"0123")
    buffer.write(b"456789")  # Does not fit: spills.
    assert buffer.spilled and budget.memory_bytes == 10 and budget.spill_bytes == 6
    other.close()
    buffer.write(b"AB")  # Memory has room again, but a spilled buffer keeps its order.
    assert budget.spill_bytes == 8 and budget.memory_bytes == 4
    assert read_back(buffer, 4) == b"0123456789AB"
    assert read_back(buffer) == b"0123456789AB"  # Read again for a retry: the same bytes.
    assert not list(tmp_path.iterdir())  # Spill files are anonymous.
    buffer.close()
    assert (budget.memory_bytes, budget.spill_bytes) == (0, 0)


def test_rollback_drops_what_was_written_since_the_checkpoint(tmp_path: Path) -> None:
    budget = BufferBudget(memory_bytes_max=6, spill_bytes_max=100, spill_dir=tmp_path)
    buffer = budget.new_buffer()
    buffer.write(b"keep")
    assert buffer.checkpoint() == 4
    buffer.write(b"drop-this")  # Spills.
    buffer.rollback()
    assert read_back(buffer) == b"keep" and (budget.memory_bytes, budget.spill_bytes) == (4, 0)
    buffer.write(b"more")  # Goes to the (now empty) spill file, after the memory bytes.
    assert buffer.checkpoint() == 4
    buffer.write(b"gone")
    buffer.rollback()
    assert read_back(buffer) == b"keepmore" and buffer.size == 8
    assert (budget.memory_bytes, budget.spill_bytes) == (4, 4)
    # Rolling back into the memory part drops the file's content too.
    buffer2 = budget.new_buffer()
    buffer2.write(b"xy")
    buffer2.rollback()
    assert buffer2.size == 0 and budget.memory_bytes == 4
    buffer.close()
    buffer2.close()
    assert (budget.memory_bytes, budget.spill_bytes) == (0, 0)


def test_the_budget_is_full_at_memory_plus_spill() -> None:
    budget = BufferBudget(memory_bytes_max=4, spill_bytes_max=4)
    buffer = budget.new_buffer()
    buffer.write(b"1234")
    assert not budget.full and not budget.spill_full
    buffer.write(b"5678")
    assert budget.full and budget.spill_full
    buffer.close()
    assert not budget.full
    for bad in ({"memory_bytes_max": -1}, {"spill_bytes_max": -1}):
        with pytest.raises(ValueError):
            BufferBudget(**bad)
    with pytest.raises(ValueError):
        BufferBudget(memory_bytes_max=0, spill_bytes_max=0)
    with pytest.raises(ValueError):
        next(budget.new_buffer().chunks(0))


@pytest.fixture
async def env() -> AsyncIterator[tuple[Cluster, JournalClient]]:
    async with one_broker_with((J,)) as pair:
        yield pair


async def test_service_spills_beyond_its_memory_bound_with_content_intact(
    env: tuple[Cluster, JournalClient], tmp_path: Path
) -> None:
    cluster, client = env
    lines = [f"{i:04d} {'x' * 90}\n".encode() for i in range(200)]  # 20 KB in all.
    async with AppendService(
        client,
        memory_bytes_max=2048,
        spill_bytes_max=1 << 20,
        spill_dir=tmp_path,
        batch_bytes_max=8192,
        writer_yield_bytes=1 << 30,  # Never yield: everything is buffered before sending.
    ) as service:
        handles = []
        for line in lines:
            aa = await service.start_append(J)
            aa.write(line)
            aa.release()
            handles.append(aa)
        assert service.budget.memory_bytes <= 2048
        assert service.budget.spill_bytes == sum(map(len, lines)) - service.budget.memory_bytes
        await asyncio.gather(*handles)
        assert (service.budget.memory_bytes, service.budget.spill_bytes) == (0, 0)
    assert local_content(cluster.brokers[0], J) == (0, b"".join(lines))
    assert 3 <= service.stats.batches <= 4  # 20 KB in batches of 8 KB.


async def test_writers_wait_while_the_buffers_are_full(
    env: tuple[Cluster, JournalClient], tmp_path: Path
) -> None:
    cluster, client = env
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    async with AppendService(
        client, memory_bytes_max=100, spill_bytes_max=100, spill_dir=tmp_path
    ) as service:
        # A batch that cannot be sent before the gate opens fills the buffers.
        blocked = await service.start_append(J, [gate])
        blocked.write(b"a" * 99 + b"\n")
        blocked.write(b"b" * 99 + b"\n")
        blocked.release()
        assert service.budget.full

        async def late_writer() -> None:
            aa = await service.start_append(J)
            aa.write(b"late\n")
            aa.release()

        late = asyncio.create_task(late_writer())
        await wait_until(lambda: service.waiting_writers == 1)
        assert not late.done() and service.stats.releases == 1
        gate.set_result(None)  # The batch commits; its buffer is freed; the writer goes on.
        await asyncio.wait_for(late, 10)
    assert local_content(cluster.brokers[0], J)[1] == b"a" * 99 + b"\n" + b"b" * 99 + b"\nlate\n"
    assert service.waiting_writers == 0
