"""JSONFileStore against a real in-process broker: the store conformance kit (commit and
restore, failed dependencies, pipelining, zombie fencing through the recovery log's `author`
register), and the document a restore reads back."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.client.route_cache import JournalClient
from gazette_consumer.stores.base import FencedError, ShardContext, Store
from gazette_consumer.stores.conformance import SimpleShard, check_store, sample_checkpoint
from gazette_consumer.stores.jsonfile import STATE_FILE, JSONFileStore
from tests.broker.broker_testkit import Cluster, journal_spec


class JSONFileFactory:
    """Stores of one recovery log per shard; each instance plays into a directory of its own."""

    stages_while_committing = True

    def __init__(self, cluster: Cluster, client: JournalClient, root: Path) -> None:
        self.cluster, self.client, self.root = cluster, client, root
        self.logs: dict[str, str] = {}
        self._dirs = itertools.count()

    async def log_of(self, fqn: str) -> str:
        if fqn not in self.logs:
            name = f"recovery/{len(self.logs)}"
            await self.cluster.create(journal_spec(name), self.cluster.brokers)
            self.logs[fqn] = name
        return self.logs[fqn]

    async def open(self, shard: ShardContext) -> Store:
        directory = self.root / f"instance-{next(self._dirs)}"
        return JSONFileStore(self.client, await self.log_of(shard.fqn), directory)

    async def stage(self, store: Store, key: str, value: bytes) -> None:
        assert isinstance(store, JSONFileStore)
        store.state[key] = value.hex()

    async def read(self, store: Store, key: str) -> bytes | None:
        assert isinstance(store, JSONFileStore)
        value = store.state.get(key)
        return None if value is None else bytes.fromhex(value)


@pytest.fixture
async def factory(tmp_path: Path) -> AsyncIterator[JSONFileFactory]:
    cluster = Cluster()
    broker = await cluster.start_broker("zone-a", "broker-a")
    client = JournalClient(broker.endpoint)
    try:
        yield JSONFileFactory(cluster, client, tmp_path)
    finally:
        await client.close()
        await cluster.close()


async def test_jsonfile_store_conformance(factory: JSONFileFactory) -> None:
    await check_store(factory)


async def test_restore_reads_the_recorded_document(factory: JSONFileFactory) -> None:
    shard = SimpleShard(fqn="test/items/document")
    first = await factory.open(shard)
    assert isinstance(first, JSONFileStore)
    await first.restore_checkpoint(shard)
    first.state["nested"] = {"list": [1, 2, 3], "text": "ü"}
    await (await first.start_commit(shard, sample_checkpoint(1), []))
    hints = await first.build_hints()
    await first.destroy()

    # A new primary with hints: the document comes back from the log, not the old directory.
    second = JSONFileStore(
        factory.client, factory.logs[shard.fqn], factory.root / "second", hints=hints
    )
    checkpoint = await second.restore_checkpoint(shard)
    assert checkpoint == sample_checkpoint(1)
    assert second.state == {"nested": {"list": [1, 2, 3], "text": "ü"}}
    on_disk = json.loads((factory.root / "second" / STATE_FILE).read_bytes())
    assert on_disk["state"] == second.state
    await second.destroy()


async def test_zombie_commit_fails_fenced(factory: JSONFileFactory) -> None:
    shard = SimpleShard(fqn="test/items/zombie")
    old, new = await factory.open(shard), await factory.open(shard)
    assert isinstance(old, JSONFileStore) and isinstance(new, JSONFileStore)
    await old.restore_checkpoint(shard)
    await new.restore_checkpoint(shard)
    old.state["k"] = "zombie"
    with pytest.raises(FencedError):
        await (await old.start_commit(shard, sample_checkpoint(1), []))
    await old.destroy()
    await new.destroy()
