"""A `gazette-consumer serve` process (embedded broker and keyspace) whose data directory is
on a disk that fills up (a real tmpfs, filled to the last byte by another file): a keyspace
change it cannot log is refused UNAVAILABLE naming the cause, and the process stops (fail-stop,
as `gazette serve` does: memory may hold a change the disk does not) with exit code 1 and one
line saying why and what to do, not a traceback. A data directory full from the start is
refused at once, saying so."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from broker.client.list_apply import apply_journals, upsert
from broker.client.route_cache import JournalClient
from broker.protocol import protocol_pb2 as pb
from tests.gazette_consumer.consumer_testkit import ConsumerProcess
from tests.small_disk import fill, small_disk

DISK_BYTES = 16 << 20
CHANGES_MAX = 256  # Keyspace changes tried once the disk is full: one is refused long before.
exit_wait_s = 30.0


def spec(name: str) -> pb.JournalSpec:
    return pb.JournalSpec(
        name=name,
        replication=1,
        fragment=pb.JournalSpec.Fragment(
            length=1 << 20, compression_codec=pb.NONE, refresh_interval=Duration(seconds=30)
        ),
    )


def consumer(disk: Path, log: Path) -> ConsumerProcess:
    return ConsumerProcess(
        [
            *("--app", "examples.counter:Counter", "--port", "0", "--broker-port", "0"),
            *("--data-dir", str(disk / "data"), "--drain-timeout", "1"),
        ],
        log,
        env={"COUNTER_DATA_DIR": str(log.parent / "db")},
    )


async def test_a_consumer_whose_keyspace_disk_fills_stops_saying_why(tmp_path: Path) -> None:
    log = tmp_path / "consumer.log"
    with small_disk(tmp_path / "disk", DISK_BYTES) as disk:
        process = consumer(disk, log)
        await process.start()
        client = JournalClient(process.printed["embedded broker"])
        try:
            await apply_journals(client, [upsert(spec("full/first"))])
            fill(disk)
            refused: grpc.aio.AioRpcError | None = None
            for i in range(CHANGES_MAX):
                try:
                    await apply_journals(client, [upsert(spec(f"full/j{i}"))])
                except grpc.aio.AioRpcError as err:
                    refused = err
                    break
            assert refused is not None, f"{CHANGES_MAX} keyspace changes fit on a full disk"
            assert refused.code() == grpc.StatusCode.UNAVAILABLE, refused
            async with asyncio.timeout(exit_wait_s):
                assert process.process is not None
                assert await process.process.wait() == 1
        finally:
            await client.close()
            await process.kill()
    last = log.read_text().strip().splitlines()[-1]
    assert last.startswith("gazette-consumer: embedded keyspace"), process.log_tail()
    assert "No space left on device" in last and "restart the process" in last, last
    assert "Traceback" not in log.read_text()


async def test_a_consumer_on_a_full_data_directory_is_refused_at_start(tmp_path: Path) -> None:
    log = tmp_path / "consumer.log"
    with small_disk(tmp_path / "disk", DISK_BYTES) as disk:
        fill(disk)
        with pytest.raises(Exception, match="exited with status 1"):
            await consumer(disk, log).start()
    last = log.read_text().strip().splitlines()[-1]
    assert last.startswith("gazette-consumer: --data-dir: embedded keyspace directory"), last
    assert "No space left on device" in last
