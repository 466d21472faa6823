"""A broker killed (kill -9) and restarted while its data directory's disk is still full (a
real tmpfs, filled to the last byte by another file; etcd and the fragment store elsewhere, as
in a deployment): it starts, recovers its spool and serves every acknowledged byte; an append
that does not fit is refused with a typed, retryable error naming the cause, and one that fits
lands at the acknowledged end; once there is room, appends go on at the acknowledged end
without another restart, and nothing refused was committed."""

from __future__ import annotations

import grpc
import pytest
from e2e_workload import journal_spec, requires_etcd

from broker.client.appender import append, attempts_max_default
from broker.protocol import protocol_pb2 as pb
from broker.testing.process_cluster import ProcessCluster
from tests.broker.test_spool_recovery_serve import read_exactly
from tests.small_disk import fill, resize, small_disk

pytestmark = [pytest.mark.etcd, requires_etcd]

JOURNAL = "full/restarted"
DISK_BYTES = 8 << 20
DISK_BYTES_AFTER = 32 << 20
APPEND_BYTES = 256 << 10
# More appends than the disk takes: each loop ends at the first refused one.
APPENDS_MAX = 2 * DISK_BYTES // APPEND_BYTES


async def append_until_refused(
    client: object, acked: bytearray, first_attempts: int = 1
) -> grpc.aio.AioRpcError:
    """Appends of APPEND_BYTES, each landing exactly at the acknowledged end, until one is
    refused (not retried: seen as it is); returns that refusal."""
    for i in range(APPENDS_MAX):
        data = bytes([65 + (len(acked) // APPEND_BYTES) % 26]) * APPEND_BYTES
        attempts = first_attempts if i == 0 else 1
        try:
            resp = await append(
                client,  # type: ignore[arg-type]
                pb.AppendRequest(journal=JOURNAL),
                data,
                attempts_max=attempts,
            )
        except grpc.aio.AioRpcError as err:
            return err
        assert (resp.commit.begin, resp.commit.end) == (len(acked), len(acked) + len(data))
        acked += data
    raise AssertionError(f"{APPENDS_MAX} appends of {APPEND_BYTES} bytes all fit")


def assert_disk_full(refused: grpc.aio.AioRpcError) -> None:
    assert refused.code() == grpc.StatusCode.UNAVAILABLE, refused
    assert "No space left on device" in (refused.details() or ""), refused


async def test_a_broker_restarted_on_a_full_disk_serves_what_it_acknowledged() -> None:
    cluster = ProcessCluster([("zone-a", "broker-a")], lease_ttl_s=3)
    broker = cluster.brokers[0]
    acked = bytearray()
    with small_disk(broker.data_dir, DISK_BYTES) as disk:
        async with cluster:
            # Fragments roll only as its first append does: the spool on the small disk
            # holds the rest.
            spec = journal_spec(JOURNAL, 1, cluster.store_url, length=1 << 30, codec=pb.NONE)
            await cluster.apply([spec])
            await cluster.wait_until(cluster.journals_ready([JOURNAL], 1))
            refused = await append_until_refused(
                cluster.client(broker), acked, attempts_max_default
            )
            assert_disk_full(refused)
            assert len(acked) >= DISK_BYTES // 2, f"refused after only {len(acked)} bytes"
            filler = fill(disk)

            await cluster.restart(broker)  # kill -9, then start on the still-full disk
            client = cluster.client(broker)
            assert await read_exactly(client, len(acked), JOURNAL) == bytes(acked)
            # Serving it (the read above), the broker refuses what does not fit for want of
            # room (an append may fit in what the restart freed: it lands at the
            # acknowledged end).
            assert_disk_full(await append_until_refused(client, acked))

            filler.unlink()
            resize(disk, DISK_BYTES_AFTER)
            resp = await append(client, pb.AppendRequest(journal=JOURNAL), b"after\n")
            assert resp.commit.begin == len(acked)  # nothing refused was committed
            acked += b"after\n"
            assert await read_exactly(client, len(acked), JOURNAL) == bytes(acked)
