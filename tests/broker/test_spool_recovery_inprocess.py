"""Durable spools across replica lifetimes within one broker process (in-process brokers on an
embedded keyspace, real files, a file:// store): a journal unassigned and assigned again
resumes its spool where the last replica left it; a recovered spool whose replica stops before
settling it waits, untouched, for the next one."""

from __future__ import annotations

from pathlib import Path

from broker.client import JournalClient, RetryReader
from broker.fragment.spool_dir import SpoolDir, journal_dir_name
from broker.fragment.stores.registry import new_registry
from broker.protocol import protocol_pb2 as pb
from tests.broker.broker_testkit import Cluster, journal_spec, replica_of
from tests.broker.fragment.test_spool_dir import append as spool_append
from tests.broker.fragment.test_spool_dir import durable_spool

JOURNAL = "a/journal"
STORE = "file:///fragments/"


def new_cluster(tmp_path: Path) -> Cluster:
    (tmp_path / "fragments").mkdir()
    return Cluster(stores=new_registry(file_root=str(tmp_path)))


async def commit(cluster: Cluster, broker: object, data: bytes) -> tuple[int, int]:
    resp = await cluster.append(broker, JOURNAL, [data])  # type: ignore[arg-type]
    assert resp.status == pb.OK, pb.Status.Name(resp.status)
    return resp.commit.begin, resp.commit.end


async def read_through(endpoint: str, begin: int, end: int) -> bytes:
    client = JournalClient(endpoint)
    try:
        request = pb.ReadRequest(journal=JOURNAL, offset=begin, end_offset=end, block=True)
        out = bytearray()
        async for chunk in RetryReader(client, request):
            out += chunk.content
        return bytes(out)
    finally:
        await client.close()


async def test_a_journal_assigned_again_continues_at_its_offset(tmp_path: Path) -> None:
    cluster = new_cluster(tmp_path)
    try:
        broker = await cluster.start_broker(
            "zone-a", "broker-a", memory_spools=False, data_dir=str(tmp_path / "data")
        )
        await cluster.create(journal_spec(JOURNAL, stores=[STORE]), [broker])
        assert await commit(cluster, broker, b"abc") == (0, 3)
        await cluster.assign(JOURNAL, [])  # Its replica stops: rolls, persists, keeps 3.
        await cluster.assign(JOURNAL, [broker])
        # Not INDEX_HAS_GREATER_OFFSET: the new replica's spool resumes at 3.
        assert await commit(cluster, broker, b"de") == (3, 5)
    finally:
        await cluster.close()


async def test_a_replica_stopped_before_settling_gives_its_recovered_spool_back(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    # What a killed broker left: [0, 11) committed, never persisted.
    writer, _ = durable_spool(SpoolDir(data, fsync=False))
    spool_append(writer, b"hello ")
    spool_append(writer, b"world")
    del writer
    assert (data / "spools" / journal_dir_name(JOURNAL) / "0000000000000000.spool").exists()

    cluster = new_cluster(tmp_path)
    try:
        # No pulse: nothing takes the spool to synchronise until an append does.
        broker = await cluster.start_broker(
            "zone-a", "broker-a", memory_spools=False, data_dir=str(data), pulse_enabled=False
        )
        await cluster.create(journal_spec(JOURNAL, stores=[STORE]), [broker])
        replica = replica_of(broker, JOURNAL)
        await cluster.assign(JOURNAL, [])  # Stopped before anyone settled it.
        await replica.wait_stopped()
        assert replica.recovery is not None and replica.recovery.verdict is None
        assert broker.spool_dir is not None and broker.spool_dir.pending() == [JOURNAL]
        await cluster.assign(JOURNAL, [broker])
        assert await commit(cluster, broker, b"!") == (11, 12)
        # Read through the broker, not from its local spools: the persister may have uploaded
        # the recovered [0, 11) and released its local copy by now (the test failed 1 in 5).
        assert await read_through(broker.endpoint, 0, 12) == b"hello world!"
    finally:
        await cluster.close()
