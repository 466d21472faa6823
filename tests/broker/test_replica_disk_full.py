"""A replicated journal (all-replicas mode, Gazette's) whose follower's disk fills up: three
in-process brokers, each data directory (its spools) on a real tmpfs of its own, the
follower's filled to the last byte by another file. Every replica must take an append before
it is acknowledged, so the append that does not fit on the follower fails with a typed,
retryable error naming the follower. If the primary has seen the follower fail by the time
the append ends, it proposes the rollback: nothing is committed, and the error says only why.
Otherwise (as in Gazette, which reads peers' answers only after proposing the commit) the
primary took the commit: the error says that the outcome is unknown (the content may be read;
a retry may append it twice), never that nothing was appended. Which of the two happens
depends on when the follower's failure reaches the primary: the test checks that what each
error said is what the journal holds, and that the primary's check makes most outcomes certain. Nothing acknowledged is lost, and once space returns appends continue at the
journal's end without a restart, every byte exactly once. (Quorum mode commits at the
majority instead: tests/broker/quorum/test_quorum_disk_full.py.)"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from broker.client.route_cache import JournalClient
from broker.protocol import protocol_pb2 as pb
from tests.broker.broker_testkit import Cluster, journal_spec
from tests.broker.test_spool_recovery_serve import read_exactly
from tests.small_disk import fill, small_disks

JOURNALS = [f"replicated/full-{i}" for i in range(6)]
DISK_BYTES = 8 << 20
# Larger than a page: a spool's last page may have room for a small append on a full disk.
APPEND_BYTES = 64 << 10


async def test_a_full_follower_fails_appends_typed_and_loses_nothing(
    cluster: Cluster, tmp_path: Path
) -> None:
    with small_disks([tmp_path / f"b{i}" for i in range(3)], DISK_BYTES):
        brokers = [
            await cluster.start_broker(
                f"zone-{i}", f"broker-{i}", data_dir=str(tmp_path / f"b{i}"), memory_spools=False
            )
            for i in range(3)
        ]
        primary = brokers[0]  # create() assigns the first as primary
        acked: dict[str, bytes] = {}
        for journal in JOURNALS:
            await cluster.create(journal_spec(journal, replication=3), brokers)
            acked[journal] = b""
            # Past the journal's first append (a fragment of its own): the next ones extend
            # the follower's open fragment, as the one that meets the full disk will.
            for _ in range(2):
                resp = await cluster.append(primary, journal, [b"A" * APPEND_BYTES])
                assert resp.status == pb.OK
                acked[journal] += b"A" * APPEND_BYTES
                assert resp.commit.end == len(acked[journal])

        filler = fill(tmp_path / "b1")
        # Each journal's next append fails on the follower's full disk, naming the follower.
        certain = 0
        for journal in JOURNALS:
            data = b"Z" * APPEND_BYTES
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await cluster.append(primary, journal, [data])
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            details = refused.value.details() or ""
            # Its reason ("replicate: spool: [Errno 28] No space left on device") mostly
            # too, but gRPC sometimes replaces a status aborted mid-stream with INTERNAL.
            assert "recv from zone-1#broker-1" in details, details
            if "outcome unknown" in details:
                acked[journal] += data  # The primary took the commit: it is in the journal.
            else:
                certain += 1
        # Without the primary's check, every one was unknown (all certain with it, here).
        assert certain > 0

        filler.unlink()
        client = JournalClient(primary.endpoint)
        try:
            for journal in JOURNALS:
                resp = await cluster.append(primary, journal, [b"Y" * APPEND_BYTES])
                assert resp.status == pb.OK
                assert resp.commit.begin == len(acked[journal])
                content = await read_exactly(client, resp.commit.end, journal=journal)
                assert content == acked[journal] + b"Y" * APPEND_BYTES
        finally:
            await client.close()
