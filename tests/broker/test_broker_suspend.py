"""Journal suspension through real in-process brokers running the allocator, driven the way a Go
client drives it (AppendRequest.suspend): SUSPEND_IF_FLUSHED / SUSPEND_NOW suspend a journal
(PARTIAL: one replica left; FULL: none), SUSPEND_NO_RESUME and SUSPEND_KEEP leave it suspended,
and a plain append resumes it. The suspension offset lets a journal whose every replica went
away roll forward to it, rather than refuse appends with INDEX_HAS_GREATER_OFFSET."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import pytest

from broker import client
from broker.client.appender import append
from broker.client.route_cache import JournalClient
from broker.fragment.stores.registry import new_registry
from broker.keyspace.keyspace import KeySpace
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import OffsetNotYetAvailableError
from broker.server import Broker
from broker.testing.cluster_state import Condition, journals_ready, route_of, wait_until
from broker.topology import Decoded, JournalItem, journal_assignments, lookup_item
from tests.broker.broker_testkit import ROOT, Cluster, journal_spec
from tests.broker.broker_testkit import wait_until as poll_until
from tests.broker.test_broker_handoff import allocating, mirror

J = "suspend/journal"
STORE = "file:///frags/"
A = pb.AppendRequest
wait_s = 20.0


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    (tmp_path / "frags").mkdir()
    c = Cluster(stores=new_registry(file_root=tmp_path))
    try:
        yield c
    finally:
        await c.close()


async def start(cluster: Cluster, n: int, clock: Callable[[], float] = time.time) -> list[Broker]:
    return [
        await cluster.start_broker(f"zone-{i % 2}", f"broker-{i}", clock=clock) for i in range(n)
    ]


def spec_of(ks: KeySpace[Decoded], journal: str = J) -> pb.JournalSpec:
    item = lookup_item(ks, ROOT, journal)
    assert item is not None and isinstance(item.decoded, JournalItem)
    return item.decoded.spec


def unassigned(ks: KeySpace[Decoded], journal: str = J) -> Condition:
    def condition() -> str | None:
        n = len(journal_assignments(ks, ROOT, journal))
        return None if n == 0 else f"{journal}: {n} assignments remain"

    return condition


async def read_all(endpoint: str, journal: str = J) -> bytes:
    c = JournalClient(endpoint)
    reader = client.RetryReader(c, pb.ReadRequest(journal=journal, offset=0, block=False))
    out = b""
    try:
        with contextlib.suppress(OffsetNotYetAvailableError):
            while chunk := await reader.read():
                out += chunk
    finally:
        await reader.close()
        await c.close()
    return out


async def raw(
    cluster: Cluster, request: pb.AppendRequest, chunks: Sequence[bytes] = ()
) -> pb.AppendResponse:
    """One Append RPC through the first broker (it proxies to the primary), as a Go client."""
    first = {f.name: v for f, v in request.ListFields()}
    journal = first.pop("journal")
    return await cluster.append(cluster.brokers[0], journal, list(chunks), **first)


def persisted(root: Path, journal: str = J) -> int:
    """The end offset of the fragments persisted to the file store."""
    ends = [int(p.name.split("-")[1], 16) for p in (root / "frags" / journal).glob("*")]
    return max(ends, default=0)


async def test_partial_suspension_and_resumption(cluster: Cluster, tmp_path: Path) -> None:
    brokers = await start(cluster, 3)
    c = JournalClient(brokers[0].endpoint)
    async with allocating(brokers), mirror(cluster) as ks:
        await cluster.put_spec(journal_spec(J, replication=3, stores=[STORE]))
        await wait_until(ks, journals_ready(ks, ROOT, [J], 3), wait_s)
        await append(c, A(journal=J), b"hello")

        # Content not yet persisted: SUSPEND_IF_FLUSHED leaves the journal as it is.
        resp = await raw(cluster, A(journal=J, suspend=A.SUSPEND_IF_FLUSHED))
        assert resp.status == pb.OK, resp
        assert spec_of(ks).suspend.level == pb.JournalSpec.Suspend.NONE

        # SUSPEND_NOW suspends it PARTIAL at its write head; one replica is left.
        resp = await raw(cluster, A(journal=J, suspend=A.SUSPEND_NOW))
        assert resp.status == pb.SUSPENDED, resp
        assert spec_of(ks).suspend == pb.JournalSpec.Suspend(
            level=pb.JournalSpec.Suspend.PARTIAL, offset=5
        )
        await wait_until(ks, journals_ready(ks, ROOT, [J], 1), wait_s)
        await poll_until(lambda: persisted(tmp_path) == 5, wait_s)

        # Suspended already: SUSPEND_NOW and SUSPEND_IF_FLUSHED say so, and change nothing.
        for control in (A.SUSPEND_NOW, A.SUSPEND_IF_FLUSHED):
            assert (await raw(cluster, A(journal=J, suspend=control))).status == pb.SUSPENDED
        # SUSPEND_NO_RESUME refuses to resume it.
        resp = await raw(cluster, A(journal=J, suspend=A.SUSPEND_NO_RESUME), [b"no"])
        assert resp.status == pb.SUSPENDED
        # SUSPEND_KEEP: an empty append goes through its single replica; content may not.
        resp = await raw(cluster, A(journal=J, suspend=A.SUSPEND_KEEP))
        assert (resp.status, resp.commit.end) == (pb.OK, 5)
        resp = await raw(cluster, A(journal=J, suspend=A.SUSPEND_KEEP), [b"no"])
        assert resp.status == pb.NOT_ALLOWED
        resp = await raw(cluster, A(journal=J, suspend=A.SUSPEND_NOW), [b"no"])
        assert resp.status == pb.NOT_ALLOWED
        assert spec_of(ks).suspend.level == pb.JournalSpec.Suspend.PARTIAL
        assert len(journal_assignments(ks, ROOT, J)) == 1

        # A plain append resumes it (the client retries while replicas come back).
        resp = await append(c, A(journal=J), b"world")
        assert (resp.commit.begin, resp.commit.end) == (5, 10)
        assert spec_of(ks).suspend == pb.JournalSpec.Suspend(
            level=pb.JournalSpec.Suspend.NONE, offset=5
        )
        await wait_until(ks, journals_ready(ks, ROOT, [J], 3), wait_s)
        assert await read_all(brokers[0].endpoint) == b"helloworld"
    await c.close()


async def test_full_suspension_of_an_unwritten_journal_and_resumption(cluster: Cluster) -> None:
    brokers = await start(cluster, 2)
    c = JournalClient(brokers[0].endpoint)
    async with allocating(brokers), mirror(cluster) as ks:
        await cluster.put_spec(journal_spec(J, replication=2, stores=[STORE]))
        await wait_until(ks, journals_ready(ks, ROOT, [J], 2), wait_s)

        # Nothing was ever written: SUSPEND_IF_FLUSHED suspends it FULL, and no broker keeps it.
        resp = await raw(cluster, A(journal=J, suspend=A.SUSPEND_IF_FLUSHED))
        assert resp.status == pb.SUSPENDED, resp
        assert spec_of(ks).suspend.level == pb.JournalSpec.Suspend.FULL
        await wait_until(ks, unassigned(ks), wait_s)
        for control in (A.SUSPEND_NO_RESUME, A.SUSPEND_KEEP, A.SUSPEND_IF_FLUSHED):
            assert (await raw(cluster, A(journal=J, suspend=control))).status == pb.SUSPENDED

        # A plain append resumes it; it is appended once the allocator assigned it again.
        resp = await append(c, A(journal=J), b"first")
        assert (resp.commit.begin, resp.commit.end) == (0, 5)
        assert spec_of(ks).suspend.level == pb.JournalSpec.Suspend.NONE
    await c.close()


async def test_a_resumed_journal_rolls_forward_to_its_suspension_offset(
    cluster: Cluster, tmp_path: Path
) -> None:
    first, second = await start(cluster, 2)
    c = JournalClient(second.endpoint)
    async with allocating([first, second]), mirror(cluster) as ks:
        await cluster.put_spec(journal_spec(J, replication=1, stores=[STORE]))
        await wait_until(ks, journals_ready(ks, ROOT, [J], 1), wait_s)
        await append(c, A(journal=J), b"0123456789")
        assert (await raw(cluster, A(journal=J, suspend=A.SUSPEND_NOW))).status == pb.SUSPENDED
        await poll_until(lambda: persisted(tmp_path) == 10, wait_s)

        # Its only replica goes away; the other broker takes the journal with an empty spool.
        (holder,) = (b for b in (first, second) if b.id in route_of(ks, ROOT, J).members)
        other = second if holder is first else first
        await cluster.stop_broker(holder)
        await c.close()
        c = JournalClient(other.endpoint)
        await wait_until(ks, journals_ready(ks, ROOT, [J], 1, exclude=[holder.id.suffix]), wait_s)

        # It rolls forward to the suspension offset and resumes there.
        resp = await append(c, A(journal=J), b"abc")
        assert (resp.status, resp.commit.begin, resp.commit.end) == (pb.OK, 10, 13)
        assert await read_all(other.endpoint) == b"0123456789abc"
    await c.close()
