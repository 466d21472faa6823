"""A KeySpace mirror over a real etcd whose watch is catching up (etcd "unsynced" watcher).
Two things there claimed revisions the mirror did not reflect: each response of the catch-up
carries the store's current revision in its header, with later batches still to come; and
etcd before 3.4.25 / 3.5.8 (Debian's 3.4.23 among them, etcd issue #15220) answers a requested
progress notification with its current revision while the events of the catch-up are still to
be sent. The mirror must reflect every key of the revision it claims when a waiter returns
(either alone fails this test: checked by reverting each).

How the state is made: the mirror loads the prefix at an old revision and watches from there,
with thousands of revisions to replay; etcd replays an unsynced watcher's history in batches
(about 1,000 revisions every 100 ms), so the catch-up outlasts the waiter's first progress
request (after 0.1 s behind). On Debian's etcd this is deterministic: the old mirror returned
from the wait with only the first batch or none."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator

import pytest

from broker.keyspace.backend import prefix_end
from broker.keyspace.etcd import EtcdBackend
from broker.keyspace.keyspace import KeySpace
from broker.testing.etcd_server import EtcdServer

pytestmark = pytest.mark.etcd

wait_s = 30.0
ROOT = b"/progress-ahead"
# Revisions written after the mirror's load: several of etcd's catch-up batches.
writes = 4000
# Puts in flight at once while writing them.
writes_in_flight = 64


@pytest.fixture
async def backend() -> AsyncIterator[EtcdBackend]:
    if shutil.which("etcd") is None:
        pytest.skip("etcd not installed: run `make system-deps`")
    async with EtcdServer() as server:
        be = EtcdBackend([server.endpoint], dial_timeout_s=5, request_timeout_s=5)
        try:
            yield be
        finally:
            await be.close()


async def _put_all(backend: EtcdBackend, keys: list[bytes]) -> None:
    for start in range(0, len(keys), writes_in_flight):
        batch = keys[start : start + writes_in_flight]
        await asyncio.gather(*(backend.put(k, b"v") for k in batch))


@pytest.mark.parametrize("deletions", [False, True], ids=["puts", "puts-and-deletes"])
async def test_a_catching_up_mirror_claims_only_revisions_it_reflects(
    backend: EtcdBackend, deletions: bool
) -> None:
    keys = [ROOT + f"/k{i:05d}".encode() for i in range(writes)]
    await _put_all(backend, keys[:10])
    base = (await backend.range(ROOT, prefix_end(ROOT))).header.revision
    await _put_all(backend, keys[10:])
    if deletions:  # Keys the mirror had at its load, deleted during the catch-up.
        for key in keys[:5]:
            await backend.delete(key)
    last = (await backend.range(ROOT, prefix_end(ROOT))).header.revision
    want = [kv.key for kv in (await backend.range(ROOT, prefix_end(ROOT), last)).kvs]

    ks: KeySpace[bytes] = KeySpace(ROOT, lambda kv: kv.value)
    await ks.load(backend, base)
    assert len(ks.kvs) == 10
    watching = asyncio.create_task(ks.watch(backend))
    try:
        await ks.wait_for_revision(last, wait_s)
        # Whatever told the mirror it reached `last`, it holds every key there is at `last`.
        assert [e.kv.key for e in ks.kvs] == want
        # The catch-up's late events change nothing; a later write is applied.
        after = await backend.put(ROOT + b"/after", b"v")
        await ks.wait_for_revision(after.revision, wait_s)
        assert [e.kv.key for e in ks.kvs] == sorted([*want, ROOT + b"/after"])
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
