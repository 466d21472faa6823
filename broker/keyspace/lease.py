"""Keeping a lease alive, over any Backend.

Brokers and consumers announce themselves with keys under a lease; if they stop refreshing it,
the keys vanish and the allocator moves their work elsewhere. That makes the refresh loop's
failure mode important: it must keep trying through short outages, but never pretend the lease
is still held once it must have expired, because the process would go on acting as a member
that everyone else has already written off.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import NoReturn

from broker.keyspace.backend import Backend, UnavailableError

# Refresh this many times per TTL: one lost refresh (or two) still leaves the lease alive.
refreshes_per_ttl = 3
# While the backend is unreachable, retry this often (or faster, for very short TTLs).
unavailable_retry_interval_s = 0.5


async def keep_lease_alive(
    backend: Backend,
    lease_id: int,
    ttl_s: float,
    *,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> NoReturn:
    """Refresh ``lease_id`` every TTL/3 until cancelled.

    ``ttl_s`` is the TTL the lease was granted (or last refreshed) with, just now. Raises
    LeaseNotFoundError as soon as the lease is found gone, and UnavailableError if the backend
    stays unreachable until the lease must have expired (measured from the last refresh that
    was sent and acknowledged).
    """
    if ttl_s <= 0:
        raise ValueError(f"keep_lease_alive: ttl_s must be > 0 (got {ttl_s})")
    expires_at = clock() + ttl_s
    interval_s = ttl_s / refreshes_per_ttl
    while True:
        await sleep(interval_s)
        sent_at = clock()
        try:
            ttl_s = await backend.lease_keepalive_once(lease_id)
        except UnavailableError:
            if clock() >= expires_at:
                raise
            interval_s = min(unavailable_retry_interval_s, ttl_s / refreshes_per_ttl)
            continue
        # The new TTL counts from when etcd handled the refresh, which is after it was sent.
        expires_at = sent_at + ttl_s
        interval_s = ttl_s / refreshes_per_ttl


def keep_lease_alive_from_grant(
    backend: Backend, lease_id: int, ttl_s: float
) -> asyncio.Task[None]:
    """Start refreshing a lease granted just now, as a task of its own.

    A process announces itself under the lease, loads its keyspace mirror, and only then runs
    the task group whose keep-alive would otherwise start refreshing: a refresh loop started
    there assumes a lease refreshed just now, while the last refresh was before the mirror's
    load (seconds, for a large keyspace or a slow etcd). So the one loop starts at the grant
    and runs through the start; the run awaits it (`lease_kept`). Cancel it if the start
    fails."""
    return asyncio.ensure_future(keep_lease_alive(backend, lease_id, ttl_s))


async def lease_kept(keepalive: asyncio.Task[None]) -> NoReturn:
    """Await a keep-alive started at the grant (`keep_lease_alive_from_grant`): raises what
    ended it (the lease lost, or etcd unreachable past the lease's expiry). Cancelling the
    awaiting task cancels the keep-alive too."""
    await keepalive
    raise AssertionError("keep_lease_alive returned")  # It never returns.
