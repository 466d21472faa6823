"""The embedded keyspace's identity in response headers: a non-zero cluster ID, member ID and raft
term, as etcd's, which Gazette's Header.Validate (run by Go clients on every response) requires.

Every header of every response carries them (range, put, delete, txn, watches); they
are stable for the store's life and, for a store persisted under a directory, across restarts
(the raft term grows at each open, as a restarted one-member etcd's does)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker.keyspace.backend import Header, OpPut
from broker.keyspace.embedded import EmbeddedBackend, EmbeddedStore
from broker.keyspace.persisted import IDENTITY_FILE
from broker.keyspace.wal import CorruptLogError

wait_s = 5.0


async def every_header(client: EmbeddedBackend) -> list[Header]:
    """A header of each kind of response the backend gives."""
    watch = client.watch(b"/h/", b"/h0", 1)
    headers = [await client.put(b"/h/a", b"1")]
    headers.append((await client.range(b"/h/", b"/h0")).header)
    headers.append((await client.txn([], [OpPut(b"/h/b", b"2")])).header)
    headers.append((await client.delete(b"/h/b"))[0])
    async with asyncio.timeout(wait_s):
        headers.append((await anext(watch)).header)
    await watch.aclose()
    return headers


def identity(header: Header) -> tuple[int, int, int]:
    return header.cluster_id, header.member_id, header.raft_term


async def test_every_header_names_the_cluster_member_and_term() -> None:
    store = EmbeddedStore()
    first, second = store.connect(), store.connect()
    try:
        headers = await every_header(first) + await every_header(second)
    finally:
        await store.close()
    ids = {identity(h) for h in headers}
    assert len(ids) == 1, ids  # One store: one identity, whichever client asks.
    ((cluster_id, member_id, raft_term),) = ids
    assert cluster_id != 0 and member_id != 0 and raft_term >= 1
    assert all(h.revision > 0 for h in headers)


async def test_stores_are_told_apart() -> None:
    a, b = EmbeddedStore(), EmbeddedStore()
    try:
        ha = await a.connect().put(b"/k", b"v")
        hb = await b.connect().put(b"/k", b"v")
    finally:
        await a.close()
        await b.close()
    assert ha.cluster_id != hb.cluster_id


async def test_a_persisted_store_keeps_its_identity_across_restarts(tmp_path: Path) -> None:
    store = EmbeddedStore.open(tmp_path)
    before = await store.connect().put(b"/k", b"v")
    await store.close()
    assert (tmp_path / IDENTITY_FILE).exists()

    store = EmbeddedStore.open(tmp_path)
    try:
        after = (await store.connect().range(b"/k")).header
    finally:
        await store.close()
    assert (after.cluster_id, after.member_id) == (before.cluster_id, before.member_id)
    assert after.cluster_id != 0 and after.member_id != 0
    assert after.raft_term > before.raft_term >= 1


async def test_a_damaged_identity_is_refused(tmp_path: Path) -> None:
    store = EmbeddedStore.open(tmp_path)
    await store.close()
    path = tmp_path / IDENTITY_FILE
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptLogError, match=IDENTITY_FILE):
        EmbeddedStore.open(tmp_path)
