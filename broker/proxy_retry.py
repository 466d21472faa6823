"""Proxying past a broker that cannot answer: another member, or the route once it changes.

A broker proxies a request it cannot serve itself (it is not in the journal's route, or not
the primary of an append) to a member of the route as its keyspace mirror shows it. When a
broker dies, the mirror keeps naming it until its lease expires (seconds) and the allocator
re-assigns its journals; a broker that has just restarted answers UNAVAILABLE ("starting")
until it knows the cluster. Relaying that UNAVAILABLE at once would make every client retry
blindly, and a read that any other member could serve would fail for nothing. So, as long as
the proxied call failed UNAVAILABLE before anything was relayed (nor, for an append, any of the
client's content consumed), the proxying broker tries again:

- a read (or a fragment listing) goes to another member of the route that has not failed
  this request and whose channel is not known to be unreachable (``ChannelPool.unreachable``),
  at once;
- when no member is left (always, for an append: only the primary takes it), it waits for the
  keyspace to move past the revision it resolved at (the route may have changed: a new primary)
  for at most a growing back-off, re-resolves, and tries the new route's target (every member
  again, if the route did not change: a starting broker may be ready by then).

At most ``proxy_attempts_max`` failures and waits in all (about three seconds of waiting); then
the last failure is relayed (UNAVAILABLE: the client retries later). ``ProxyAttempts`` is the
state of one request's attempts; the handlers (read_api, fragments_api, append_api) loop on it.
"""

from __future__ import annotations

from typing import Final

import grpc
import grpc.aio

from broker.client.route_cache import ChannelPool
from broker.protocol import protocol_pb2 as pb

# Failed proxied calls plus waits for the route to change, per request.
proxy_attempts_max: Final = 8
# Wait before re-resolving when no member is left: doubling from the initial value, capped.
proxy_backoff_initial_s: Final = 0.05
proxy_backoff_max_s: Final = 1.0


def proxy_backoff_s(attempt: int) -> float:
    """The longest wait for a route change after ``attempt`` (1-based) attempts."""
    return float(min(proxy_backoff_max_s, proxy_backoff_initial_s * 2 ** max(attempt - 1, 0)))


class RetryProxyError(Exception):
    """The proxied call failed before answering; try again, after waiting up to ``wait_s`` for
    the route to change (0: at once, another member can serve)."""

    def __init__(self, wait_s: float) -> None:
        super().__init__(f"proxy again (after up to {wait_s:g}s)")
        self.wait_s = wait_s


class ProxyAttempts:
    """One proxied request's attempts (see the module docstring). ``channels`` tells which
    endpoints are known unreachable (None: none are)."""

    def __init__(
        self, channels: ChannelPool | None = None, *, attempts_max: int = proxy_attempts_max
    ) -> None:
        if attempts_max < 1:
            raise ValueError(f"attempts_max: must be >= 1 (got {attempts_max})")
        self._channels = channels
        self._attempts_max = attempts_max
        self.attempts = 0
        # Endpoints that failed this request since the last wait for a route change.
        self.failed: set[str] = set()

    def exclude(self, route: pb.Route) -> set[str]:
        """Endpoints of ``route`` not to proxy to: those that failed this request, and those
        the pool cannot reach, unless that leaves no member (a channel's state may be stale:
        trying costs a fast failure)."""
        channels = self._channels
        if channels is None:
            return set(self.failed)
        unreachable = {e for e in route.endpoints if e and channels.unreachable(e)}
        if all(e in self.failed or e in unreachable for e in route.endpoints if e):
            return set(self.failed)
        return self.failed | unreachable

    def failed_on(self, endpoint: str, err: BaseException) -> RetryProxyError | None:
        """Record that proxying to ``endpoint`` failed with ``err`` before anything was relayed:
        the retry to raise, or None if the failure is to be relayed as it is."""
        if not isinstance(err, grpc.aio.AioRpcError) or err.code() != grpc.StatusCode.UNAVAILABLE:
            return None
        self.failed.add(endpoint)
        self.attempts += 1
        if self.attempts >= self._attempts_max:
            return None
        return RetryProxyError(0.0)

    def none_left(self) -> RetryProxyError | None:
        """No member is left to proxy to: the retry to raise (wait for the route to change,
        then try every member again), or None if nothing failed yet or attempts are spent."""
        if not self.failed or self.attempts >= self._attempts_max:
            return None
        self.attempts += 1
        self.failed.clear()
        return RetryProxyError(proxy_backoff_s(self.attempts))
