"""Append buffers whose spill files are on a full disk: a write that fails changes nothing,
and dropping or closing content never fails, so the cleanup of a failing writer (an aborted
publish, a service leaving on its user's error) never replaces that writer's own error, and
never leaves a journal's batch held. Real tmpfs file systems filled to the last byte (root
only: skipped elsewhere, saying why); a real in-process broker behind the services."""

from __future__ import annotations

import asyncio
import errno
import itertools
from pathlib import Path

import pytest

from broker.client.append_buffer import AppendBuffer, BufferBudget, spill_write_bytes
from broker.client.append_service import AppendService
from gazette_consumer.message import CONTENT_TYPE_JSON_LINES, JSONMessage, MessageEncodeError
from gazette_consumer.message.mapping import Partition
from gazette_consumer.message.publisher import Publisher
from tests.broker.broker_testkit import content_from_start, one_broker_with
from tests.small_disk import fill, small_disk

J = "test/spilled-full"
DISK_BYTES = 1 << 20
TO_J = Partition(J, CONTENT_TYPE_JSON_LINES)


class Note(JSONMessage):
    text: str = ""
    anything: object = None


def read_back(buffer: AppendBuffer) -> bytes:
    return b"".join(bytes(chunk) for chunk in buffer.chunks(4096))


def refused_for_space(call: object) -> None:
    with pytest.raises(OSError) as refused:
        call()  # type: ignore[operator]
    assert refused.value.errno == errno.ENOSPC


def test_only_writes_fail_on_a_full_disk_and_the_content_stays_exact(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", DISK_BYTES) as disk:
        budget = BufferBudget(memory_bytes_max=0, spill_bytes_max=1 << 30, spill_dir=disk)
        buffer = budget.new_buffer()
        expected = bytearray()
        refusals = 0
        # Small writes (gathered before they reach the file) and large ones (written at once)
        # until well past the disk's size: both kinds fail part-way once the disk is full.
        sizes = itertools.cycle([100, 70_000, 3_000, 200_000, 10, 40_000])
        for n in range(80):
            data = bytes([n % 251]) * next(sizes)
            try:
                buffer.write(data)
            except OSError as err:
                assert err.errno == errno.ENOSPC
                refusals += 1
            else:
                expected += data
            assert (buffer.size, budget.spill_bytes) == (len(expected), len(expected))
            if n == 5:
                assert buffer.checkpoint() == len(expected)
                released = bytes(expected)
        # What was accepted: the disk's bytes, and at most one gathering of small writes.
        assert refusals > 20 and len(expected) <= DISK_BYTES + spill_write_bytes
        assert read_back(buffer) == expected
        buffer.rollback()  # Drops what the file holds past the mark: no write, no error.
        assert read_back(buffer) == released and budget.spill_bytes == len(released)
        # The file's space past the mark is reused: a write there needs no new room.
        buffer.write(b"z" * 100_000)
        assert read_back(buffer) == released + b"z" * 100_000
        refused_for_space(lambda: buffer.write(b"y" * DISK_BYTES))  # Past the file: refused.
        buffer.close()
        assert (budget.memory_bytes, budget.spill_bytes, buffer.size) == (0, 0, 0)
        assert list(disk.iterdir()) == []  # Anonymous: gone once closed.


async def test_a_service_user_keeps_its_own_error_over_a_full_spill_disk(
    tmp_path: Path,
) -> None:
    with small_disk(tmp_path / "disk", DISK_BYTES) as disk:
        async with one_broker_with((J,)) as (_cluster, client):
            gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            service = AppendService(
                client, memory_bytes_max=0, spill_bytes_max=1 << 30, spill_dir=disk
            )
            with pytest.raises(RuntimeError, match="the application's own error"):
                async with service:
                    fill(disk)  # Another tenant of the disk takes its last byte.
                    held = await service.start_append(J, [gate])  # Not sent before the gate.
                    held.write(b"released, never sent\n")
                    held.release()
                    writer = await service.start_append(J)
                    writer.write(b"x" * 1000)  # Gathered in memory: no room needed yet.
                    refused_for_space(lambda: writer.write(b"y" * (1 << 17)))
                    writer.abort()  # Drops the gathered bytes: nothing to write, no error.
                    late = await service.start_append(J)  # Not held by the aborted writer.
                    late.write(b"late\n")
                    late.release()
                    raise RuntimeError("the application's own error")
            assert (service.budget.memory_bytes, service.budget.spill_bytes) == (0, 0)
            assert [p.name for p in disk.iterdir()] == ["filler"]


async def test_a_publish_refused_for_space_leaves_the_journal_writable(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", DISK_BYTES) as disk:
        async with one_broker_with((J,)) as (cluster, client):
            gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            async with AppendService(
                client, memory_bytes_max=0, spill_bytes_max=1 << 30, spill_dir=disk
            ) as service:
                publisher = Publisher(service)
                filler = fill(disk)
                held = await service.start_append(J, [gate])
                held.write(b"first\n")
                held.release()
                # A run of messages larger than what spill writes gather: written at once,
                # refused; nothing of it stays, and the batch is not left held.
                big = [Note(text="b" * 1000) for _ in range(100)]
                with pytest.raises(OSError) as refused:
                    await publisher.publish_committed_batch(lambda m: TO_J, big)
                assert refused.value.errno == errno.ENOSPC
                small = await asyncio.wait_for(
                    publisher.publish_committed(lambda m: TO_J, Note(text="small")), 10
                )
                # An application's bad message keeps its own error on the spilled batch.
                with pytest.raises(MessageEncodeError):
                    await publisher.publish_committed(lambda m: TO_J, Note(anything=object()))
                filler.unlink()
                gate.set_result(None)
                await asyncio.wait_for(asyncio.gather(held, small), 10)
            content = content_from_start(cluster, J)
    lines = content.splitlines()
    assert lines[0] == b"first" and len(lines) == 2
    assert b'"text":"small"' in lines[1] and b"bbbb" not in content
