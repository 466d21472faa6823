"""The read side of a broker without a cluster: the real ReadAPI and FragmentsAPI served by a
grpc.aio server on loopback, over FragmentIndexes that tests populate directly, behind a fake
resolver (test_broker_read_api, client/test_client_reader, client/test_retry_reader_backoff,
client/test_client_list_fragments).

``FakeResolver`` resolves every journal to one fixed answer and records what it was asked.
``WatchedIndex`` signals when a blocking read starts waiting (and when a bounded wait ran out),
so that tests need no sleeps. ``env`` serves a ReadAPI over a WatchedIndex with a ``file://``
store under a test's directory, for clients to read.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from broker.client.route_cache import ChannelPool, JournalClient
from broker.fragment import codecs, naming
from broker.fragment.codecs import CompressionCodec
from broker.fragment.index import FragmentIndex, QueryResult
from broker.fragment.spool import LocalFragment
from broker.fragment.spool_file import MemorySpoolFile
from broker.fragment.stores.registry import StoreRegistry, new_registry
from broker.fragments_api import FragmentsAPI
from broker.protocol import protocol_pb2 as pb
from broker.protocol import protocol_pb2_grpc as pb_grpc
from broker.read_api import ReadAPI

JOURNAL = "a/journal"
FILE_STORE = "file:///store/"
BROKER = pb.ProcessSpec.ID(zone="zone-a", suffix="broker-a")


# --- Fakes: a resolver and its replica -----------------------------------------------------------


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
    """Resolves every journal to one fixed answer, and records what it was asked. Without a
    replica, a request that may not be proxied is answered NOT_JOURNAL_BROKER. The spec is
    ``spec``, else one named after the journal with ``flags``."""

    replica: Replica | None
    header: pb.Header = field(default_factory=pb.Header)
    spec: pb.JournalSpec | None = None
    status: int = pb.OK
    flags: int = 0
    calls: list[dict[str, Any]] = field(default_factory=list)

    async def resolve(
        self,
        journal: str,
        *,
        require_primary: bool = False,
        may_proxy: bool = False,
        min_revision: int = 0,
        proxy_header: pb.Header | None = None,
    ) -> Resolution:
        self.calls.append(
            {"journal": journal, "may_proxy": may_proxy, "proxy_header": proxy_header}
        )
        status = self.status
        if status == pb.OK and self.replica is None and not may_proxy:
            status = pb.NOT_JOURNAL_BROKER
        spec = (
            self.spec if self.spec is not None else pb.JournalSpec(name=journal, flags=self.flags)
        )
        return Resolution(status, self.header, spec, self.replica, self.replica is not None)


class WatchedIndex(FragmentIndex):
    """Signals when a blocking read starts waiting (``waiting``), and when a wait bounded by a
    ``timeout_s`` ran out (``timed_out``), so tests need no sleeps."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        super().__init__(JOURNAL, clock=clock)
        self.waiting = asyncio.Event()
        self.timed_out = asyncio.Event()

    async def wait_for(self, offset: int, **kwargs: Any) -> QueryResult:
        query = {k: v for k, v in kwargs.items() if k != "timeout_s"}
        if not self.query(offset, **query).found:
            self.waiting.set()  # A reader is about to block.
        try:
            return await super().wait_for(offset, **kwargs)
        except TimeoutError:
            self.timed_out.set()
            raise


# --- Serving -------------------------------------------------------------------------------------


class Servicer(pb_grpc.JournalServicer):  # type: ignore[misc]
    """Only the read-side handlers: Read and ListFragments (each if given)."""

    def __init__(self, read: ReadAPI | None = None, fragments: FragmentsAPI | None = None) -> None:
        self.read_api = read
        self.fragments_api = fragments

    async def Read(self, request: pb.ReadRequest, context: Any) -> AsyncIterator[pb.ReadResponse]:
        assert self.read_api is not None
        async for response in self.read_api.read(request, context):
            yield response

    async def ListFragments(self, request: pb.FragmentsRequest, context: Any) -> Any:
        assert self.fragments_api is not None
        return await self.fragments_api.list_fragments(request, context)


@contextlib.asynccontextmanager
async def serving(servicer: pb_grpc.JournalServicer) -> AsyncIterator[str]:
    """Serve ``servicer`` on a loopback port: its ``http://`` endpoint."""
    server = grpc.aio.server()
    pb_grpc.add_JournalServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await server.stop(None)


def route_header(
    endpoint: str, process: pb.ProcessSpec.ID = BROKER, revision: int = 3
) -> pb.Header:
    """A header routing the journal to ``process`` alone, at ``endpoint``."""
    out = pb.Header(
        route=pb.Route(members=[process], primary=0, endpoints=[endpoint]),
        etcd=pb.Header.Etcd(cluster_id=1, revision=revision),
    )
    out.process_id.CopyFrom(process)
    return out


# --- Content -------------------------------------------------------------------------------------


def fragment_of(begin: int, content: bytes, codec: CompressionCodec) -> pb.Fragment:
    """The fragment of ``content`` at ``begin`` of the journal, named by its content."""
    return pb.Fragment(
        journal=JOURNAL,
        begin=begin,
        end=begin + len(content),
        sum=naming.content_sum(content),
        compression_codec=naming.pb_codec(codec),
    )


def commit(index: FragmentIndex, begin: int, content: bytes) -> MemorySpoolFile:
    """Index ``content`` at ``begin`` as a local (spooled) fragment: its file."""
    file = MemorySpoolFile()
    file.pwrite(content, 0)
    index.spool_commit(LocalFragment(fragment_of(begin, content, CompressionCodec.NONE), file))
    return file


# --- A served ReadAPI over a file:// store --------------------------------------------------------


@dataclass
class Env:
    resolver: FakeResolver
    registry: StoreRegistry
    client: JournalClient
    endpoint: str

    @property
    def index(self) -> WatchedIndex:
        assert self.resolver.replica is not None
        index = self.resolver.replica.index
        assert isinstance(index, WatchedIndex)
        return index


@contextlib.asynccontextmanager
async def env(tmp_path: Path, *, broker_chunk_bytes: int = 4) -> AsyncIterator[Env]:
    """A ReadAPI (content chunks of ``broker_chunk_bytes``) over a WatchedIndex, its store
    ``FILE_STORE`` under ``tmp_path``, served on loopback, and a client of it."""
    (tmp_path / "store").mkdir(exist_ok=True)
    registry = new_registry(file_root=tmp_path)
    resolver = FakeResolver(Replica(WatchedIndex()))
    channels = ChannelPool()
    api = ReadAPI(resolver, registry, channels, chunk_bytes_max=broker_chunk_bytes)
    async with serving(Servicer(api)) as endpoint:
        resolver.header = route_header(endpoint)
        client = JournalClient(endpoint)
        try:
            yield Env(resolver, registry, client, endpoint)
        finally:
            await client.close()
            await channels.close()


async def persist(e: Env, begin: int, content: bytes, codec: CompressionCodec) -> pb.Fragment:
    """Put ``content`` in the file:// store and index what the store lists."""
    fragment = fragment_of(begin, content, codec)
    store = e.registry.get(FILE_STORE)
    await store.put(fragment, codecs.compress(codec, content))
    listed = await store.list(JOURNAL)
    e.index.replace_remote(listed)
    return next(f for f in listed if f.begin == begin)
