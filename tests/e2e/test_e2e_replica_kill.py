"""kill -9 of a replica in the middle of appends (issue #3, as separate processes on real etcd).

Every append either fails (a typed error, and its bytes are never torn) or succeeds, and every
success is durable on each surviving replica. Afterwards the replicas serve identical bytes,
and once the brokers exit, the fragment files they persisted (named by offsets and the SHA1 of
their uncompressed content) decompress to exactly those bytes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest
from e2e_workload import (
    FOUR_BROKERS,
    Committed,
    Writers,
    check_records,
    fragment_files,
    journal_spec,
    read_journal,
    record,
    requires_etcd,
    stored_prefix,
)

from broker.client.appender import Appender
from broker.client.route_cache import ChannelPool
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import GazetteError
from broker.testing.process_cluster import BrokerProcess, ProcessCluster

pytestmark = [pytest.mark.etcd, requires_etcd]

JOURNAL = "kill/replicated"
LEASE_TTL_S = 3


@pytest.fixture
async def cluster() -> AsyncIterator[ProcessCluster]:
    async with ProcessCluster(FOUR_BROKERS, lease_ttl_s=LEASE_TTL_S) as c:
        yield c


async def served_by(channels: ChannelPool, b: BrokerProcess, journal: str) -> bytes:
    """The journal's content as broker ``b``, a member of its route, serves it itself (its
    local fragments, and persisted ones through the store), from offset 0 to its write head."""
    out = bytearray()
    call = channels.stub(b.endpoint).Read(pb.ReadRequest(journal=journal, offset=0, block=False))
    async for resp in call:
        if resp.HasField("header"):
            assert resp.header.process_id == b.id  # Not proxied elsewhere.
        if resp.status == pb.OFFSET_NOT_YET_AVAILABLE:
            break
        assert resp.status == pb.OK, pb.Status.Name(resp.status)
        assert resp.offset == len(out), f"{b.suffix} jumped to {resp.offset}"
        out += resp.content
    return bytes(out)


async def test_replica_killed_mid_append(cluster: ProcessCluster) -> None:
    # Small GZIP fragments: the journal spans many fragment files.
    await cluster.apply([journal_spec(JOURNAL, 3, cluster.store_url, length=4 << 10)])
    await cluster.wait_until(cluster.journals_ready([JOURNAL], 3, zones_min=2))
    route = cluster.route(JOURNAL)
    primary = cluster.broker(route.members[route.primary].suffix)
    victim = cluster.broker(next(m.suffix for m in route.members if m.suffix != primary.suffix))
    survivors = [cluster.broker(m.suffix) for m in route.members if m.suffix != victim.suffix]
    client = cluster.client(primary)

    # One-attempt appenders: every outcome is visible, nothing is retried.
    writers = Writers(client, [JOURNAL], count=3, attempts_max=1)
    writers.start()
    await writers.wait_for(100)

    # An append caught mid-stream: content is on the replicas' spools, not yet committed.
    torn = record(90, 0, JOURNAL, padding=4000)
    mid = Appender(client, pb.AppendRequest(journal=JOURNAL), chunk_bytes_max=1024)
    await mid.write(torn[:2048])
    await cluster.kill(victim)
    outcome: Committed | BaseException
    try:
        await mid.write(torn[2048:])
        commit = await mid.commit()
        outcome = Committed(JOURNAL, commit.begin, commit.end, torn)
    except (GazetteError, grpc.aio.AioRpcError) as err:
        outcome = err  # A typed failure.

    # The route regains three replicas once the victim's lease expires; appends succeed again.
    await cluster.wait_until(
        cluster.journals_ready([JOURNAL], 3, zones_min=2, exclude=[victim.suffix])
    )
    await writers.wait_for(len(writers.committed) + 100)
    await writers.stop()
    assert writers.failed or isinstance(outcome, BaseException)  # The kill was noticed.
    for _, _, error in writers.failed:
        assert isinstance(error, GazetteError | grpc.aio.AioRpcError), repr(error)

    committed = list(writers.committed)
    if isinstance(outcome, Committed):
        committed.append(outcome)
    content = await read_journal(client, JOURNAL)
    counts = check_records(JOURNAL, content, committed)
    # A failed append is all there or not at all (never torn, never twice): it may have been
    # committed by the replicas that acknowledged it before the client saw the failure.
    assert all(n == 1 for n in counts.values())
    assert counts[torn] <= 1

    # Identical on every replica: the two that survived the kill (holding every success, all
    # committed while they were replicas) and the one that replaced the victim.
    now = cluster.route(JOURNAL)
    channels = ChannelPool()
    try:
        for b in {*survivors, *(cluster.broker(m.suffix) for m in now.members)}:
            # A replica that joined later serves older content from the store once its index
            # lists the primary's upload: poll for it (a listing has no event to wait on).
            served = b""
            try:
                async with asyncio.timeout(30):
                    while (served := await served_by(channels, b, JOURNAL)) != content:
                        assert content.startswith(served) or served.startswith(content), b.suffix
                        await asyncio.sleep(0.2)
            except TimeoutError:
                raise AssertionError(
                    f"{b.suffix} serves {len(served)} of {len(content)} bytes"
                ) from None
    finally:
        await channels.close()

    # Every broker exits (none can take the journal, so none waits), persisting its fragments.
    for b in cluster.running():
        code, _ = await cluster.terminate(b)
        assert code == 0, b.log_tail()
    files = fragment_files(cluster.fragments_dir, JOURNAL)
    assert len(files) > 1
    assert stored_prefix(files) == content
    assert max(f.end for f in files) == len(content)
