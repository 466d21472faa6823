"""Reader and RetryReader against a real Read RPC server on loopback (the broker's ReadAPI over a
FragmentIndex populated directly), including direct reads of file:// fragments by signed URL."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from broker.client.reader import (
    Chunk,
    FragmentContentError,
    FragmentContentReader,
    FragmentIntegrityError,
    Reader,
)
from broker.client.retry_reader import RetryReader, backoff_s
from broker.client.route_cache import ChannelPool, JournalClient
from broker.fragment import codecs, naming
from broker.fragment.codecs import CompressionCodec
from broker.fragment.index import FragmentIndex, QueryResult
from broker.fragment.spool import LocalFragment
from broker.fragment.spool_file import MemorySpoolFile
from broker.fragment.stores.base import BytesReader
from broker.fragment.stores.registry import StoreRegistry, new_registry
from broker.protocol import protocol_pb2 as pb
from broker.protocol import protocol_pb2_grpc as pb_grpc
from broker.protocol.status import (
    JournalNotFoundError,
    NotJournalBrokerError,
    OffsetNotYetAvailableError,
)
from broker.read_api import ReadAPI

JOURNAL = "a/journal"
STORE = "file:///store/"
BROKER = pb.ProcessSpec.ID(zone="zone-a", suffix="broker-a")


@dataclass
class Replica:
    index: FragmentIndex


@dataclass
class Resolution:
    status: int
    header: pb.Header
    spec: pb.JournalSpec | None
    replica: Replica | None
    is_local: bool = True


@dataclass
class FakeResolver:
    replica: Replica
    header: pb.Header = field(default_factory=pb.Header)
    status: int = pb.OK
    calls: int = 0

    async def resolve(self, journal: str, **kwargs: Any) -> Resolution:
        self.calls += 1
        return Resolution(self.status, self.header, pb.JournalSpec(name=journal), self.replica)


class WatchedIndex(FragmentIndex):
    def __init__(self) -> None:
        super().__init__(JOURNAL)
        self.waiting = asyncio.Event()

    async def wait_for(self, offset: int, **kwargs: Any) -> QueryResult:
        if not self.query(offset, **kwargs).found:
            self.waiting.set()  # A reader is about to block.
        return await super().wait_for(offset, **kwargs)


class Servicer(pb_grpc.JournalServicer):  # type: ignore[misc]
    def __init__(self, api: ReadAPI) -> None:
        self.api = api

    async def Read(self, request: pb.ReadRequest, context: Any) -> AsyncIterator[pb.ReadResponse]:
        async for response in self.api.read(request, context):
            yield response


@dataclass
class Env:
    resolver: FakeResolver
    registry: StoreRegistry
    client: JournalClient
    endpoint: str

    @property
    def index(self) -> WatchedIndex:
        index = self.resolver.replica.index
        assert isinstance(index, WatchedIndex)
        return index


def route_header(endpoint: str) -> pb.Header:
    out = pb.Header(
        route=pb.Route(members=[BROKER], primary=0, endpoints=[endpoint]),
        etcd=pb.Header.Etcd(cluster_id=1, revision=3),
    )
    out.process_id.CopyFrom(BROKER)
    return out


@contextlib.asynccontextmanager
async def env(tmp_path: Path, *, broker_chunk_bytes: int = 4) -> AsyncIterator[Env]:
    (tmp_path / "store").mkdir(exist_ok=True)
    registry = new_registry(file_root=tmp_path)
    resolver = FakeResolver(Replica(WatchedIndex()))
    channels = ChannelPool()
    api = ReadAPI(resolver, registry, channels, chunk_bytes_max=broker_chunk_bytes)
    server = grpc.aio.server()
    pb_grpc.add_JournalServicer_to_server(Servicer(api), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    endpoint = f"http://127.0.0.1:{port}"
    resolver.header = route_header(endpoint)
    client = JournalClient(endpoint)
    try:
        yield Env(resolver, registry, client, endpoint)
    finally:
        await client.close()
        await channels.close()
        await server.stop(None)


def commit(index: FragmentIndex, begin: int, content: bytes) -> None:
    file = MemorySpoolFile()
    file.pwrite(content, 0)
    fragment = pb.Fragment(
        journal=JOURNAL,
        begin=begin,
        end=begin + len(content),
        sum=naming.content_sum(content),
        compression_codec=pb.NONE,
    )
    index.spool_commit(LocalFragment(fragment, file))


async def persist(e: Env, begin: int, content: bytes, codec: CompressionCodec) -> pb.Fragment:
    """Put `content` in the file:// store and index what the store lists."""
    fragment = pb.Fragment(
        journal=JOURNAL,
        begin=begin,
        end=begin + len(content),
        sum=naming.content_sum(content),
        compression_codec=naming.pb_codec(codec),
    )
    store = e.registry.get(STORE)
    await store.put(fragment, codecs.compress(codec, content))
    listed = await store.list(JOURNAL)
    e.index.replace_remote(listed)
    return next(f for f in listed if f.begin == begin)


async def drain(reader: Reader | RetryReader) -> list[Chunk]:
    return [chunk async for chunk in reader]


# --- Reader --------------------------------------------------------------------------------------


async def test_reader_streams_chunks_then_raises_at_the_head(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        commit(e.index, 0, b"0123456789")
        reader = Reader(e.client, pb.ReadRequest(journal=JOURNAL, offset=2))
        chunks = []
        with pytest.raises(OffsetNotYetAvailableError):
            while True:
                chunks.append(await reader.read_chunk())
        assert chunks == [Chunk(2, b"2345"), Chunk(6, b"6789")]
        assert reader.offset == 10
        # The latest metadata is the final answer: nothing yet at the head.
        assert reader.response.status == pb.OFFSET_NOT_YET_AVAILABLE
        assert (reader.response.offset, reader.response.write_head) == (10, 10)
        # The header's route was learned: later requests go straight to this broker.
        route = e.client.routes.get(JOURNAL)
        assert route is not None and list(route.endpoints) == [e.endpoint]


async def test_reader_stops_at_end_offset(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        commit(e.index, 0, b"0123456789")
        reader = Reader(e.client, pb.ReadRequest(journal=JOURNAL, offset=1, end_offset=7))
        assert await drain(reader) == [Chunk(1, b"1234"), Chunk(5, b"56")]
        assert reader.done and await reader.read() == b""


async def test_reader_follows_offset_jumps(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        await persist(e, 100, b"after a gap", CompressionCodec.NONE)
        reader = Reader(e.client, pb.ReadRequest(journal=JOURNAL, offset=0, end_offset=111))
        chunks = await drain(reader)
        assert chunks[0].offset == 100 and reader.jumps == 1
        assert b"".join(c.content for c in chunks) == b"after a gap"


@pytest.mark.parametrize("via_registry", [False, True])
async def test_reader_reads_persisted_fragments_directly(
    tmp_path: Path, via_registry: bool
) -> None:
    content = b"".join(b"record %d\n" % i for i in range(1000))
    async with env(tmp_path) as e:
        await persist(e, 0, content, CompressionCodec.GZIP)
        reader = Reader(
            e.client,
            pb.ReadRequest(journal=JOURNAL, offset=5, do_not_proxy=True),
            registry=e.registry if via_registry else None,
        )
        chunks = await drain(reader)
        assert reader.response.fragment_url.startswith("file://")
        assert b"".join(c.content for c in chunks) == content[5:]
        # Read from the file, not through the broker (whose chunks are 4 bytes).
        assert len(chunks[0].content) > 4 and chunks[0].offset == 5
        assert reader.offset == len(content)


async def test_reader_raises_typed_statuses_and_grpc_errors(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        e.resolver.status = pb.JOURNAL_NOT_FOUND
        with pytest.raises(JournalNotFoundError, match="reading a/journal at offset 0"):
            await Reader(e.client, pb.ReadRequest(journal=JOURNAL)).read()
        with pytest.raises(ValueError, match="offset: must be >= -1"):
            await Reader(e.client, pb.ReadRequest(journal=JOURNAL, offset=-5)).read()


async def test_fragment_content_reader_checks_the_file_against_the_fragment() -> None:
    fragment = pb.Fragment(journal=JOURNAL, begin=10, end=20, compression_codec=pb.GZIP)

    async def read_all(stored: bytes) -> bytes:
        reader = FragmentContentReader(BytesReader(stored), fragment, 12)
        out = b""
        while piece := await reader.read():
            out += piece
        return out

    assert await read_all(codecs.compress(CompressionCodec.GZIP, b"0123456789")) == b"23456789"
    with pytest.raises(FragmentContentError, match="decodes to 5 of the fragment's 10 bytes"):
        await read_all(codecs.compress(CompressionCodec.GZIP, b"short"))
    with pytest.raises(FragmentContentError, match="more than the fragment's 10 bytes"):
        await read_all(codecs.compress(CompressionCodec.GZIP, b"far too long content"))
    with pytest.raises(FragmentContentError, match="gzip"):
        await read_all(b"not gzip at all")


# --- RetryReader -----------------------------------------------------------------------------------


async def test_retry_reader_resumes_on_another_replica(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        commit(e.index, 0, b"hello")
        reader = RetryReader(e.client, pb.ReadRequest(journal=JOURNAL, offset=0, block=True))
        assert await reader.read_chunk() == Chunk(0, b"hell")
        assert await reader.read_chunk() == Chunk(4, b"o")
        blocked = asyncio.ensure_future(reader.read_chunk())
        old = e.index
        await old.waiting.wait()
        # The replica goes away (its stream ends); the next one holds more of the journal.
        successor = WatchedIndex()
        commit(successor, 0, b"hello")
        commit(successor, 5, b" world")
        e.resolver.replica = Replica(successor)
        old.close()
        assert await blocked == Chunk(5, b" wor")
        assert await reader.read_chunk() == Chunk(9, b"ld")
        assert reader.restarts == 1
        await reader.close()


async def test_retry_reader_retries_an_unreachable_broker(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        commit(e.index, 0, b"abc")
        dead = JournalClient("http://127.0.0.1:1")  # Nothing listens there.
        slept: list[float] = []

        async def sleep(delay: float) -> None:
            # While we back off, the cluster tells us where the journal really is.
            slept.append(delay)
            dead.routes.update(JOURNAL, route_header(e.endpoint).route)

        reader = RetryReader(
            dead,
            pb.ReadRequest(journal=JOURNAL, offset=0, end_offset=3),
            sleep=sleep,
            jitter=lambda: 0.0,
        )
        assert b"".join(c.content for c in await drain(reader)) == b"abc"
        assert slept == [backoff_s(1)]
        await dead.close()


async def test_retry_reader_gives_up_after_attempts_max(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        e.resolver.status = pb.NOT_JOURNAL_BROKER  # Retriable, but it never converges.
        slept: list[float] = []

        async def sleep(delay: float) -> None:
            slept.append(delay)

        reader = RetryReader(
            e.client,
            pb.ReadRequest(journal=JOURNAL),
            attempts_max=4,
            sleep=sleep,
            jitter=lambda: 0.0,
        )
        with pytest.raises(NotJournalBrokerError):
            await reader.read()
        assert slept == [backoff_s(1), backoff_s(2), backoff_s(3)]
        assert e.resolver.calls == 4


async def test_retry_reader_surfaces_non_retriable_answers(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        slept: list[float] = []

        async def sleep(delay: float) -> None:
            slept.append(delay)

        reader = RetryReader(e.client, pb.ReadRequest(journal=JOURNAL), sleep=sleep)
        with pytest.raises(OffsetNotYetAvailableError):
            await reader.read()  # Non-blocking, at the head: an answer, not a failure.
        e.resolver.status = pb.JOURNAL_NOT_FOUND
        with pytest.raises(JournalNotFoundError):
            await reader.read()
        # A just-created journal gets a few attempts to propagate first.
        assert len(slept) == 3
        assert e.resolver.calls == 5


async def test_retry_reader_seek(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        commit(e.index, 0, b"0123456789")
        reader = RetryReader(e.client, pb.ReadRequest(journal=JOURNAL, end_offset=10))
        assert await reader.read_chunk() == Chunk(0, b"0123")
        await reader.seek(8)
        assert await drain(reader) == [Chunk(8, b"89")]


async def test_retry_reader_metadata_only_answers_once(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        commit(e.index, 0, b"0123456789")
        reader = RetryReader(
            e.client, pb.ReadRequest(journal=JOURNAL, offset=4, metadata_only=True)
        )
        assert await reader.read_chunk() == Chunk(4, b"")
        assert (reader.response.fragment.end, reader.response.write_head) == (10, 10)
        assert e.resolver.calls == 1


@pytest.mark.parametrize("whole_bytes_max", [1 << 20, 8], ids=["whole", "streamed"])
async def test_fragment_content_reader_verifies_whole_or_as_it_streams(
    whole_bytes_max: int,
) -> None:
    content = b"0123456789" * 3
    fragment = pb.Fragment(
        journal=JOURNAL,
        begin=0,
        end=len(content),
        sum=naming.content_sum(content),
        compression_codec=pb.NONE,
        backing_store=STORE,
    )
    other = content[:-1] + b"!"  # Same length; differs in its last byte.
    reader = FragmentContentReader(
        BytesReader(other),
        fragment,
        4,
        chunk_bytes_max=10,
        verify_whole_bytes_max=whole_bytes_max,
        store=STORE,
    )
    got = b""
    with pytest.raises(FragmentIntegrityError, match=r"not the .* of its name") as caught:
        while piece := await reader.read():
            got += piece
    if whole_bytes_max >= len(content):
        # Small enough to verify before handing anything out: not one byte was delivered.
        assert got == b"" and caught.value.delivered == 0
    else:
        # Streamed: whole pieces before the end were delivered (the last one, short of a whole
        # piece, waits for the end of the file), and the error says how many.
        delivered = caught.value.delivered
        assert got == other[4 : 4 + delivered] and 0 < delivered < len(content) - 4
        assert f"({delivered} bytes of it were already delivered" in str(caught.value)
    assert not reader.verified  # It failed verification.
