"""A broker's and a consumer member's lease is refreshed through their whole start.

Each grants a lease, announces its member key under it, loads its keyspace mirror, and only then
runs the task group that serves. The refresh loop used to run during the announcement and again
from the task group on, each assuming a lease refreshed just then; a mirror's load in between
(seconds, for a large keyspace or a slow etcd) went unrefreshed, and a load longer than the
lease's TTL lost the lease: the start failed (the member key gone from the mirror), or the
process served and then died of a lost lease. Here the keyspace's first load of the root is
slowed to several TTLs, as a slow etcd would answer it; the process must start, hold its key
under its lease afterwards, and serve."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
from broker_testkit import FAST_CONFIG, ROOT

from broker.keyspace.backend import RangeResponse
from broker.keyspace.embedded import EmbeddedBackend, EmbeddedStore
from broker.server import Broker
from broker.topology import member_key
from gazette_consumer.member import ConsumerConfig, ConsumerMember
from gazette_consumer.shard_handle import ShardHandle, ShardStart

ttl_s = 1
# The slow load: several TTLs, so that an unrefreshed lease certainly expires during it.
load_delay_s = 3.5 * ttl_s


class SlowLoadBackend(EmbeddedBackend):
    """An embedded-store client whose first range of `root` (a keyspace mirror's load) answers
    `delay_s` late, as a slow etcd would."""

    def __init__(self, store: EmbeddedStore, root: bytes, delay_s: float) -> None:
        super().__init__(store)
        self.root, self.delay_s = root, delay_s
        self.slowed = 0

    async def range(
        self,
        key: bytes,
        range_end: bytes | None = None,
        revision: int = 0,
        *,
        min_mod_revision: int = 0,
    ) -> RangeResponse:
        if key == self.root and not self.slowed:
            self.slowed += 1
            await asyncio.sleep(self.delay_s)  # The fault injected: etcd answering late.
        return await super().range(key, range_end, revision, min_mod_revision=min_mod_revision)


@pytest.fixture
async def store() -> AsyncIterator[EmbeddedStore]:
    store = EmbeddedStore()
    yield store
    await store.close()


async def _held(store: EmbeddedStore, key: bytes, lease: int) -> bool:
    kvs = (await store.connect().range(key)).kvs
    return len(kvs) == 1 and kvs[0].lease == lease


async def test_a_broker_keeps_its_lease_through_a_slow_keyspace_load(store: EmbeddedStore) -> None:
    backend = SlowLoadBackend(store, ROOT.encode(), load_delay_s)
    config = replace(FAST_CONFIG, zone="zone-a", suffix="slow-load", lease_ttl_s=ttl_s)
    broker = Broker(backend, config)
    await broker.start()
    try:
        assert backend.slowed == 1
        assert broker.is_ready()
        key = member_key(ROOT, "zone-a", "slow-load").encode()
        assert await _held(store, key, broker.lease_id)
        # Serving goes on refreshing it: still held two TTLs later (the run's own loop).
        await asyncio.sleep(2 * ttl_s)  # Waiting out TTLs is the point: no event to wait on.
        assert broker.is_ready() and await _held(store, key, broker.lease_id)
    finally:
        await broker.stop()


async def test_a_consumer_member_keeps_its_lease_through_a_slow_keyspace_load(
    store: EmbeddedStore,
) -> None:
    root = "/gazette/consumers/slow"
    backend = SlowLoadBackend(store, root.encode(), load_delay_s)

    def no_shards(start: ShardStart) -> ShardHandle:
        raise AssertionError(f"no shard exists to start: {start}")

    config = ConsumerConfig(
        zone="zone-a", suffix="slow-load", root=root, lease_ttl_s=ttl_s, stop_grace_s=0.0
    )
    member = ConsumerMember(backend, config, no_shards)
    await member.start()
    try:
        assert backend.slowed == 1
        assert member.is_ready()
        key = member_key(root, "zone-a", "slow-load").encode()
        assert await _held(store, key, member.lease_id)
    finally:
        await member.stop()
