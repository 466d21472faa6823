"""The consumer resolver: which process serves a shard, and the local replica if it is this one.

Every Shard RPC about one shard, and every query an application routes to a shard, starts by
resolving it against the member's KeySpace mirror: the spec, the Route implied by the
assignments (with endpoints), the header to answer with (the resolved process, the route, the
etcd revision), and the status (Gazette's rules):

* SHARD_NOT_FOUND: no ShardSpec of that ID;
* NO_SHARD_PRIMARY: no slot-0 assignment right now (the allocator is mid hand-off);
* NOT_SHARD_PRIMARY: the primary is another process and the caller may not be proxied (the
  request was already proxied to us once, or the caller asked for a local answer);
* OK: the primary is this process, or another one the caller may be proxied to.

A non-OK resolution names this process in its header (we authored the answer). A request that a
peer proxied to us carries the peer's header: it must come from our etcd cluster and be meant
for us, and we first catch up with the revision the peer resolved at, so that two processes
never bounce a request between two views of the assignments.

When the primary is this process, ``resolve`` also waits, boundedly, until the replica serves
(its status is PRIMARY) and has read through the requested offsets of its sources in a
completed transaction ("read your own writes" through a consumer). If the replica stops or
fails meanwhile, the answer is SHARD_STOPPED. Applications map their own keys to shards with
``shards_with_source`` (journal → the shards reading it) and then resolve the shard.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

from broker.keyspace.keyspace import KeySpace
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import protocol_pb2 as pb
from broker.topology import etcd_header, format_id, same_id
from gazette_consumer.local_shards import LocalShards, LocalShardsStoppedError
from gazette_consumer.shard_handle import ShardHandle
from gazette_consumer.topology import (
    FAILED,
    PRIMARY,
    Decoded,
    ShardItem,
    lookup_member,
    lookup_shard,
    shard_route,
    shards_with_source,
)

# How long a request may wait for the local mirror to reach a revision a peer has already seen.
revision_wait_s_default = 10.0
# Longest a Stat may wait for the primary to become ready and to read through the requested
# offsets. Callers usually bound it with a shorter gRPC deadline; this bounds those who do not.
read_through_wait_s_max = 300.0

# Stands in for this process's ID while its member key is absent (before it is announced, or
# after its lease is gone): it matches no route member, so nothing resolves locally.
_MISSING_ID = pb.ProcessSpec.ID(zone="local-ConsumerSpec", suffix="missing-from-Etcd")


class ResolveError(Exception):
    """A request that cannot be resolved at all: a proxied request from another etcd cluster,
    or meant for another process."""


@dataclass
class Resolution:
    status: cpb.Status
    header: pb.Header
    spec: cpb.ShardSpec | None
    # The local primary, when it is this process (status OK).
    handle: ShardHandle | None

    @property
    def is_local(self) -> bool:
        return self.handle is not None


class Resolver:
    """Resolves shards against ``ks`` for the process ``local_id`` whose replicas are
    ``local``. Use from the member's event loop."""

    def __init__(
        self,
        ks: KeySpace[Decoded],
        root: str,
        local_id: pb.ProcessSpec.ID,
        local: LocalShards,
        *,
        revision_wait_s: float = revision_wait_s_default,
    ) -> None:
        self.ks = ks
        self.root = root
        self._local_id = local_id
        self._local = local
        self._revision_wait_s = revision_wait_s

    def local_id(self) -> pb.ProcessSpec.ID:
        member = lookup_member(self.ks, self.root, self._local_id.zone, self._local_id.suffix)
        return self._local_id if member is not None else _MISSING_ID

    def shards_with_source(self, journal: str) -> list[cpb.ShardSpec]:
        """Specs of the shards reading ``journal``, in shard ID order."""
        return shards_with_source(self.ks, self.root, journal)

    async def resolve(
        self,
        shard: str,
        *,
        may_proxy: bool,
        proxy_header: pb.Header | None = None,
        read_through: Mapping[str, int] | None = None,
        wait_s: float = read_through_wait_s_max,
    ) -> Resolution:
        """Resolve ``shard`` (see the module docstring). Raises ResolveError for a misdirected
        proxied request, LocalShardsStoppedError if the shard is local but this process has
        stopped serving, and TimeoutError if a wait exceeds its bound."""
        local_id = self.local_id()
        if proxy_header is not None:
            self._check_proxy_header(proxy_header, local_id)
            if proxy_header.etcd.revision > self.ks.header.revision:
                await self.ks.wait_for_revision(proxy_header.etcd.revision, self._revision_wait_s)
                local_id = self.local_id()

        # Everything until the first await below reads the mirror at one revision.
        entry = lookup_shard(self.ks, self.root, shard)
        spec = (
            entry.decoded.spec
            if entry is not None and isinstance(entry.decoded, ShardItem)
            else None
        )
        route, _ = shard_route(self.ks, self.root, shard)
        header = pb.Header(route=route, etcd=etcd_header(self.ks.header))
        if route.primary != -1:
            header.process_id.CopyFrom(route.members[route.primary])

        status: cpb.Status
        if spec is None:
            status = cpb.SHARD_NOT_FOUND
        elif route.primary == -1:
            status = cpb.NO_SHARD_PRIMARY
        elif not may_proxy and not same_id(header.process_id, local_id):
            status = cpb.NOT_SHARD_PRIMARY
        else:
            status = cpb.OK
        if status != cpb.OK:
            header.process_id.CopyFrom(local_id)  # We author the error.
            return Resolution(status, header, spec, None)
        if not same_id(header.process_id, local_id):
            return Resolution(status, header, spec, None)  # The caller proxies.

        handle = self._local.handle(shard)
        if handle is None:
            # The mirror shows our assignment, but its replica already stopped: only while
            # this process is stopping.
            raise LocalShardsStoppedError(f"shard {shard}: local replica not running")
        assert spec is not None
        wanted = _source_offsets(spec, read_through or {})
        async with asyncio.timeout(wait_s):
            ready = await self._wait_ready(shard, handle, wanted)
        if not ready:
            return Resolution(cpb.SHARD_STOPPED, header, spec, None)
        return Resolution(cpb.OK, header, spec, handle)

    async def _wait_ready(self, shard: str, handle: ShardHandle, wanted: Mapping[str, int]) -> bool:
        """Wait until ``handle`` serves as primary and has read through ``wanted``; False if it
        stops or fails first."""
        while True:
            changed = self._local.changed(shard)
            try:
                current = self._local.handle(shard)
            except LocalShardsStoppedError:
                return False
            if current is not handle or changed is None:
                return False  # Stopped (and perhaps replaced by a new assignment).
            code = handle.status().code
            if code == FAILED:
                return False
            if code == PRIMARY and _read_through(handle, wanted):
                return True
            await changed.wait()

    def _check_proxy_header(self, header: pb.Header, local_id: pb.ProcessSpec.ID) -> None:
        if header.etcd.cluster_id != self.ks.header.cluster_id:
            raise ResolveError(
                f"proxied request's etcd cluster ID {header.etcd.cluster_id} is not ours "
                f"({self.ks.header.cluster_id})"
            )
        if not same_id(header.process_id, local_id):
            raise ResolveError(
                f"proxied request is for {format_id(header.process_id)}, not us "
                f"({format_id(local_id)})"
            )


def _source_offsets(spec: cpb.ShardSpec, read_through: Mapping[str, int]) -> dict[str, int]:
    """The requested offsets of journals the shard reads (others are not its to wait for)."""
    sources = {source.journal for source in spec.sources}
    return {j: offset for j, offset in read_through.items() if j in sources and offset > 0}


def _read_through(handle: ShardHandle, wanted: Mapping[str, int]) -> bool:
    if not wanted:
        return True
    progress = handle.progress().read_through
    return all(progress.get(journal, 0) >= offset for journal, offset in wanted.items())
