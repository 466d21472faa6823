"""Announcing a member: put its key under its lease, once no earlier instance holds it.

A process restarted with the same zone and ID (after a crash, say) finds its predecessor's
member key still in place until that lease expires, and with it the predecessor's assignments,
whose keys name the same member. Overwriting the key would make those assignments look like
its own: the new process would start serving them at once, only to stop when the old lease
expires and the allocator re-assigns them a moment later (for a consumer shard, a recovery and
a fence for nothing). So, as Gazette's allocator does, the announcement is a transaction that
puts the key only if it does not exist, and otherwise waits, on a watch, for it to be deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Final

from broker.keyspace.backend import (
    Backend,
    Compare,
    CompareResult,
    CompareTarget,
    EventType,
    OpGet,
    OpPut,
)
from broker.keyspace.lease import keep_lease_alive
from broker.logging import get_logger

log = get_logger(__name__)

# Longest an announcement waits for a predecessor's key to go (its lease TTL, normally).
announce_wait_s_max: Final = 300.0


class AnnounceTimeoutError(TimeoutError):
    """Another lease kept the member key past the wait: likely a live process with this ID."""


async def announce(
    backend: Backend,
    key: bytes,
    value: bytes,
    lease: int,
    ttl_s: float,
    *,
    wait_s: float = announce_wait_s_max,
    keepalive: asyncio.Future[Any] | None = None,
) -> int:
    """Put ``key`` = ``value`` under ``lease`` (granted just now with ``ttl_s``) once the key is
    absent, keeping the lease alive meanwhile; returns the revision of the put. Raises
    AnnounceTimeoutError if another lease holds the key for ``wait_s``. ``keepalive``: the
    lease's refresh loop, started by the caller at the grant and left running (otherwise one
    is run for the announcement only)."""
    if keepalive is not None:
        return await _announce(backend, key, value, lease, wait_s, keepalive)
    own = asyncio.ensure_future(keep_lease_alive(backend, lease, ttl_s))
    try:
        return await _announce(backend, key, value, lease, wait_s, own)
    finally:
        own.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await own


async def _announce(
    backend: Backend,
    key: bytes,
    value: bytes,
    lease: int,
    wait_s: float,
    keepalive: asyncio.Future[Any],
) -> int:
    try:
        async with asyncio.timeout(wait_s):
            while True:
                resp = await backend.txn(
                    [Compare(key, CompareTarget.CREATE, CompareResult.EQUAL, 0)],
                    [OpPut(key, value, lease)],
                    [OpGet(key)],
                )
                if resp.succeeded:
                    return resp.header.revision
                held = resp.results[0] if resp.results else ()
                if isinstance(held, tuple) and held and held[0].lease == lease:
                    # Ours already (a retried announcement): refresh the value.
                    return (await backend.put(key, value, lease)).revision
                log.info(
                    "member key held by an earlier instance; waiting for its lease to expire",
                    key=key.decode(errors="replace"),
                    lease=held[0].lease if isinstance(held, tuple) and held else None,
                )
                deleted = asyncio.ensure_future(_deleted(backend, key, resp.header.revision))
                try:
                    # Our own lease failing (etcd lost it) ends the wait with its error.
                    await asyncio.wait([deleted, keepalive], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    deleted.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await deleted
                if keepalive.done():
                    keepalive.result()
    except TimeoutError:
        raise AnnounceTimeoutError(
            f"member key {key.decode(errors='replace')} is still held by another lease after "
            f"{wait_s:g}s: is another process running with this zone and ID?"
        ) from None


async def _deleted(backend: Backend, key: bytes, revision: int) -> None:
    """Return once ``key`` is deleted after ``revision``."""
    watch = backend.watch(key, start_revision=revision + 1)
    try:
        async for resp in watch:
            if any(e.type is EventType.DELETE for e in resp.events):
                return
    finally:
        aclose = getattr(watch, "aclose", None)
        if aclose is not None:
            await aclose()
