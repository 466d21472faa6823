"""Durable spools in a cluster (issue #12): separate `gazette serve` processes on a real etcd,
each on its own data directory, a journal of replication 2 whose open fragment is persisted
only by rolls (flush interval of an hour).

1. A replica is killed (-9) while appends run; the journal goes on without it (its lease
   expires and another broker takes its place); it restarts on its data directory, and the
   journal is then moved back onto it (the broker that took its place exits). Its recovered
   spool is stale: the journal went on past it. It must not win a synchronisation nor be
   persisted: every acknowledged append reads back at the offsets it was given, once.
2. Then the whole route is killed (-9) at once, with acknowledged content in spools only, and
   both brokers restart on their data directories: the content reads back, appends continue
   at the end, and the fragment files in the store agree wherever they overlap and hold the
   journal exactly.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from e2e_workload import (
    Committed,
    Writers,
    check_records,
    fragment_files,
    journal_spec,
    record,
    requires_etcd,
    stored_prefix,
)
from google.protobuf.duration_pb2 import Duration

from broker.client.appender import append
from broker.client.retry_reader import RetryReader
from broker.fragment.spool_dir import journal_dir_name
from broker.protocol import protocol_pb2 as pb
from broker.testing.process_cluster import BrokerProcess, ProcessCluster

pytestmark = [pytest.mark.etcd, requires_etcd]

JOURNAL = "durable/spools"
LEASE_TTL_S = 3
THREE_BROKERS = [("zone-a", "broker-a1"), ("zone-a", "broker-a2"), ("zone-b", "broker-b1")]


@pytest.fixture
async def cluster() -> AsyncIterator[ProcessCluster]:
    async with ProcessCluster(THREE_BROKERS, lease_ttl_s=LEASE_TTL_S) as c:
        yield c


def spec(store: str) -> pb.JournalSpec:
    out = journal_spec(JOURNAL, 2, store, codec=pb.NONE)
    out.fragment.flush_interval.CopyFrom(Duration(seconds=3600))
    return out


def members(cluster: ProcessCluster) -> list[BrokerProcess]:
    return [cluster.broker(m.suffix) for m in cluster.route(JOURNAL).members]


async def committed_append(cluster: ProcessCluster, data: bytes) -> Committed:
    """One append through any running broker, retried until the journal is served."""
    resp = await append(cluster.client(), pb.AppendRequest(journal=JOURNAL), data)
    return Committed(JOURNAL, resp.commit.begin, resp.commit.end, data)


async def read_through(cluster: ProcessCluster, end: int, timeout_s: float = 30.0) -> bytes:
    """The journal's content [0, end), waiting for it: a replica that set its recovered copy
    aside serves those offsets once its index lists the primary's upload of them."""
    reader = RetryReader(cluster.client(), pb.ReadRequest(journal=JOURNAL, offset=0, block=True))
    out = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            while len(out) < end:
                chunk = await reader.read_chunk()
                assert chunk.offset == len(out), f"read jumped to {chunk.offset}"
                out += chunk.content
    finally:
        await reader.close()
    return bytes(out)


async def test_restarted_brokers_recover_their_spools_without_writing_offsets_twice(
    cluster: ProcessCluster,
) -> None:
    await cluster.apply([spec(cluster.store_url)])
    await cluster.wait_until(cluster.journals_ready([JOURNAL], 2))
    primary = cluster.primary(JOURNAL)
    assert primary is not None
    victim = next(b for b in members(cluster) if b is not primary)
    spare = next(b for b in cluster.brokers if b not in members(cluster))

    # 1. The replica is killed mid-stream; the journal goes on without it.
    writers = Writers(cluster.client(primary), [JOURNAL], count=2, attempts_max=1)
    writers.start()
    await writers.wait_for(40)
    await cluster.kill(victim)
    await cluster.wait_until(cluster.journals_ready([JOURNAL], 2, exclude=[victim.suffix]))
    await writers.wait_for(len(writers.committed) + 40)
    await cluster.start_broker(victim)
    # The spare exits, handing the journal off: to the restarted victim, the only one left.
    code, _ = await cluster.terminate(spare)
    assert code == 0, spare.log_tail()
    await cluster.wait_until(cluster.journals_ready([JOURNAL], 2, exclude=[spare.suffix]))
    assert victim in members(cluster)
    await writers.wait_for(len(writers.committed) + 40)
    await writers.stop()
    committed = list(writers.committed)
    content = await read_through(cluster, max(c.end for c in committed))
    counts = check_records(JOURNAL, content, committed)
    assert all(n == 1 for n in counts.values())

    # 2. The whole route dies with content in its spools only, and restarts.
    committed.append(await committed_append(cluster, record(90, 1, JOURNAL)))
    route = members(cluster)
    await asyncio.gather(*(cluster.kill(b) for b in route))
    await asyncio.gather(*(cluster.start_broker(b) for b in route))
    await cluster.wait_until(cluster.journals_ready([JOURNAL], 2))
    after = await committed_append(cluster, record(90, 2, JOURNAL))
    assert after.begin == committed[-1].end  # At the old end: nothing lost, nothing reused.
    committed.append(after)
    content = await read_through(cluster, after.end)
    counts = check_records(JOURNAL, content, committed)
    assert all(n == 1 for n in counts.values())

    # Every broker exits, persisting its fragments: wherever they overlap they agree, and
    # together they hold the journal exactly.
    for b in cluster.running():
        code, _ = await cluster.terminate(b)
        assert code == 0, b.log_tail()
    files = fragment_files(cluster.fragments_dir, JOURNAL)
    assert stored_prefix(files) == content
    assert max(f.end for f in files) == len(content)


DAMAGED = "durable/damaged-primary"


async def test_a_primary_whose_open_fragment_was_damaged_does_not_make_its_replicas_drop_theirs(
    cluster: ProcessCluster,
) -> None:
    """Found by audit (2026-11-30): every broker of an R=3 route killed with an unpersisted
    completed fragment and an open one in its spool (the store refusing this journal's
    uploads); the one restarted first, the new primary, had its open fragment's content file
    truncated (set aside), and proposed an empty fragment at that fragment's begin. Its
    replicas disowned their healthy copies, and the journal was written again from there:
    the read returned the new bytes where acknowledged ones had been. Now their greater offset
    wins: every acknowledged byte reads back, and appends go on at the end."""
    spec = journal_spec(DAMAGED, 3, cluster.store_url, codec=pb.NONE)
    spec.fragment.length = 1024
    spec.fragment.flush_interval.CopyFrom(Duration(seconds=3600))
    await cluster.apply([spec])
    await cluster.wait_until(cluster.journals_ready([DAMAGED], 3))

    async def acked(data: bytes) -> Committed:
        resp = await append(cluster.client(), pb.AppendRequest(journal=DAMAGED), data)
        return Committed(DAMAGED, resp.commit.begin, resp.commit.end, data)

    committed = [await acked(b"A" * 300)]
    # The store refuses this journal's uploads (its directory is a file) and still lists.
    blocker = cluster.fragments_dir / DAMAGED
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_bytes(b"")
    for data in (b"a" * 300, b"b" * 300, b"c" * 300, b"B" * 100, b"C" * 100):
        committed.append(await acked(data))
    primary = cluster.primary(DAMAGED)
    assert primary is not None
    spools = {b.suffix: _spool_files(b, DAMAGED) for b in cluster.brokers}
    assert all(len(files) >= 2 for files in spools.values()), spools  # Completed and open.
    await asyncio.gather(*(cluster.kill(b) for b in cluster.brokers))
    open_fragment = max(_spool_files(primary, DAMAGED))
    open_fragment.write_bytes(b"")  # Its content is gone: set aside at recovery.
    for b in cluster.brokers:
        await cluster.wait_until(cluster.member_gone(b))
    await cluster.start_broker(primary)  # First: the journal's primary again.
    await cluster.wait_until(lambda: None if cluster.primary(DAMAGED) is primary else "waiting")
    await asyncio.gather(*(cluster.start_broker(b) for b in cluster.brokers if b is not primary))
    await cluster.wait_until(cluster.journals_ready([DAMAGED], 3))
    blocker.unlink()
    after = await acked(b"N" * 50)
    assert after.begin == committed[-1].end  # At the old end: no offset written twice.
    committed.append(after)
    reader = RetryReader(cluster.client(), pb.ReadRequest(journal=DAMAGED, offset=0, block=True))
    content = bytearray()
    try:
        async with asyncio.timeout(30):
            while len(content) < after.end:
                chunk = await reader.read_chunk()
                assert chunk.offset == len(content), f"read jumped to {chunk.offset}"
                content += chunk.content
    finally:
        await reader.close()
    for c in committed:
        assert content[c.begin : c.end] == c.data, (c.begin, c.end)


def _spool_files(b: BrokerProcess, journal: str) -> list[Path]:
    """The content files of `journal`'s spool in `b`'s data directory, by begin offset."""
    return sorted((b.data_dir / "spools" / journal_dir_name(journal)).glob("*.spool"))
