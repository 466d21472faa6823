"""JSONFileStore against a real in-process broker: the store conformance kit (commit and
restore, failed dependencies, pipelining, zombie fencing through the recovery log's `author`
register), and the document a restore reads back."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gazette_consumer.stores.base import FencedError, ShardContext, Store
from gazette_consumer.stores.conformance import SimpleShard, check_store, sample_checkpoint
from gazette_consumer.stores.jsonfile import STATE_FILE, JSONFileStore
from tests.gazette_consumer.stores.recorded_testkit import RecordedFactory, factory_on_a_broker


class JSONFileFactory(RecordedFactory):
    async def open(self, shard: ShardContext) -> Store:
        return JSONFileStore(self.client, await self.log_of(shard.fqn), self.directory())

    async def stage(self, store: Store, key: str, value: bytes) -> None:
        assert isinstance(store, JSONFileStore)
        store.state[key] = value.hex()

    async def read(self, store: Store, key: str) -> bytes | None:
        assert isinstance(store, JSONFileStore)
        value = store.state.get(key)
        return None if value is None else bytes.fromhex(value)


@pytest.fixture
async def factory(tmp_path: Path) -> AsyncIterator[JSONFileFactory]:
    async with factory_on_a_broker(JSONFileFactory, tmp_path) as made:
        yield made


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
