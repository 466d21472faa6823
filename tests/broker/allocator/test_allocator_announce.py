"""Announcing a member waits for a predecessor's key (same ID, older lease) to go."""

from __future__ import annotations

import asyncio

import pytest

from broker.allocator.announce import AnnounceTimeoutError, announce
from broker.keyspace.embedded import EmbeddedBackend

KEY = b"/root/members/zone-a#member-1"


async def test_a_free_key_is_put_at_once_under_the_lease() -> None:
    backend = EmbeddedBackend()
    lease, ttl = await backend.lease_grant(10)
    revision = await announce(backend, KEY, b"spec", lease, ttl)
    (kv,) = (await backend.range(KEY)).kvs
    assert (kv.value, kv.lease, kv.create_revision) == (b"spec", lease, revision)
    # Announcing again under the same lease (a retry) refreshes the value.
    await announce(backend, KEY, b"spec-2", lease, ttl)
    (kv,) = (await backend.range(KEY)).kvs
    assert (kv.value, kv.lease) == (b"spec-2", lease)


async def test_a_predecessors_key_is_waited_out_not_overwritten() -> None:
    backend = EmbeddedBackend()
    old, _ = await backend.lease_grant(10)
    await backend.put(KEY, b"old", old)
    await backend.put(b"/root/assign/item#zone-a#member-1#0", b"", old)
    new, ttl = await backend.lease_grant(10)
    announcing = asyncio.ensure_future(announce(backend, KEY, b"new", new, ttl))
    # Round trips through the backend: the announcement has had every chance to overwrite.
    for _ in range(5):
        (kv,) = (await backend.range(KEY)).kvs
        assert (kv.value, kv.lease) == (b"old", old)
    assert not announcing.done()
    # The predecessor's lease ends: its key and assignments go, then ours is put.
    await backend.lease_revoke(old)
    revoked_at = (await backend.range(KEY)).header.revision
    revision = await asyncio.wait_for(announcing, 10)
    (kv,) = (await backend.range(KEY)).kvs
    assert (kv.value, kv.lease) == (b"new", new)
    assert kv.create_revision == revision > revoked_at
    assert not (await backend.range(b"/root/assign/item#zone-a#member-1#0")).kvs


async def test_a_key_that_never_goes_times_out_with_a_clear_error() -> None:
    backend = EmbeddedBackend()
    await backend.put(KEY, b"other", 0)  # No lease: it never expires.
    lease, ttl = await backend.lease_grant(10)
    with pytest.raises(AnnounceTimeoutError, match="another process running with this zone and ID"):
        await announce(backend, KEY, b"new", lease, ttl, wait_s=0.2)
    (kv,) = (await backend.range(KEY)).kvs
    assert kv.value == b"other"
