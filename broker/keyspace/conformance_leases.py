"""Keyspace conformance checks of leases: grant, keep-alive, revoke, expiry (see conformance.py)."""

from __future__ import annotations

import asyncio
import contextlib

from broker.keyspace.backend import (
    Event,
    EventType,
    LeaseNotFoundError,
    prefix_end,
)
from broker.keyspace.conformance_kit import (
    Check as Check,
)
from broker.keyspace.conformance_kit import (
    ConformanceError,
    KeySpaceHarness,
    _aclose,
    _expect,
    _expect_raises,
    _only,
    _running,
    _scope,
)

# Lease TTL of the expiry check: etcd's minimum with default flags, so the check stays short.
lease_expiry_ttl_s = 2
# Upper bound on waiting for an expired lease's keys to be deleted (etcd revokes expired
# leases on a 500 ms tick, after the TTL).
lease_expiry_timeout_s = 15.0
# How often the expiry check refreshes the lease it keeps alive (well inside the TTL).
lease_refresh_interval_s = 0.5


async def check_leases(harness: KeySpaceHarness) -> None:
    """Grant, attach keys, refresh, detach by a plain put, revoke; gone leases are errors."""
    b = harness.backend
    p = _scope("leases")
    lease_id, ttl = await b.lease_grant(60)
    _expect(lease_id != 0 and ttl >= 60, f"grant(60) returned ({lease_id}, {ttl})")
    await b.put(p + b"/a", b"a", lease_id)
    await b.put(p + b"/b", b"b", lease_id)
    await b.put(p + b"/c", b"c")
    await b.put(p + b"/d", b"d", lease_id)
    await b.put(p + b"/d", b"d2")  # A put without the lease detaches the key from it.
    kv = await _only(b, p + b"/a")
    _expect(kv is not None and kv.lease == lease_id, f"leased key reads back as {kv}")

    refreshed = await b.lease_keepalive_once(lease_id)
    _expect(refreshed == ttl, f"keepalive returned TTL {refreshed}, granted {ttl}")

    await b.lease_revoke(lease_id)
    left = [kv.key for kv in (await b.range(p, prefix_end(p))).kvs]
    _expect(left == [p + b"/c", p + b"/d"], f"after revoking the lease, keys left: {left}")

    await _expect_raises(LeaseNotFoundError, "revoke of a revoked lease", b.lease_revoke(lease_id))
    await _expect_raises(
        LeaseNotFoundError, "keepalive of a revoked lease", b.lease_keepalive_once(lease_id)
    )
    await _expect_raises(
        LeaseNotFoundError, "put with a revoked lease", b.put(p + b"/e", b"e", lease_id)
    )
    _expect(await _only(b, p + b"/e") is None, "a failed put with a gone lease wrote the key")
    await b.delete(p, prefix_end(p))


async def check_lease_expiry(harness: KeySpaceHarness) -> None:
    """A lease left alone expires and its keys are deleted (with DELETE events); a lease that
    is refreshed outlives it."""
    b = harness.backend
    p = _scope("lease_expiry")
    kept, _ = await b.lease_grant(lease_expiry_ttl_s)
    lapsed, _ = await b.lease_grant(lease_expiry_ttl_s)
    try:
        await b.put(p + b"/kept", b"k", kept)
        h = await b.put(p + b"/lapsed", b"l", lapsed)

        async def refresh() -> None:
            while True:
                await asyncio.sleep(lease_refresh_interval_s)  # pacing, not synchronisation
                await b.lease_keepalive_once(kept)

        stream = b.watch(p + b"/lapsed", None, h.revision + 1)
        deletion: Event | None = None
        try:
            async with _running(refresh()), asyncio.timeout(lease_expiry_timeout_s):
                async for resp in stream:
                    deletion = resp.events[0]
                    break
        except TimeoutError:
            raise ConformanceError(
                f"lease with TTL {lease_expiry_ttl_s}s: its key was not deleted within "
                f"{lease_expiry_timeout_s}s"
            ) from None
        finally:
            await _aclose(stream)
        _expect(
            deletion is not None
            and deletion.type == EventType.DELETE
            and deletion.kv.key == p + b"/lapsed",
            f"first event after the lapsed lease's key was written: {deletion}",
        )
        _expect(await _only(b, p + b"/lapsed") is None, "expired lease's key is still there")
        kv = await _only(b, p + b"/kept")
        _expect(kv is not None and kv.lease == kept, "a refreshed lease expired with the other one")
        await _expect_raises(
            LeaseNotFoundError, "keepalive of an expired lease", b.lease_keepalive_once(lapsed)
        )
    finally:
        with contextlib.suppress(LeaseNotFoundError):
            await b.lease_revoke(kept)
        with contextlib.suppress(LeaseNotFoundError):
            await b.lease_revoke(lapsed)


# -- Watches and compaction ---------------------------------------------------------------------
