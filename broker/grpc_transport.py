"""gRPC failures of the transport, as opposed to answers of the peer; ending stream calls.

grpc.aio reports a message it could not send on a stream whose connection just broke (a peer
killed or restarting) as INTERNAL with the details "Internal error from Core" — not UNAVAILABLE.
No server sends that: it is the local transport failing, and retrying on a new connection is as
safe as after UNAVAILABLE (an append that was not acknowledged is sent again whole)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, Final

import grpc
import grpc.aio

CORE_SEND_FAILED: Final = "Internal error from Core"

# HTTP/2 keepalive of broker-to-broker channels (proxied appends and reads, the all-replicas
# pipeline's Replicate streams). Without it a call to a peer that stopped without closing its
# sockets (SIGSTOP, a hung host, a partition that drops packets) waits forever: nothing ever
# arrives and nothing times out (Gazette's broker has no keepalive either). While a call is in
# flight the channel pings the peer every `peer_keepalive_time_s`; a ping not acknowledged
# within `peer_keepalive_timeout_s` closes the connection, and every call on it fails
# UNAVAILABLE (retried by clients): a stopped peer is noticed within their sum. The pings are
# answered by gRPC's core, not the peer's event loop, so a busy broker is not taken for dead.
peer_keepalive_time_s: Final = 2.0
peer_keepalive_timeout_s: Final = 3.0
# How long a new connection to a peer may take to complete its HTTP/2 handshake (gRPC's core
# calls it the minimum connect timeout, set by `grpc.min_reconnect_backoff_ms`: the reconnect
# backoff itself is `grpc.initial_reconnect_backoff_ms` .. `grpc.max_reconnect_backoff_ms`).
peer_connect_timeout_s: Final = 5.0


def keepalive_channel_options(
    time_s: float, timeout_s: float, connect_timeout_s: float
) -> tuple[tuple[str, int], ...]:
    """gRPC channel options that ping the other end every `time_s` while calls are in flight,
    close the connection (failing its calls UNAVAILABLE) when a ping is not acknowledged within
    `timeout_s`, and give up on a new connection's handshake after `connect_timeout_s`."""
    return (
        ("grpc.keepalive_time_ms", int(time_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(timeout_s * 1000)),
        # gRPC's core (1.5x) times a ping's acknowledgement with this, 60 s by default,
        # whatever the keepalive timeout says: without it a stopped peer is noticed after a
        # minute.
        ("grpc.http2.ping_timeout_ms", int(timeout_s * 1000)),
        # Only while calls are in flight: an idle channel's next call starts the pings anyway.
        ("grpc.keepalive_permit_without_calls", 0),
        # Keep pinging a call that sends and receives nothing for long (a blocking read of a
        # quiet journal, a proxied append waiting for its commit, an idle Replicate stream): by
        # default gRPC stops after two such pings.
        ("grpc.http2.max_pings_without_data", 0),
        # A new connection to a stopped peer: TCP connects (its kernel answers), the HTTP/2
        # handshake never completes; gRPC's core gives up after this (20 s by default).
        ("grpc.min_reconnect_backoff_ms", int(connect_timeout_s * 1000)),
    )


PEER_KEEPALIVE_CHANNEL_OPTIONS: Final = keepalive_channel_options(
    peer_keepalive_time_s, peer_keepalive_timeout_s, peer_connect_timeout_s
)

# HTTP/2 keepalive of client channels to brokers (route_cache.CHANNEL_OPTIONS: every
# JournalClient, so consumer shards' readers and appenders, gazctl, Spark executors and drivers,
# the HTTP gateway's client). Without it a client's blocking Read from a broker that stopped
# without closing its sockets waits forever, even after the broker's lease expired and the
# journal moved: no error reaches the reader, so it never re-resolves the route (Gazette's
# clients have the same flaw). With it the stalled call fails UNAVAILABLE within
# `client_keepalive_time_s` + `client_keepalive_timeout_s`, which every reader and appender
# retries through a fresh route. The same values as the peers': our brokers' servers accept
# pings every `server_ping_interval_min_s`, and a ping is a few bytes a connection (not a
# call) every 2 s while calls are in flight. A Go (Gazette) broker's server accepts a ping only
# every 5 minutes unless it sent data since the last one: a few pings into a quiet call (a
# blocking read of an idle journal, a long append) it answers GOAWAY `too_many_pings`; the
# calls on that connection fail UNAVAILABLE and are retried, and gRPC's core doubles its
# keepalive time to that broker each time (4, 8, ... 512 s), so that after eight such cuts at
# most it pings no faster than the Go server allows (docs/architecture.md).
client_keepalive_time_s: Final = 2.0
client_keepalive_timeout_s: Final = 3.0
# How long a new connection to a broker may take to complete its HTTP/2 handshake (see
# `peer_connect_timeout_s`): a stopped broker's kernel accepts the TCP connection, and a call
# waiting for it would otherwise fail only after gRPC's default 20 s.
client_connect_timeout_s: Final = 5.0
CLIENT_KEEPALIVE_CHANNEL_OPTIONS: Final = keepalive_channel_options(
    client_keepalive_time_s, client_keepalive_timeout_s, client_connect_timeout_s
)

# The shortest interval between pings the broker's server accepts: below the peers' and the
# clients' keepalive times (with room for timer jitter), or the server answers GOAWAY
# "too_many_pings" after two early pings and drops every call on the connection.
server_ping_interval_min_s: Final = min(peer_keepalive_time_s, client_keepalive_time_s) / 2
# The server's own keepalive: it pings each client connection every `server_keepalive_time_s`
# and closes one whose ping is not acknowledged within `server_keepalive_timeout_s`, ending
# its calls. Without it a call from a client that stopped without closing its sockets (SIGSTOP,
# a hung host) is served for ever: above all a Replicate stream from a stopped primary, which
# holds its peer's spool for its whole life (replicate_api.py), so that the journal's next
# primary, once the allocator moved it, could build no pipeline to that peer and append
# nothing until the stopped one woke (tests/e2e/test_e2e_stopped_primary.py). Clients, Go's
# included, acknowledge pings without limit: a server's pings are not subject to a policy.
server_keepalive_time_s: Final = 2.0
server_keepalive_timeout_s: Final = 3.0
PEER_KEEPALIVE_SERVER_OPTIONS: Final[tuple[tuple[str, int], ...]] = (
    ("grpc.http2.min_ping_interval_without_data_ms", int(server_ping_interval_min_s * 1000)),
    # A ping racing the end of the last call on a connection is not a strike.
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.keepalive_time_ms", int(server_keepalive_time_s * 1000)),
    ("grpc.keepalive_timeout_ms", int(server_keepalive_timeout_s * 1000)),
    ("grpc.http2.ping_timeout_ms", int(server_keepalive_timeout_s * 1000)),
    # Keep pinging a connection whose calls send nothing for long (an idle Replicate stream).
    ("grpc.http2.max_pings_without_data", 0),
)


# Servers own their port: gRPC's core sets SO_REUSEPORT by default, so a second process told to
# listen on a port in use would share it, and clients would land on either process at random (a
# broker of another cluster, say). Without it the second bind fails (tls.bind_port), as Go's
# net.Listen does.
EXCLUSIVE_PORT_SERVER_OPTIONS: Final[tuple[tuple[str, int], ...]] = (("grpc.so_reuseport", 0),)


def with_options(
    base: Iterable[tuple[str, object]], overrides: Iterable[tuple[str, object]]
) -> list[tuple[str, object]]:
    """`base`'s gRPC options with `overrides` in place of the same keys (a key given twice
    would leave which one applies to the core)."""
    overrides = list(overrides)
    replaced = {key for key, _ in overrides}
    return [(k, v) for k, v in base if k not in replaced] + overrides


def send_failed(err: BaseException) -> bool:
    """Whether ``err`` is grpc's own failure to send a message on a broken connection."""
    return (
        isinstance(err, grpc.aio.AioRpcError)
        and err.code() == grpc.StatusCode.INTERNAL
        and err.details() == CORE_SEND_FAILED
    )


# Why finishing a stream call's request side matters. grpc.aio feeds a client-streaming call
# made through an interceptor (auth, etcd's token) from an async generator of its own, consumed
# by a task that waits for the next write. `cancel()` stops that task only while the call runs:
# a call the peer ended (killed, restarting) keeps it waiting forever, and once the call is
# dropped the collected task and generator are logged ("Task was destroyed but it is pending!",
# "aclose(): asynchronous generator is already running") instead of ever ending.
_REQUEST_SIDE_FINISHED: Final = (
    asyncio.InvalidStateError,
    grpc.aio.AioRpcError,
    grpc.aio.UsageError,
)
# Calls whose request side `close_stream_call_soon` is finishing (a task must be referenced).
_closing: Final[set[asyncio.Future[None]]] = set()


# How long closing a stream call waits for its request side to finish. It normally takes no
# time; CI once saw it never finish (an etcd Watch cancelled while it was being opened: grpc's
# request-consuming task and the call's status both pending after cancel()), which held a
# broker asked to exit while it started for good. Past it the call, cancelled already, is left
# to finish on its own (its task kept referenced in `_closing`).
stream_close_wait_s: Final = 2.0


async def close_stream_call(call: Any) -> None:
    """End ``call`` (a grpc.aio stream-request call using the write() API) on every exit path:
    cancel it if it still runs (the peer rolls back what it did not commit), then finish its
    request side, which lets grpc's request-consuming task end (waiting at most
    `stream_close_wait_s`). Idempotent."""
    call.cancel()
    finishing = asyncio.ensure_future(_finish_request_side(call))
    try:
        await asyncio.wait({finishing}, timeout=stream_close_wait_s)
    finally:
        if not finishing.done():
            _closing.add(finishing)
            finishing.add_done_callback(_closing.discard)
    if finishing.done():
        finishing.result()


async def _finish_request_side(call: Any) -> None:
    try:
        await call.done_writing()
    except _REQUEST_SIDE_FINISHED:
        pass  # Its interceptor never ran, or the call has no request side left: nothing waits.


def close_stream_call_soon(call: Any) -> asyncio.Task[None]:
    """``close_stream_call`` from synchronous code: cancels at once, finishes in a task
    (returned, for whoever wants to wait; kept referenced meanwhile)."""
    call.cancel()
    task = asyncio.get_running_loop().create_task(close_stream_call(call))
    _closing.add(task)
    task.add_done_callback(_closing.discard)
    return task
