"""Dispatch: which broker a journal request goes to, over which channel.

Any broker answers any request, proxying it to a broker of the journal's route if it is not one
itself. Sending the request straight to the right broker saves that hop (and, across zones, its
cost), so clients remember each journal's Route as brokers report it in response headers
(`RouteCache`), and keep one gRPC channel per broker endpoint (`ChannelPool`). `JournalClient`
puts the two together: appends go to the journal's primary; reads and fragment listings to a
member of the route in the client's own zone if there is one, else to the primary, else to any
member; requests of journals with no known route go to the client's default endpoint, which
proxies them.

Both caches are bounded LRUs: a client of many journals, or of a cluster whose brokers come
and go, must not grow without limit.

Healing after a broker dies. A cached route may name a broker that has died (killed, its lease
not yet expired, or its journals since moved). Callers drop a journal's route when an RPC to
it fails UNAVAILABLE (``update_route(journal, None)``), so that the next one goes to the default
broker, whose answer carries the current route. Besides, the pool knows which endpoints it
failed to connect to (``ChannelPool.unreachable``: the channel is in TRANSIENT_FAILURE), and
``JournalClient`` never dispatches to one while the route has another suitable member (a read
goes to a live replica), else drops the route and asks the default broker (or, if that one is
unreachable too, another broker the client learned of from a route). Channels reconnect
with a bounded back-off (``reconnect_backoff_max_ms``, not gRPC's two minutes), so a broker back
on the same endpoint is reachable again within half a second; a channel whose endpoint stays
unreachable is closed and dropped after ``unreachable_channel_ttl_s``.

A broker that stops answering without closing its sockets (SIGSTOP, a hung host, a partition
that drops packets) refuses nothing and resets nothing. Channels therefore ping the broker
while calls are in flight (HTTP/2 keepalive, ``broker.grpc_transport``: every
``client_keepalive_time_s``, acknowledged within ``client_keepalive_timeout_s``), so that a
call stalled on it (a blocking Read at the write head, an append awaiting its commit) fails
UNAVAILABLE within seconds, and a new connection's handshake gives up after
``client_connect_timeout_s``: the caller drops the route, as above, and reaches the journal
through the default broker once it has moved.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

import grpc
import grpc.aio

from broker.auth import client_interceptors_from_env
from broker.grpc_transport import CLIENT_KEEPALIVE_CHANNEL_OPTIONS
from broker.protocol import protocol_pb2 as pb
from broker.protocol import protocol_pb2_grpc as pb_grpc
from broker.protocol.validate import ValidationError
from broker.tls import ClientTls, client_tls_from_env

# Journals whose routes are remembered.
routes_max_default: Final = 1024
# A remembered route is used for at most this long; then the next request asks again. Routes
# are also replaced whenever a response header carries a newer one.
route_ttl_s_default: Final = 3600.0
# Broker endpoints with an open channel. Each channel holds a connection (and its buffers).
channels_max_default: Final = 64
# Broker endpoints a JournalClient remembers from the routes it learned, to fall back on when
# its default broker is unreachable (most recently learned first).
known_brokers_max: Final = 64
# gRPC messages a client receives may be this large: a List response carries up to 1000
# journal specs, a Read chunk is smaller, and gRPC's default of 4 MiB is too tight for the former.
message_bytes_max: Final = 64 << 20

# A failed connection is retried after a back-off growing from the initial value to the maximum
# (gRPC's own maximum is 120 s: a broker back on the same endpoint would stay unreachable that
# long after it restarted). Until the next attempt, RPCs on the channel fail at once, so the
# maximum is how late a restarted broker is reached (by clients and by its peers' pipelines);
# an attempt against a broker that is down costs one refused (or timed out) connect.
reconnect_backoff_initial_ms: Final = 100
reconnect_backoff_max_ms: Final = 500
# A pooled channel whose endpoint has been unreachable this long is closed and dropped (the
# broker is gone; a later request for it opens a new channel) ...
unreachable_channel_ttl_s: Final = 60.0
# ... as found by a sweep of the pool's channels, at most this often (each asks every channel
# its state).
unreachable_sweep_interval_s: Final = 5.0

# Options of every client channel to a broker (the broker's own peer channels use them too,
# with the peers' keepalive in place of the clients').
CHANNEL_OPTIONS: Final = (
    ("grpc.max_receive_message_length", message_bytes_max),
    ("grpc.max_send_message_length", message_bytes_max),
    ("grpc.initial_reconnect_backoff_ms", reconnect_backoff_initial_ms),
    ("grpc.max_reconnect_backoff_ms", reconnect_backoff_max_ms),
    # A call to a broker that stopped answering (SIGSTOP, a hung host, a partition that drops
    # packets) fails UNAVAILABLE within seconds, and a new connection to one gives up after
    # `client_connect_timeout_s` (see the module docstring).
    *CLIENT_KEEPALIVE_CHANNEL_OPTIONS,
)


def channel_unreachable(channel: grpc.aio.Channel) -> bool:
    """Whether ``channel``'s last attempt to connect failed (gRPC's TRANSIENT_FAILURE): RPCs on
    it fail at once until a reconnection succeeds."""
    return channel.get_state() is grpc.ChannelConnectivity.TRANSIENT_FAILURE


class EndpointError(ValidationError):
    """An endpoint that is not a usable broker address."""


def grpc_target(endpoint: str) -> tuple[str, bool]:
    """(gRPC target, secure) of a broker endpoint: `http://host:port` (plain), `https://...`
    (TLS), `unix:///path` (a Unix socket), or a bare `host:port`."""
    if "://" not in endpoint:
        if not endpoint:
            raise EndpointError("must not be empty", "endpoint")
        return endpoint, False
    try:
        parts = urlsplit(endpoint)
    except ValueError as err:  # An unclosed "[" of an IPv6 address, and the like.
        raise EndpointError(
            "must be http://host:port, https://host:port or unix:///path"
            f" (got {endpoint!r}: {err})",
            "endpoint",
        ) from None
    if parts.scheme == "unix":
        return endpoint, False
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise EndpointError(
            f"must be http://host:port, https://host:port or unix:///path (got {endpoint!r})",
            "endpoint",
        )
    return parts.netloc, parts.scheme == "https"


def open_channel(
    endpoint: str,
    *,
    options: Sequence[tuple[str, object]] = CHANNEL_OPTIONS,
    interceptors: Sequence[grpc.aio.ClientInterceptor] | None = None,
    tls: ClientTls | None = None,
) -> grpc.aio.Channel:
    """A channel to `endpoint`: TLS for ``https://`` (trusting `tls`'s CAs, presenting its
    certificate if it has one; without `tls`, the system's CAs), else in the clear."""
    target, secure = grpc_target(endpoint)
    chosen = list(interceptors) if interceptors else None
    if secure:
        credentials = (tls or ClientTls()).credentials()
        return grpc.aio.secure_channel(target, credentials, options=options, interceptors=chosen)
    return grpc.aio.insecure_channel(target, options=options, interceptors=chosen)


class ChannelPool:
    """One gRPC channel per endpoint, at most `channels_max` of them (least recently used
    channels are closed first). Close the pool to close every channel. `interceptors` are
    installed on every channel (e.g. `broker.auth.client_interceptors`); `tls` is what
    channels to ``https://`` endpoints trust and present (see `broker.tls`). Channels to
    endpoints that stay unreachable are dropped (see the module docstring)."""

    def __init__(
        self,
        *,
        channels_max: int = channels_max_default,
        interceptors: Sequence[grpc.aio.ClientInterceptor] = (),
        tls: ClientTls | None = None,
        clock: Callable[[], float] = time.monotonic,
        options: Sequence[tuple[str, object]] = CHANNEL_OPTIONS,
    ) -> None:
        if channels_max < 1:
            raise ValueError(f"channels_max: must be >= 1 (got {channels_max})")
        self._channels_max = channels_max
        self._options = options
        self._interceptors = list(interceptors) or None
        self.tls = tls
        self._clock = clock
        self._channels: OrderedDict[str, grpc.aio.Channel] = OrderedDict()
        # Channels evicted or dropped while no event loop ran, closed by the next `prune` or
        # `close` (with a loop, they are closed at once in the background: `_closing`).
        self._evicted: list[grpc.aio.Channel] = []
        # Endpoints found unreachable by a sweep, and when they first were.
        self._unreachable_since: dict[str, float] = {}
        self._next_sweep = clock() + unreachable_sweep_interval_s
        # Closings of dropped unreachable channels, in the background (`close` awaits them).
        self._closing: set[asyncio.Task[None]] = set()

    def unreachable(self, endpoint: str) -> bool:
        """Whether the pool's channel to `endpoint` failed to connect (False if it has none)."""
        channel = self._channels.get(endpoint)
        return channel is not None and channel_unreachable(channel)

    def get(self, endpoint: str) -> grpc.aio.Channel:
        self._sweep()
        channel = self._channels.get(endpoint)
        if channel is not None:
            self._channels.move_to_end(endpoint)
            return channel
        channel = open_channel(
            endpoint, options=self._options, interceptors=self._interceptors, tls=self.tls
        )
        self._channels[endpoint] = channel
        if len(self._channels) > self._channels_max:
            evicted_endpoint, evicted = self._channels.popitem(last=False)
            self._unreachable_since.pop(evicted_endpoint, None)
            self._close_soon(evicted)
        return channel

    def stub(self, endpoint: str) -> pb_grpc.JournalStub:
        return pb_grpc.JournalStub(self.get(endpoint))

    def _sweep(self) -> None:
        """Drop the channels unreachable for `unreachable_channel_ttl_s` (every so often)."""
        now = self._clock()
        if now < self._next_sweep:
            return
        self._next_sweep = now + unreachable_sweep_interval_s
        for endpoint, channel in list(self._channels.items()):
            if not channel_unreachable(channel):
                self._unreachable_since.pop(endpoint, None)
                continue
            since = self._unreachable_since.setdefault(endpoint, now)
            if now - since >= unreachable_channel_ttl_s:
                del self._channels[endpoint]
                del self._unreachable_since[endpoint]
                self._close_soon(channel)

    def _close_soon(self, channel: grpc.aio.Channel) -> None:
        # An unreachable channel runs nothing (its RPCs failed at once), and an evicted one is
        # the least recently used of many: close it now, in the background (`get` is not async).
        try:
            task = asyncio.get_running_loop().create_task(channel.close())
        except RuntimeError:  # No running loop: closed by the next prune() or close().
            self._evicted.append(channel)
            return
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def __len__(self) -> int:
        return len(self._channels)

    async def prune(self) -> None:
        """Close channels evicted since the last prune (their RPCs are cancelled)."""
        evicted, self._evicted = self._evicted, []
        for channel in evicted:
            await channel.close()

    async def close(self) -> None:
        await self.prune()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        channels = list(self._channels.values())
        self._channels.clear()
        self._unreachable_since.clear()
        for channel in channels:
            await channel.close()


@dataclass(frozen=True, slots=True)
class _Cached:
    route: pb.Route
    at: float


class RouteCache:
    """Routes of journals as last reported by brokers, at most `routes_max` of them (least
    recently used dropped first), each trusted for `ttl_s`."""

    def __init__(
        self,
        *,
        routes_max: int = routes_max_default,
        ttl_s: float = route_ttl_s_default,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if routes_max < 1 or ttl_s <= 0:
            raise ValueError("routes_max: must be >= 1, ttl_s: must be > 0")
        self._routes_max = routes_max
        self._ttl_s = ttl_s
        self._clock = clock
        self._routes: OrderedDict[str, _Cached] = OrderedDict()

    def drop_endpoint(self, endpoint: str) -> int:
        """Forget every route naming `endpoint` (a broker found gone); how many."""
        stale = [j for j, cached in self._routes.items() if endpoint in cached.route.endpoints]
        for journal in stale:
            del self._routes[journal]
        return len(stale)

    def update(self, journal: str, route: pb.Route | None) -> None:
        """Remember `route` for `journal`; forget it if `route` is None or has no members (a
        broker that reports an empty route knows of no broker serving the journal)."""
        if route is None or not route.members:
            self._routes.pop(journal, None)
            return
        copy = pb.Route()
        copy.CopyFrom(route)
        self._routes[journal] = _Cached(copy, self._clock())
        self._routes.move_to_end(journal)
        while len(self._routes) > self._routes_max:
            self._routes.popitem(last=False)

    def get(self, journal: str) -> pb.Route | None:
        """The remembered route (a copy), or None if unknown or expired."""
        cached = self._routes.get(journal)
        if cached is None:
            return None
        if self._clock() - cached.at > self._ttl_s:
            del self._routes[journal]
            return None
        self._routes.move_to_end(journal)
        out = pb.Route()
        out.CopyFrom(cached.route)
        return out

    def __len__(self) -> int:
        return len(self._routes)


def pick_endpoint(
    route: pb.Route, *, require_primary: bool, zone: str = "", exclude: Collection[str] = ()
) -> str:
    """The endpoint of the route member a request should go to, or "" if the route names none
    suitable: the primary when required; else a member of `zone`, else the primary, else the
    first member with an endpoint. Endpoints in `exclude` (unreachable ones) are never picked."""
    endpoints = [e if e not in exclude else "" for e in route.endpoints]
    if len(endpoints) != len(route.members):
        return ""

    def primary() -> str:
        return endpoints[route.primary] if 0 <= route.primary < len(endpoints) else ""

    if require_primary:
        return primary()
    if zone:
        for member, endpoint in zip(route.members, endpoints, strict=True):
            if member.zone == zone and endpoint:
                return endpoint
    return primary() or next((e for e in endpoints if e), "")


def endpoint_of_header(header: pb.Header) -> str:
    """The endpoint of the broker a Header names (its process_id), from its route; "" if the
    route does not list it with an endpoint."""
    route = header.route
    for index, member in enumerate(route.members):
        if member.zone == header.process_id.zone and member.suffix == header.process_id.suffix:
            return route.endpoints[index] if index < len(route.endpoints) else ""
    return ""


class JournalClient:
    """A client of a broker cluster: stubs dispatched by journal (see the module docstring).

    `endpoint` is the default broker, used for journals with no known route and for List and
    Apply. `zone` is the client's failure zone, to prefer brokers in it for reads."""

    def __init__(
        self,
        endpoint: str,
        *,
        zone: str = "",
        channels: ChannelPool | None = None,
        routes: RouteCache | None = None,
    ) -> None:
        grpc_target(endpoint)  # Validate early.
        self.endpoint = endpoint
        self.zone = zone
        if channels is None:
            # Authorization and TLS as the environment says (GAZETTE_AUTH_TOKEN or
            # GAZETTE_AUTH_KEYS; GAZETTE_TLS_CA, GAZETTE_TLS_CERT and GAZETTE_TLS_KEY).
            channels = ChannelPool(
                interceptors=client_interceptors_from_env(), tls=client_tls_from_env()
            )
        self.channels = channels
        self.routes = routes if routes is not None else RouteCache()
        # Brokers named by the routes learned, most recent last (see `default_endpoint`).
        self._brokers: OrderedDict[str, None] = OrderedDict()

    def default_endpoint(self) -> str:
        """The broker that takes requests of journals with no usable route (any broker proxies
        them, and its answer teaches the route): the default endpoint, unless it is known to be
        unreachable and another broker learned from a route is not (most recently learned
        first). Without it, a client whose default broker died could reach no journal, not
        even one that failed over to live brokers, until that broker came back."""
        if not self.channels.unreachable(self.endpoint):
            return self.endpoint
        for endpoint in reversed(self._brokers):
            if endpoint != self.endpoint and not self.channels.unreachable(endpoint):
                return endpoint
        return self.endpoint

    def endpoint_for(self, journal: str, *, require_primary: bool) -> str:
        """Where a request of `journal` goes: a suitable member of its cached route that is
        not known to be unreachable, else the default endpoint (`default_endpoint`)."""
        route = self.routes.get(journal)
        if route is not None:
            unreachable = [e for e in route.endpoints if e and self.channels.unreachable(e)]
            endpoint = pick_endpoint(
                route, require_primary=require_primary, zone=self.zone, exclude=unreachable
            )
            if endpoint:
                return endpoint
            if unreachable:
                # The route's only suitable member is gone (or the route is stale): the
                # default broker knows the current one and teaches it in its answer.
                self.routes.update(journal, None)
        return self.default_endpoint()

    def stub_for(self, journal: str, *, require_primary: bool) -> pb_grpc.JournalStub:
        return self.channels.stub(self.endpoint_for(journal, require_primary=require_primary))

    def default_stub(self) -> pb_grpc.JournalStub:
        return self.channels.stub(self.default_endpoint())

    def update_route(self, journal: str, header: pb.Header | None) -> None:
        """Learn the route of a response header (a header without one forgets the route)."""
        route = header.route if header is not None else None
        self.routes.update(journal, route)
        for endpoint in route.endpoints if route is not None else ():
            if endpoint:
                self._brokers[endpoint] = None
                self._brokers.move_to_end(endpoint)
        while len(self._brokers) > known_brokers_max:
            self._brokers.popitem(last=False)

    async def close(self) -> None:
        await self.channels.close()
