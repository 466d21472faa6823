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
