"""Read and ListFragments RPCs, served by real grpc.aio servers on loopback from FragmentIndexes
populated directly (spool files and a memory:// store), behind a fake resolver."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import grpc
import grpc.aio
import pytest
import structlog
from google.protobuf.duration_pb2 import Duration

from broker.client.appender import Appender, append
from broker.client.list_apply import list_all_fragments
from broker.client.reader import Reader
from broker.client.rerouting_reader import (
    ReadEndedEarlyError,
    ReroutingReader,
    rerouting_backoff_s,
)
from broker.client.retry_reader import RetryReader
from broker.client.route_cache import ChannelPool, JournalClient
from broker.fragment import codecs
from broker.fragment.codecs import CompressionCodec
from broker.fragment.spool import LocalFragment
from broker.fragment.spool_file import MemorySpoolFile
from broker.fragment.stores.memory_store import MemoryBuckets, MemoryStore
from broker.fragment.stores.registry import StoreRegistry, new_registry
from broker.fragments_api import FragmentsAPI
from broker.http_gateway import HttpGateway
from broker.metrics import value_of
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import OffsetNotYetAvailableError
from broker.read_api import ReadAPI, closed_file_requeries_max
from broker.read_hole import hole_wait_warning_s_default
from tests.broker.read_testkit import (
    JOURNAL,
    FakeResolver,
    Replica,
    Servicer,
    WatchedIndex,
    commit,
    serving,
)
from tests.broker.read_testkit import fragment_of as store_fragment

STORE = "memory://bucket/root/"
NOW = 1_700_000_000.0
BROKER_A = pb.ProcessSpec.ID(zone="zone-a", suffix="broker-a")
BROKER_B = pb.ProcessSpec.ID(zone="zone-b", suffix="broker-b")


def header(endpoint: str = "", process: pb.ProcessSpec.ID = BROKER_A) -> pb.Header:
    out = pb.Header(
        route=pb.Route(members=[process], primary=0, endpoints=[endpoint]),
        etcd=pb.Header.Etcd(cluster_id=1, member_id=1, revision=10, raft_term=1),
    )
    out.process_id.CopyFrom(process)
    return out


@dataclass
class Broker:
    """One serving broker: its index, store, resolver and endpoint."""

    index: WatchedIndex
    registry: StoreRegistry
    store: MemoryStore
    resolver: FakeResolver
    endpoint: str
    stub: Any


@contextlib.asynccontextmanager
async def broker(
    *,
    chunk_bytes_max: int = 4,
    first_refresh_wait_s: float = 5.0,
    hole_wait_warning_s: float = hole_wait_warning_s_default,
) -> AsyncIterator[Broker]:
    buckets = MemoryBuckets(clock=lambda: NOW)
    registry = StoreRegistry({"memory": lambda url: MemoryStore(url, buckets=buckets)})
    store = registry.get(STORE)
    assert isinstance(store, MemoryStore)
    index = WatchedIndex(clock=lambda: NOW)
    resolver = FakeResolver(Replica(index), header())
    channels = ChannelPool()
    servicer = Servicer(
        ReadAPI(
            resolver,
            registry,
            channels,
            chunk_bytes_max=chunk_bytes_max,
            hole_wait_warning_s=hole_wait_warning_s,
        ),
        FragmentsAPI(resolver, registry, channels, first_refresh_wait_s=first_refresh_wait_s),
    )
    async with serving(servicer) as endpoint:
        resolver.header = header(endpoint)
        stub = channels.stub(endpoint)
        try:
            yield Broker(index, registry, store, resolver, endpoint, stub)
        finally:
            await channels.close()


async def read_all(stub: Any, **request: Any) -> list[pb.ReadResponse]:
    return [r async for r in stub.Read(pb.ReadRequest(journal=JOURNAL, **request))]


def content_of(responses: list[pb.ReadResponse]) -> list[tuple[int, bytes]]:
    return [(r.offset, r.content) for r in responses if r.content]


# --- Read ----------------------------------------------------------------------------------------


async def test_reads_local_fragments_in_chunks_then_stops_at_the_head() -> None:
    async with broker() as b:
        commit(b.index, 0, b"0123456789")
        commit(b.index, 10, b"abcdef")
        responses = await read_all(b.stub, offset=0)

    first = responses[0]
    assert first.status == pb.OK and first.header == b.resolver.header
    assert (first.offset, first.write_head) == (0, 16)
    assert (first.fragment.begin, first.fragment.end, first.fragment_url) == (0, 10, "")
    assert content_of(responses) == [
        (0, b"0123"), (4, b"4567"), (8, b"89"), (10, b"abcd"), (14, b"ef"),
    ]  # fmt: skip
    second = responses[4]
    assert not second.HasField("header") and (second.fragment.begin, second.offset) == (10, 10)
    last = responses[-1]
    assert (last.status, last.offset, last.write_head) == (pb.OFFSET_NOT_YET_AVAILABLE, 16, 16)


async def test_read_at_minus_one_resolves_to_the_write_head() -> None:
    async with broker() as b:
        commit(b.index, 0, b"0123456789")
        (only,) = await read_all(b.stub, offset=-1)
    assert (only.status, only.offset, only.write_head) == (pb.OFFSET_NOT_YET_AVAILABLE, 10, 10)
    assert only.header.etcd.revision == 10


async def test_blocking_read_is_woken_by_a_later_commit() -> None:
    async with broker() as b:
        commit(b.index, 0, b"0123456789")
        call = b.stub.Read(pb.ReadRequest(journal=JOURNAL, offset=-1, block=True))
        first = asyncio.ensure_future(call.read())
        await b.index.waiting.wait()
        assert not first.done()
        commit(b.index, 10, b"xyz")
        meta = await first
        assert (meta.status, meta.offset, meta.write_head) == (pb.OK, 10, 13)
        chunk = await call.read()
        assert (chunk.offset, chunk.content) == (10, b"xyz")
        call.cancel()


async def test_blocking_read_ends_cleanly_when_the_replica_goes_away() -> None:
    async with broker() as b:
        call = b.stub.Read(pb.ReadRequest(journal=JOURNAL, offset=0, block=True))
        pending = asyncio.ensure_future(call.read())
        await b.index.waiting.wait()
        b.index.close()
        assert await pending is grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK


async def test_end_offset_and_metadata_only() -> None:
    async with broker() as b:
        commit(b.index, 0, b"0123456789")
        commit(b.index, 10, b"abcdef")
        bounded = await read_all(b.stub, offset=3, end_offset=12)
        meta_only = await read_all(b.stub, offset=12, metadata_only=True)
    assert content_of(bounded) == [(3, b"3456"), (7, b"789"), (10, b"ab")]
    assert bounded[-1].content == b"ab"  # Nothing after end_offset, not even metadata.
    (meta,) = meta_only
    assert (meta.offset, meta.fragment.begin, meta.content) == (12, 10, b"")


async def test_reads_persisted_fragments_from_the_store_decompressed() -> None:
    async with broker() as b:
        content = b"KLMNOPQRST"
        fragment = store_fragment(16, content, CompressionCodec.GZIP)
        await b.store.put(fragment, codecs.compress(CompressionCodec.GZIP, content))
        b.index.replace_remote(await b.store.list(JOURNAL))
        proxied = await read_all(b.stub, offset=18, end_offset=24)
        direct = await read_all(b.stub, offset=18, do_not_proxy=True)

    meta = proxied[0]
    assert meta.fragment.backing_store == STORE and meta.fragment.mod_time == int(NOW)
    assert meta.fragment_url.startswith("memory://bucket/root/a/journal/")
    assert content_of(proxied) == [(18, b"MNOP"), (22, b"QR")]
    # With do_not_proxy the broker hands out the URL and lets the client read the file.
    (only,) = direct
    assert only.fragment_url == meta.fragment_url and not content_of(direct)


async def test_jumps_over_a_gap_to_the_first_persisted_fragment() -> None:
    async with broker() as b:
        fragment = store_fragment(100, b"late", CompressionCodec.NONE)
        await b.store.put(fragment, b"late")
        b.index.replace_remote(await b.store.list(JOURNAL))
        responses = await read_all(b.stub, offset=0)
    assert responses[0].offset == 100
    assert content_of(responses) == [(100, b"late")]


async def test_a_read_waiting_at_a_hole_below_the_head_is_warned_once_and_counted() -> None:
    """A blocking read at an offset no fragment covers, below the write head (a recent
    persisted fragment after the hole, so the index will not jump it for hours), is reported
    once it has waited hole_wait_warning_s, keeps waiting, and is served once the hole fills."""
    async with broker(hole_wait_warning_s=0.05) as b:
        after = store_fragment(100, b"late", CompressionCodec.NONE)
        await b.store.put(after, b"late")
        b.index.replace_remote(await b.store.list(JOURNAL))
        counted = value_of("gazette_read_hole_waits_total")
        with structlog.testing.capture_logs() as logs:
            call = b.stub.Read(pb.ReadRequest(journal=JOURNAL, offset=50, block=True))
            first = asyncio.ensure_future(call.read())
            await b.index.timed_out.wait()
            await b.index.waiting.wait()
            assert not first.done()
            # The upload that fills the hole is listed at last: the read goes on from it.
            hole = store_fragment(50, b"x" * 50, CompressionCodec.NONE)
            await b.store.put(hole, b"x" * 50)
            b.index.replace_remote(await b.store.list(JOURNAL))
            meta = await first
            call.cancel()
    holes = [e for e in logs if e["event"].startswith("blocking read waits at a hole")]
    assert [(e["log_level"], e["journal"], e["offset"], e["write_head"]) for e in holes] == [
        ("warning", JOURNAL, 50, 104)
    ]
    assert value_of("gazette_read_hole_waits_total") == counted + 1
    assert (meta.status, meta.offset, meta.fragment.begin) == (pb.OK, 50, 50)


async def test_a_read_waiting_at_the_write_head_is_not_a_hole() -> None:
    async with broker(hole_wait_warning_s=0.05) as b:
        commit(b.index, 0, b"0123456789")
        counted = value_of("gazette_read_hole_waits_total")
        with structlog.testing.capture_logs() as logs:
            call = b.stub.Read(pb.ReadRequest(journal=JOURNAL, offset=10, block=True))
            first = asyncio.ensure_future(call.read())
            await b.index.timed_out.wait()
            b.index.timed_out.clear()
            await b.index.timed_out.wait()  # Waited twice the interval, at the head.
            commit(b.index, 10, b"xyz")
            meta = await first
            call.cancel()
    assert not [e for e in logs if e["event"].startswith("blocking read waits at a hole")]
    assert value_of("gazette_read_hole_waits_total") == counted
    assert (meta.status, meta.offset) == (pb.OK, 10)


async def test_statuses_from_resolution_and_flags() -> None:
    async with broker() as b:
        b.resolver.status = pb.JOURNAL_NOT_FOUND
        (missing,) = await read_all(b.stub, offset=0)
        b.resolver.status = pb.OK
        b.resolver.spec = pb.JournalSpec(name=JOURNAL, flags=pb.JournalSpec.O_WRONLY)
        (write_only,) = await read_all(b.stub, offset=0)
    assert (missing.status, missing.header) == (pb.JOURNAL_NOT_FOUND, b.resolver.header)
    assert write_only.status == pb.NOT_ALLOWED


@pytest.mark.parametrize(
    ("request_fields", "field_path"),
    [
        ({"journal": "a/journal", "offset": -2}, "ReadRequest.offset"),
        ({"journal": "a/journal", "offset": 10, "end_offset": 5}, "ReadRequest.end_offset"),
        ({"journal": "no", "offset": 0}, "ReadRequest.journal"),
    ],
)
async def test_invalid_requests_are_refused_with_the_field_named(
    request_fields: dict[str, Any], field_path: str
) -> None:
    async with broker() as b:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            [r async for r in b.stub.Read(pb.ReadRequest(**request_fields))]
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field_path in (info.value.details() or "")
    assert b.resolver.calls == []  # Refused before anything else happened.


async def test_proxies_reads_to_a_broker_of_the_route() -> None:
    async with broker() as serving_b, broker() as front:
        commit(serving_b.index, 0, b"proxied content")
        serving_b.resolver.header = header(serving_b.endpoint, BROKER_B)
        # The front broker is not in the route: the resolver names no process to talk to.
        route_header = header(serving_b.endpoint, BROKER_B)
        route_header.process_id.Clear()
        front.resolver.header = route_header
        front.resolver.replica = None
        responses = await read_all(front.stub, offset=0)
        refused = await read_all(front.stub, offset=0, do_not_proxy=True)

    assert b"".join(c for _, c in content_of(responses)) == b"proxied content"
    forwarded = serving_b.resolver.calls[0]["proxy_header"]
    assert forwarded is not None and forwarded.process_id == BROKER_B
    assert refused[0].status == pb.NOT_JOURNAL_BROKER


class PersistingFile(MemorySpoolFile):
    """A spool file that is persisted and closed just as a read starts reading it."""

    def __init__(self, on_first_read: Callable[[], None]) -> None:
        super().__init__()
        self._on_first_read: Callable[[], None] | None = on_first_read

    def pread(self, length: int, offset: int) -> bytes:
        if self._on_first_read is not None:
            hook, self._on_first_read = self._on_first_read, None
            hook()
        return super().pread(length, offset)


async def test_a_file_closed_mid_read_is_re_queried_from_the_store() -> None:
    async with broker() as b:
        content = b"persisted under the reader"
        fragment = store_fragment(0, content, CompressionCodec.NONE)
        await b.store.put(fragment, content)
        stored = (await b.store.list(JOURNAL))[0]

        def persist() -> None:
            b.index.add_persisted(stored)
            file.close()

        file = PersistingFile(persist)
        file.pwrite(content, 0)
        b.index.spool_commit(LocalFragment(fragment, file))
        responses = await read_all(b.stub, offset=0)
    assert b"".join(c for _, c in content_of(responses)) == content
    metas = [r for r in responses if not r.content and r.status == pb.OK]
    assert [m.fragment.backing_store for m in metas] == ["", STORE]


async def test_a_closed_file_that_stays_indexed_fails_the_read() -> None:
    async with broker() as b:
        commit(b.index, 0, b"content").close()  # Closed, yet still indexed: a bug elsewhere.
        responses: list[pb.ReadResponse] = []
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for response in b.stub.Read(pb.ReadRequest(journal=JOURNAL, offset=0)):
                responses.append(response)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    # Re-queried a bounded number of times (one metadata response each), then failed.
    assert len(responses) == closed_file_requeries_max + 1
    assert not content_of(responses)


# --- ListFragments -------------------------------------------------------------------------------


async def list_page(stub: Any, **request: Any) -> pb.FragmentsResponse:
    response: pb.FragmentsResponse = await stub.ListFragments(
        pb.FragmentsRequest(journal=JOURNAL, **request)
    )
    return response


async def populated(b: Broker) -> None:
    """Five persisted fragments with mod times 100..500, then one local fragment."""
    remote = []
    for i in range(5):
        f = store_fragment(i * 10, b"x" * 10, CompressionCodec.NONE)
        f.backing_store, f.mod_time = STORE, (i + 1) * 100
        remote.append(f)
    b.index.replace_remote(remote)
    commit(b.index, 50, b"local")


async def test_list_fragments_pages_through_the_index() -> None:
    async with broker() as b:
        await populated(b)
        pages: list[list[tuple[int, int]]] = []
        token = 0
        while True:
            page = await list_page(b.stub, page_limit=2, next_page_token=token)
            assert page.status == pb.OK and page.header == b.resolver.header
            pages.append([(f.spec.begin, f.spec.end) for f in page.fragments])
            token = page.next_page_token
            if token == 0:
                break
    assert pages == [[(0, 10), (10, 20)], [(20, 30), (30, 40)], [(40, 50), (50, 55)]]


async def test_list_fragments_filters_by_mod_time_and_signs_urls() -> None:
    async with broker() as b:
        await populated(b)
        ranged = await list_page(b.stub, begin_mod_time=250, end_mod_time=450)
        signed = await list_page(b.stub, begin_mod_time=450, signatureTTL=Duration(seconds=60))
    assert [(f.spec.begin, f.spec.mod_time) for f in ranged.fragments] == [(20, 300), (30, 400)]
    # Without an end bound, the unpersisted local fragment is listed too, without a URL.
    assert [(f.spec.begin, bool(f.signed_url)) for f in signed.fragments] == [
        (40, True),
        (50, False),
    ]
    assert signed.fragments[0].signed_url.startswith("memory://bucket/root/a/journal/")


async def test_list_fragments_waits_for_the_first_refresh() -> None:
    async with broker(first_refresh_wait_s=0.05) as b:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await list_page(b.stub)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        b.index.replace_remote([])
        assert (await list_page(b.stub)).status == pb.OK


@pytest.mark.parametrize(
    ("fields", "field_path"),
    [
        ({"page_limit": 10_001}, "FragmentsRequest.page_limit"),
        ({"next_page_token": -1}, "FragmentsRequest.next_page_token"),
        ({"begin_mod_time": 10, "end_mod_time": 5}, "FragmentsRequest.end_mod_time"),
        ({"signatureTTL": Duration(seconds=-1)}, "FragmentsRequest.signatureTTL"),
        ({"signatureTTL": Duration(seconds=5, nanos=-3)}, "FragmentsRequest.signatureTTL"),
        ({"signatureTTL": Duration(nanos=2_000_000_000)}, "FragmentsRequest.signatureTTL"),
    ],
)
async def test_list_fragments_refuses_invalid_requests(
    fields: dict[str, Any], field_path: str
) -> None:
    async with broker() as b:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await list_page(b.stub, **fields)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field_path in (info.value.details() or "")


async def test_list_fragments_is_proxied_when_not_local() -> None:
    async with broker() as serving_b, broker() as front:
        await populated(serving_b)
        serving_b.resolver.header = header(serving_b.endpoint, BROKER_B)
        front.resolver.header = header(serving_b.endpoint, BROKER_B)
        front.resolver.replica = None
        page = await list_page(front.stub)
    assert len(page.fragments) == 6
    assert serving_b.resolver.calls[0]["proxy_header"].process_id == BROKER_B


# --- End to end: real brokers (server.py), the Python client -------------------------------------


E2E_JOURNAL = "e2e/journal"


async def _cluster_client(tmp_path: Any) -> tuple[Any, Any, JournalClient]:
    from broker_testkit import Cluster, journal_spec

    (tmp_path / "fragments").mkdir()
    cluster = Cluster(stores=new_registry(file_root=tmp_path))
    brokers = [
        await cluster.start_broker("zone-a", "broker-a"),
        await cluster.start_broker("zone-b", "broker-b"),
    ]
    spec = journal_spec(
        E2E_JOURNAL, replication=2, length=1024, codec=pb.GZIP, stores=["file:///fragments/"]
    )
    await cluster.create(spec, brokers)
    client = JournalClient(brokers[1].endpoint)  # A replica: appends are proxied to the primary.
    return cluster, brokers, client


async def test_e2e_append_then_read_back_with_retry_reader(tmp_path: Any) -> None:
    cluster, _, client = await _cluster_client(tmp_path)
    try:
        records = [b"record %04d\n" % i for i in range(300)]  # ~3.6 KiB: several fragments.
        for start in range(0, len(records), 50):
            async with Appender(client, pb.AppendRequest(journal=E2E_JOURNAL)) as appender:
                for record in records[start : start + 50]:
                    await appender.write(record)
            assert appender.response is not None
        content = b"".join(records)

        reader = RetryReader(
            client, pb.ReadRequest(journal=E2E_JOURNAL, offset=0, end_offset=len(content))
        )
        assert b"".join([c.content async for c in reader]) == content

        # A blocking read at the head gets what is appended after it started.
        blocking = RetryReader(client, pb.ReadRequest(journal=E2E_JOURNAL, offset=-1, block=True))
        with pytest.raises(OffsetNotYetAvailableError):
            await Reader(client, pb.ReadRequest(journal=E2E_JOURNAL, offset=len(content))).read()
        pending = asyncio.ensure_future(blocking.read_chunk())
        await append(client, pb.AppendRequest(journal=E2E_JOURNAL), b"late record\n")
        chunk = await pending
        assert (chunk.offset, chunk.content) == (len(content), b"late record\n")
        await blocking.close()
    finally:
        await client.close()
        await cluster.close()


async def test_e2e_reads_a_persisted_fragment_by_its_url(tmp_path: Any) -> None:
    from broker_testkit import replica_of, wait_until

    cluster, brokers, client = await _cluster_client(tmp_path)
    try:
        first = (
            b"x" * 1500 + b"\n"
        )  # Longer than the spec's fragment length: the next append rolls.
        await append(client, pb.AppendRequest(journal=E2E_JOURNAL), first)
        await append(client, pb.AppendRequest(journal=E2E_JOURNAL), b"second\n")
        primary_index = replica_of(brokers[0], E2E_JOURNAL).index
        await wait_until(lambda: primary_index.query(0).file is None)  # Persisted.

        reader = Reader(
            JournalClient(brokers[0].endpoint),
            pb.ReadRequest(journal=E2E_JOURNAL, offset=10, do_not_proxy=True),
        )
        chunks = [c async for c in reader]
        assert reader.response.fragment_url.startswith("file://")
        assert b"".join(c.content for c in chunks) == first[10:]
        await reader.client.close()

        listed = await list_all_fragments(client, pb.FragmentsRequest(journal=E2E_JOURNAL))
        assert listed.fragments[0].spec.backing_store == "file:///fragments/"
        assert (listed.fragments[0].spec.begin, listed.fragments[0].spec.end) == (0, len(first))
    finally:
        await client.close()
        await cluster.close()


# --- A Read the broker ends early (its replica went away), through a ReroutingReader ---

# Bounds the waits of these tests for what they expect (each expected event comes much sooner).
REROUTE_BOUND_S = 10.0


async def test_a_rerouting_reader_reads_on_when_the_replica_goes_away_mid_read() -> None:
    async with broker() as b:
        commit(b.index, 0, b"0123456789")
        client = JournalClient(b.endpoint)
        pauses: list[float] = []

        async def pause(delay_s: float) -> None:
            pauses.append(delay_s)

        request = pb.ReadRequest(journal=JOURNAL, offset=0, block=True)
        reader = ReroutingReader(client, request, sleep=pause)
        try:
            async with asyncio.timeout(REROUTE_BOUND_S):
                got = bytearray()
                while len(got) < 10:
                    chunk = await reader.read_chunk()
                    assert chunk.offset == len(got) and chunk.content
                    got += chunk.content
                pending = asyncio.ensure_future(reader.read_chunk())
                await b.index.waiting.wait()  # The Read waits at the head, on this replica.
                # The journal moves: its next replica holds the same content. This one goes
                # away, which ends its Read cleanly (as Gazette's brokers do).
                moved = WatchedIndex(clock=lambda: NOW)
                commit(moved, 0, b"0123456789")
                b.resolver.replica = Replica(moved)
                b.index.close()
                # Read on from offset 10 on the next replica (a plain Reader would have ended).
                await moved.waiting.wait()
                assert not pending.done()
                commit(moved, 10, b"abc")
                chunk = await pending
            assert (chunk.offset, chunk.content) == (10, b"abc")
            assert reader.reroutes == 1 and pauses == [rerouting_backoff_s(1)]
        finally:
            await reader.close()
            await client.close()


async def test_a_rerouting_reader_ends_where_the_read_is_done() -> None:
    async with broker() as b:
        commit(b.index, 0, b"0123456789")
        client = JournalClient(b.endpoint)
        try:
            bounded = ReroutingReader(client, pb.ReadRequest(journal=JOURNAL, end_offset=6))
            chunks = [await bounded.read_chunk() for _ in range(3)]
            assert [(c.offset, c.content) for c in chunks] == [(0, b"0123"), (4, b"45"), (6, b"")]
            meta = ReroutingReader(client, pb.ReadRequest(journal=JOURNAL, metadata_only=True))
            assert (await meta.read_chunk()).content == b""
            assert meta.response.write_head == 10
            assert bounded.reroutes == meta.reroutes == 0
        finally:
            await client.close()


async def test_read_streams_that_keep_ending_early_fail_the_rerouting_reader() -> None:
    async with broker() as b:
        commit(b.index, 0, b"0123456789")
        b.index.close()  # Every Read of it ends at once, cleanly.
        client = JournalClient(b.endpoint)
        pauses: list[float] = []

        async def pause(delay_s: float) -> None:
            pauses.append(delay_s)

        reader = ReroutingReader(
            client, pb.ReadRequest(journal=JOURNAL), attempts_max=3, sleep=pause
        )
        try:
            with pytest.raises(ReadEndedEarlyError, match="3 Read streams in a row ended"):
                await reader.read_chunk()
            assert pauses == [rerouting_backoff_s(1), rerouting_backoff_s(2)]
        finally:
            await reader.close()
            await client.close()


# --- A stored fragment pruned since the index's last listing ---

DAY_S = 86400


def _aged(listed: list[pb.Fragment], days_by_begin: dict[int, int]) -> list[pb.Fragment]:
    """The listing with each fragment persisted `days_by_begin[begin]` days ago."""
    for fragment in listed:
        fragment.mod_time = int(NOW) - days_by_begin[fragment.begin] * DAY_S
    return listed


async def _prune_under_a_listing(b: Broker, retention_days: int) -> pb.Fragment:
    """Stored: [0, 10) persisted 4 days ago; [5, 10) (the same bytes, persisted again by
    another broker, covered by the first in the index) and [10, 16), 1 day ago; listed. Then
    [0, 10)'s file is removed (as `gazctl journals prune` does), before the next listing. The
    journal keeps fragments for `retention_days`. Returns the pruned fragment."""
    content = b"0123456789abcdef"
    pieces = [(0, 10), (5, 10), (10, 16)]
    for begin, end in pieces:
        fragment = store_fragment(begin, content[begin:end], CompressionCodec.NONE)
        await b.store.put(fragment, content[begin:end])
    ages = {0: 4, 5: 1, 10: 1}
    b.index.replace_remote(_aged(await b.store.list(JOURNAL), ages))
    assert [(f.begin, f.end) for f in b.index.fragments()] == [(0, 10), (10, 16)]
    b.resolver.spec = pb.JournalSpec(
        name=JOURNAL,
        fragment=pb.JournalSpec.Fragment(retention=Duration(seconds=retention_days * DAY_S)),
    )
    (pruned,) = [f for f in b.index.fragments() if f.begin == 0]
    await b.store.delete(pruned)
    return pruned


async def test_a_fragment_pruned_since_the_last_listing_is_retried_then_read_past() -> None:
    async with broker() as b:
        await _prune_under_a_listing(b, retention_days=3)
        # A reader lagging inside the pruned fragment is told to read again (UNAVAILABLE,
        # retried), not DATA_LOSS (not retried: a shard would end FAILED); the index asks its
        # refresher for a listing now.
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await read_all(b.stub, offset=3)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "pruned" in (caught.value.details() or "")
        assert b.index.relist_wanted.is_set()
        assert b.index.lost_fragments() == []
        # The listing: [0, 10) gone, [5, 10) back. The read goes on at 5, not past it.
        b.index.replace_remote(_aged(await b.store.list(JOURNAL), {5: 1, 10: 1}))
        responses = await read_all(b.stub, offset=3)
        assert content_of(responses) == [(5, b"5678"), (9, b"9"), (10, b"abcd"), (14, b"ef")]
        assert b.index.lost_fragments() == []


async def test_a_fragment_missing_within_its_retention_is_still_data_loss() -> None:
    async with broker() as b:
        pruned = await _prune_under_a_listing(b, retention_days=10)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await read_all(b.stub, offset=3)
        assert caught.value.code() == grpc.StatusCode.DATA_LOSS
        assert not b.index.relist_wanted.is_set()
        assert pruned.begin in [f.begin for f in b.index.fragments()]


async def test_a_gateway_read_goes_on_when_the_replica_goes_away_mid_read() -> None:
    # The HTTP gateway reads through a ReroutingReader: a blocking GET whose Read the broker
    # ends (its replica went away) goes on from the next replica, instead of ending the body
    # as if the read were over.
    async with broker() as b:
        commit(b.index, 0, b"0123456789")
        client = JournalClient(b.endpoint)
        gateway = HttpGateway(client)
        port = await gateway.start("127.0.0.1", 0)
        url = f"http://127.0.0.1:{port}/{JOURNAL}?offset=10&block=true"
        try:
            async with aiohttp.ClientSession() as session:
                async with asyncio.timeout(REROUTE_BOUND_S):
                    reading = asyncio.ensure_future(_read_three(session, url))
                    await b.index.waiting.wait()  # The gateway's Read waits at the head.
                    moved = WatchedIndex(clock=lambda: NOW)
                    commit(moved, 0, b"0123456789")
                    b.resolver.replica = Replica(moved)
                    b.index.close()  # Ends that Read cleanly.
                    await moved.waiting.wait()  # Read again, from the next replica.
                    assert not reading.done()
                    commit(moved, 10, b"abc")
                    status, body = await reading
            assert (status, body) == (206, b"abc")
        finally:
            await gateway.stop()
            await client.close()


async def _read_three(session: aiohttp.ClientSession, url: str) -> tuple[int, bytes]:
    async with session.get(url) as resp:
        return resp.status, await resp.content.readexactly(3)
