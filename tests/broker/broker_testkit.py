"""A cluster of real in-process brokers over loopback gRPC and one embedded keyspace.

Until the allocator exists, tests write assignments straight into the keyspace (each under its
member's lease, as the allocator will). Helpers append through the real gRPC Append RPC and read
what each replica holds from its fragment index (the spool's commits) and local files.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.duration_pb2 import Duration

from broker.client.route_cache import JournalClient
from broker.fragment import naming
from broker.fragment.stores.base import ListedObject, StoreURL
from broker.fragment.stores.file_store import FileStore
from broker.fragment.stores.registry import StoreRegistry
from broker.keyspace.backend import prefix_end
from broker.keyspace.embedded import EmbeddedBackend, EmbeddedStore
from broker.protocol import protocol_pb2 as pb
from broker.protocol import protocol_pb2_grpc as pbg
from broker.replica import Replica
from broker.server import Broker, BrokerConfig
from broker.topology import DEFAULT_ROOT, assignment_key, item_key

ROOT = DEFAULT_ROOT
# Brokers of tests stop fast: nothing in flight needs a grace period.
FAST_CONFIG = BrokerConfig(
    zone="", suffix="", memory_spools=True, stop_grace_s=0.0, shutdown_wait_s=2.0
)


def journal_spec(
    name: str,
    replication: int = 1,
    *,
    length: int = 1 << 20,
    codec: int = pb.NONE,
    stores: Sequence[str] = (),
    flags: int = 0,
    flush_interval_s: int = 0,
) -> pb.JournalSpec:
    return pb.JournalSpec(
        name=name,
        replication=replication,
        fragment=pb.JournalSpec.Fragment(
            length=length,
            compression_codec=codec,  # type: ignore[arg-type]
            stores=list(stores),
            refresh_interval=Duration(seconds=1),
            flush_interval=Duration(seconds=flush_interval_s),
        ),
        flags=flags,
    )


class GatedListing(FileStore):
    """The file:// fragment store, whose listings wait until `opened` is set: a broker
    started meanwhile has not listed its store yet (a slow or distant store)."""

    def __init__(self, url: StoreURL, root: Path, opened: asyncio.Event) -> None:
        super().__init__(url, root=root)
        self._opened = opened

    async def _list(self, prefix: str) -> list[ListedObject]:
        await self._opened.wait()
        return await super()._list(prefix)


async def put_fragment(
    registry: StoreRegistry, store_url: str, journal: str, begin: int, content: bytes
) -> pb.Fragment:
    """Put `content` in the store at `store_url` as `journal`'s fragment from `begin`
    (uncompressed), as a broker persists one; the fragment."""
    fragment = pb.Fragment(
        journal=journal,
        begin=begin,
        end=begin + len(content),
        sum=naming.content_sum(content),
        compression_codec=pb.NONE,
        backing_store=store_url,
    )
    await registry.get(store_url).put(fragment, content)
    return fragment


@dataclass
class Cluster:
    store: EmbeddedStore = field(default_factory=EmbeddedStore)
    brokers: list[Broker] = field(default_factory=list)
    stores: StoreRegistry | None = None
    _admin: EmbeddedBackend | None = None

    @property
    def admin(self) -> EmbeddedBackend:
        if self._admin is None:
            self._admin = self.store.connect()
        return self._admin

    async def start_broker(
        self, zone: str, suffix: str, *, clock: Callable[[], float] = time.time, **overrides: Any
    ) -> Broker:
        config = replace(FAST_CONFIG, zone=zone, suffix=suffix, **overrides)
        broker = Broker(self.store.connect(), config, stores=self.stores, clock=clock)
        await broker.start()
        self.brokers.append(broker)
        return broker

    async def stop_broker(self, broker: Broker) -> None:
        self.brokers.remove(broker)
        await broker.stop()
        await broker.backend.close()

    async def put_spec(self, spec: pb.JournalSpec) -> int:
        header = await self.admin.put(item_key(ROOT, spec.name).encode(), spec.SerializeToString())
        return header.revision

    async def assign(
        self, journal: str, members: Sequence[Broker], *, value: pb.Route | None = None
    ) -> int:
        """Assign ``journal`` to exactly ``members`` (the first is the primary), each key under
        its member's lease, as the allocator would: assignments that stay are left untouched,
        others are removed or added. Waits until every broker sees the result."""
        prefix = f"{ROOT}/assign/{journal}#".encode()
        existing = {kv.key for kv in (await self.admin.range(prefix, prefix_end(prefix))).kvs}
        wanted = {
            assignment_key(ROOT, journal, b.config.zone, b.config.suffix, slot).encode(): b
            for slot, b in enumerate(members)
        }
        revision = self.admin.store.core.revision
        for key in sorted(existing - set(wanted)):
            header, _ = await self.admin.delete(key)
            revision = header.revision
        raw = value.SerializeToString() if value is not None else b""
        for key, broker in wanted.items():
            if key not in existing:
                header = await self.admin.put(key, raw, lease=broker.lease_id)
                revision = header.revision
        await self.sync(revision)
        return revision

    async def sync(self, revision: int) -> None:
        for broker in self.brokers:
            await broker.ks.wait_for_revision(revision, 5.0)

    async def create(
        self, spec: pb.JournalSpec, members: Sequence[Broker]
    ) -> tuple[pb.JournalSpec, int]:
        await self.put_spec(spec)
        revision = await self.assign(spec.name, members)
        return spec, revision

    def stub(self, broker: Broker) -> pbg.JournalStub:
        return broker.dialer.stub(broker.endpoint)

    async def append(
        self,
        broker: Broker,
        journal: str,
        chunks: Sequence[bytes],
        *,
        commit: bool = True,
        **first: Any,
    ) -> pb.AppendResponse:
        """One Append RPC through ``broker``: the first message (journal and ``first``
        fields), one message per chunk, then (if ``commit``) the empty commit marker."""
        call = self.stub(broker).Append()
        messages = [pb.AppendRequest(journal=journal, **first)]
        messages += [pb.AppendRequest(content=chunk) for chunk in chunks]
        if commit:
            messages.append(pb.AppendRequest())
        try:
            for message in messages:
                await call.write(message)
            await call.done_writing()
        except grpc.aio.AioRpcError:
            pass  # The broker answered early (e.g. a failed precondition): read its answer.
        resp: pb.AppendResponse = await call
        return resp

    async def close(self) -> None:
        for broker in list(self.brokers):
            await self.stop_broker(broker)
        if self._admin is not None:
            await self._admin.close()


def header_of_another_cluster(header: pb.Header) -> pb.Header:
    """A copy of `header` as a broker of another etcd cluster would send it (a proxied request
    no broker of ours may serve)."""
    foreign = pb.Header()
    foreign.CopyFrom(header)
    foreign.etcd.cluster_id += 1
    return foreign


def replica_of(broker: Broker, journal: str) -> Replica:
    replica = broker.resolver.replicas.get(journal)
    if replica is None:
        raise AssertionError(f"{broker!r} has no replica of {journal}")
    return replica


def local_content(broker: Broker, journal: str) -> tuple[int, bytes]:
    """(begin offset, bytes) of the contiguous content this broker holds locally: its
    fragment index's local fragments, read from their spool files."""
    index = replica_of(broker, journal).index
    begin: int | None = None
    out = bytearray()
    for entry in index.local_fragments():
        if entry.file is None or entry.end == entry.begin:
            continue
        if begin is None:
            begin = entry.begin
        elif entry.begin != begin + len(out):
            raise AssertionError(f"hole before [{entry.begin}, {entry.end}) in {index!r}")
        out += entry.file.pread(entry.end - entry.begin, 0)
    return (begin or 0), bytes(out)


async def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Wait, boundedly, for a condition that a background daemon brings about and that offers
    no event to await (e.g. the persister's upload reaching the index), checking it on every
    turn of the event loop."""
    async with asyncio.timeout(timeout_s):
        while not predicate():  # noqa: ASYNC110 -- no event exists for these conditions.
            await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def one_broker_with(journals: Sequence[str]) -> AsyncIterator[tuple[Cluster, JournalClient]]:
    """A cluster of one broker serving ``journals`` (R=1), and a client of it; both closed on
    exit."""
    cluster = Cluster()
    client: JournalClient | None = None
    try:
        broker = await cluster.start_broker("zone-a", "broker-a")
        for journal in journals:
            await cluster.create(journal_spec(journal), [broker])
        client = JournalClient(broker.endpoint)
        yield cluster, client
    finally:
        if client is not None:
            await client.close()
        await cluster.close()


def content_from_start(cluster: Cluster, journal: str) -> bytes:
    """The first broker's local content of ``journal``, which must begin at offset 0."""
    begin, data = local_content(cluster.brokers[0], journal)
    assert begin == 0
    return data
