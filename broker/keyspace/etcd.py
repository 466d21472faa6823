"""EtcdBackend: the keyspace Backend over etcd's v3 gRPC API, with ``grpc.aio``.

Why our own client rather than a package: see docs/etcd-client.md. The stubs come from our
minimal copies of etcd's API protos in ``broker/keyspace/etcdpb``.

Connections. Each endpoint gets one lazily created channel. Every call starts at the *preferred*
endpoint (the last one that worked); if its channel cannot connect within ``dial_timeout_s`` the
call moves on to the next endpoint, at most ``endpoint_rounds_max`` times round the list. A
request that fails UNAVAILABLE after it was sent may or may not have been applied, so only
idempotent requests (reads, lease refreshes, watch creation) are re-sent elsewhere; mutations
raise UnavailableError and leave the retry decision to the caller, whose retry then starts at
the next endpoint.

The connection of each endpoint is ``etcd_conn.Conn``; errors are translated into
KeySpaceErrors by ``etcd_errors``.

Security. An ``https://`` endpoint is dialed with TLS (``tls``: the CAs to trust, and a client
certificate for an etcd run with ``--client-cert-auth``); so is a bare ``host:port`` when ``tls``
is given; an ``http://`` endpoint with ``tls`` is refused as contradictory. With ``user`` (and
``password``), each connection first authenticates (etcd's Auth.Authenticate) and sends the
token it gets with every request; a token etcd no longer accepts (expired, or from before an
auth change) is replaced and the request re-sent once, which is safe because etcd refused it
without applying it. Wrong credentials raise ``EtcdAuthError``, not an UnavailableError: no
retry fixes them. A TLS handshake that fails is reported with its reason (a certificate not
signed by a trusted CA, a missing client certificate).

Watches. Each ``watch()`` opens its own Watch stream, so one slow consumer never holds up
another's events, and a broken stream fails just that watch. Responses are read from the stream
only as the consumer asks for them: the sole buffer is gRPC's HTTP/2 flow-control window
(bounded), and a consumer that stops reading back-pressures etcd rather than growing memory here.
Progress: ``request_watch_progress()`` sends etcd's RequestProgress on every open watch
stream; etcd answers with an empty response whose header is its current revision, yielded as a
progress notification (Backend.watch). No periodic notifications are asked for. etcd before
3.4.25 / 3.5.8 may send one ahead of events still queued for the stream (etcd issue #15220):
the KeySpace checks it before believing it (see broker/keyspace/keyspace.py).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc
import grpc.aio

from broker.grpc_transport import close_stream_call
from broker.keyspace import backend as b
from broker.keyspace import etcd_wire as wire
from broker.keyspace.etcd_conn import Conn
from broker.keyspace.etcd_endpoints import EndpointError as EndpointError
from broker.keyspace.etcd_endpoints import check_endpoints as check_endpoints
from broker.keyspace.etcd_endpoints import parse_endpoint as parse_endpoint
from broker.keyspace.etcd_endpoints import split_endpoint as split_endpoint
from broker.keyspace.etcd_errors import EtcdAuthError as EtcdAuthError
from broker.keyspace.etcd_errors import EtcdError as EtcdError
from broker.keyspace.etcd_errors import (
    describe,
    stale_token_errors,
    translate,
    transport_failed,
    unavailable_codes,
)
from broker.keyspace.etcdpb import rpc_pb2
from broker.logging import get_logger
from broker.tls import ClientTls, describe_failure

log = get_logger(__name__)

dial_timeout_s_default = 5.0
request_timeout_s_default = 10.0
# A call tries each endpoint up to this many times (the first try of an endpoint may find a
# connection that broke since its last use; the second re-dials it).
endpoint_rounds_max = 2
# Re-authentications of one call, after its token was refused.
auth_refreshes_max = 1
# How long the probe that learns why a connection failed (a TLS handshake, say) may take.
_failure_probe_s = 1.0

T = TypeVar("T")


class EtcdBackend(b.Backend):
    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        dial_timeout_s: float = dial_timeout_s_default,
        request_timeout_s: float = request_timeout_s_default,
        tls: ClientTls | None = None,
        user: str = "",
        password: str = "",
    ) -> None:
        if isinstance(endpoints, str) or not endpoints:
            raise EndpointError(f"etcd endpoints: need a non-empty list (got {endpoints!r})")
        if dial_timeout_s <= 0 or request_timeout_s <= 0:
            raise ValueError("etcd timeouts: dial_timeout_s and request_timeout_s must be > 0")
        if password and not user:
            raise ValueError("etcd password: given without a user")
        dialed = check_endpoints(endpoints, tls)
        self._targets = [target for target, _ in dialed]
        self._secure = [secure for _, secure in dialed]
        self._tls = tls
        self._user = user
        self._password = password
        self._dial_timeout_s = dial_timeout_s
        self._timeout_s = request_timeout_s
        # Channels are created on first use: a grpc.aio channel binds to the running loop.
        self._conns: dict[int, Conn] = {}
        self._preferred = 0
        self._closed = False
        self._watch_calls: set[grpc.aio.StreamStreamCall] = set()
        # Progress requests being written, by watch stream (see request_watch_progress).
        self._progress_writing: dict[grpc.aio.StreamStreamCall, asyncio.Task[None]] = {}

    @property
    def endpoints(self) -> list[str]:
        return list(self._targets)

    @property
    def preferred_endpoint(self) -> str:
        """The endpoint the next call tries first (the last one that worked)."""
        return self._targets[self._preferred]

    # -- KV ---------------------------------------------------------------------------------

    async def range(
        self,
        key: bytes,
        range_end: bytes | None = None,
        revision: int = 0,
        *,
        min_mod_revision: int = 0,
    ) -> b.RangeResponse:
        req = rpc_pb2.RangeRequest(
            key=key,
            range_end=range_end or b"",
            revision=revision,
            min_mod_revision=min_mod_revision,
        )
        resp = await self._call(
            "Range",
            lambda c: c.kv.Range(req, timeout=self._timeout_s),
            idempotent=True,
            revision=revision,
        )
        kvs = tuple(wire.kv(kv) for kv in resp.kvs)
        return b.RangeResponse(wire.header(resp.header), kvs, int(resp.count))

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> b.Header:
        req = rpc_pb2.PutRequest(key=key, value=value, lease=lease)
        resp = await self._call(
            "Put", lambda c: c.kv.Put(req, timeout=self._timeout_s), lease=lease
        )
        return wire.header(resp.header)

    async def delete(self, key: bytes, range_end: bytes | None = None) -> tuple[b.Header, int]:
        req = rpc_pb2.DeleteRangeRequest(key=key, range_end=range_end or b"")
        resp = await self._call(
            "DeleteRange", lambda c: c.kv.DeleteRange(req, timeout=self._timeout_s)
        )
        return wire.header(resp.header), int(resp.deleted)

    async def txn(
        self,
        compares: Sequence[b.Compare],
        success: Sequence[b.Op],
        failure: Sequence[b.Op] = (),
    ) -> b.TxnResponse:
        req = rpc_pb2.TxnRequest(
            compare=[wire.compare(i, c) for i, c in enumerate(compares)],
            success=[wire.request_op(op) for op in success],
            failure=[wire.request_op(op) for op in failure],
        )
        # A lease error can only come from a put; name the (first) lease the txn puts with.
        lease = next((op.lease for op in (*success, *failure) if isinstance(op, b.OpPut)), 0)
        resp = await self._call(
            "Txn", lambda c: c.kv.Txn(req, timeout=self._timeout_s), lease=lease
        )
        return b.TxnResponse(
            succeeded=bool(resp.succeeded),
            header=wire.header(resp.header),
            results=tuple(wire.op_result(r) for r in resp.responses),
        )

    async def compact(self, revision: int) -> None:
        # physical=True returns only once the old revisions are gone, so that what a caller
        # observes right after compact() does not depend on a background compaction's progress.
        req = rpc_pb2.CompactionRequest(revision=revision, physical=True)
        await self._call(
            "Compact", lambda c: c.kv.Compact(req, timeout=self._timeout_s), revision=revision
        )

    # -- Leases -----------------------------------------------------------------------------

    async def lease_grant(self, ttl_s: int) -> tuple[int, int]:
        req = rpc_pb2.LeaseGrantRequest(TTL=ttl_s)
        resp = await self._call(
            "LeaseGrant", lambda c: c.lease.LeaseGrant(req, timeout=self._timeout_s)
        )
        if resp.error:
            raise EtcdError("LeaseGrant", grpc.StatusCode.UNKNOWN, resp.error)
        return int(resp.ID), int(resp.TTL)

    async def lease_revoke(self, lease_id: int) -> None:
        req = rpc_pb2.LeaseRevokeRequest(ID=lease_id)
        await self._call(
            "LeaseRevoke",
            lambda c: c.lease.LeaseRevoke(req, timeout=self._timeout_s),
            lease=lease_id,
        )

    async def lease_keepalive_once(self, lease_id: int) -> int:
        # etcd refreshes leases only over the LeaseKeepAlive stream. One short stream per
        # refresh is plenty at the rate leases are refreshed (every TTL/3), and keeps no state.
        async def once(conn: Conn) -> int:
            call = conn.lease.LeaseKeepAlive(timeout=self._timeout_s)
            try:
                await call.write(rpc_pb2.LeaseKeepAliveRequest(ID=lease_id))
                resp = await call.read()
            finally:
                await close_stream_call(call)
            if resp is grpc.aio.EOF:
                raise b.UnavailableError("etcd LeaseKeepAlive: stream ended without a reply")
            return int(resp.TTL)

        ttl = await self._call("LeaseKeepAlive", once, idempotent=True, lease=lease_id)
        if ttl <= 0:
            # etcd answers an unknown lease with TTL 0 rather than an error status.
            raise b.LeaseNotFoundError(lease_id)
        return ttl

    async def lease_time_to_live(self, lease_id: int) -> int:
        """Remaining TTL of a lease in seconds (not part of Backend; used by tests and tools).
        Raises LeaseNotFoundError if it is gone."""
        req = rpc_pb2.LeaseTimeToLiveRequest(ID=lease_id)
        resp = await self._call(
            "LeaseTimeToLive",
            lambda c: c.lease.LeaseTimeToLive(req, timeout=self._timeout_s),
            idempotent=True,
            lease=lease_id,
        )
        if resp.TTL < 0:
            raise b.LeaseNotFoundError(lease_id)
        return int(resp.TTL)

    # -- Watch ------------------------------------------------------------------------------

    async def watch(
        self, key: bytes, range_end: bytes | None = None, start_revision: int = 0
    ) -> AsyncGenerator[b.WatchResponse, None]:
        create = rpc_pb2.WatchRequest(
            create_request=rpc_pb2.WatchCreateRequest(
                key=key, range_end=range_end or b"", start_revision=start_revision
            )
        )

        async def open_stream(conn: Conn) -> grpc.aio.StreamStreamCall:
            call: grpc.aio.StreamStreamCall = conn.watch.Watch()
            try:
                await call.write(create)
                first = await call.read()
                if first is grpc.aio.EOF or not first.created:
                    raise b.UnavailableError("etcd Watch: stream ended before the watch started")
                self._check_watch_response(first, start_revision)
            except BaseException:
                await close_stream_call(call)
                raise
            return call

        if self._closed:
            return
        call = await self._call("Watch", open_stream, idempotent=True)
        self._watch_calls.add(call)
        try:
            while True:
                resp = await self._read_watch(call)
                if resp is None:
                    return
                self._check_watch_response(resp, start_revision)
                # Without events: a progress notification (asked for by request_watch_progress).
                yield b.WatchResponse(wire.header(resp.header), tuple(map(wire.event, resp.events)))
        finally:
            self._watch_calls.discard(call)
            await close_stream_call(call)

    async def _read_watch(self, call: grpc.aio.StreamStreamCall) -> Any:
        """The next response, or None if the backend was closed. Raises UnavailableError when
        the stream breaks."""
        try:
            resp = await call.read()
        except asyncio.CancelledError:
            # close() cancels open watch calls, which surfaces here as CancelledError; that is
            # the watch ending, not this task being cancelled (unless it is that too).
            task = asyncio.current_task()
            if self._closed and (task is None or task.cancelling() == 0):
                return None
            raise
        except grpc.aio.AioRpcError as err:
            if self._closed:
                return None
            raise b.UnavailableError(f"etcd Watch: stream broke: {describe(err)}") from err
        if resp is grpc.aio.EOF:
            if self._closed:
                return None
            raise b.UnavailableError("etcd Watch: stream ended by the server")
        return resp

    async def request_watch_progress(self) -> None:
        for call in list(self._watch_calls):
            # One write at a time per stream (grpc.aio fails a stream written concurrently);
            # a request already being written serves every waiter that asks meanwhile.
            if call in self._progress_writing:
                continue
            writing = asyncio.create_task(self._write_progress_request(call))
            self._progress_writing[call] = writing
            writing.add_done_callback(functools.partial(self._progress_written, call))
            # Shielded: grpc.aio cancels the whole stream when a write to it is cancelled, so a
            # caller that goes meanwhile (its own timeout) would end the watch of everyone.
            await asyncio.shield(writing)

    def _progress_written(self, call: grpc.aio.StreamStreamCall, _: asyncio.Task[None]) -> None:
        self._progress_writing.pop(call, None)

    @staticmethod
    async def _write_progress_request(call: grpc.aio.StreamStreamCall) -> None:
        request = rpc_pb2.WatchRequest(progress_request=rpc_pb2.WatchProgressRequest())
        try:
            await call.write(request)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            pass  # A broken stream: its reader sees the failure and the watch resumes.

    @staticmethod
    def _check_watch_response(resp: Any, start_revision: int) -> None:
        if resp.compact_revision:
            raise b.CompactedError(start_revision, int(resp.compact_revision))
        if resp.canceled:
            raise EtcdError("Watch", grpc.StatusCode.CANCELLED, resp.cancel_reason or "canceled")

    # -- Lifecycle --------------------------------------------------------------------------

    async def status(self) -> rpc_pb2.StatusResponse:
        """The preferred endpoint's Maintenance.Status (not part of Backend; for health checks)."""
        req = rpc_pb2.StatusRequest()
        resp: rpc_pb2.StatusResponse = await self._call(
            "Status", lambda c: c.maintenance.Status(req, timeout=self._timeout_s), idempotent=True
        )
        return resp

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for call in list(self._watch_calls):
            call.cancel()
        conns = list(self._conns.values())
        self._conns.clear()
        for conn in conns:
            await conn.channel.close()

    # -- Calls and endpoints ----------------------------------------------------------------

    async def _call(
        self,
        rpc: str,
        fn: Callable[[Conn], Awaitable[T]],
        *,
        idempotent: bool = False,
        lease: int = 0,
        revision: int = 0,
    ) -> T:
        """Run ``fn`` against the preferred endpoint, failing over as described in the module
        docstring, and translate gRPC errors into KeySpaceErrors (``lease`` and ``revision``
        name what a lease or revision error is about)."""
        if self._closed:
            raise b.UnavailableError(f"etcd {rpc}: the backend is closed")
        last: b.UnavailableError | None = None
        refreshes = 0
        for _ in range(endpoint_rounds_max * len(self._targets)):
            index = self._preferred
            try:
                conn = await self._connected(index)
            except b.UnavailableError as err:
                last = err
                self._fail_over(index, err)
                continue
            try:
                try:
                    return await fn(conn)
                except grpc.aio.AioRpcError as err:
                    if not self._stale_token(err) or refreshes >= auth_refreshes_max:
                        raise
                # etcd refused the token without applying the request: a new one, once.
                refreshes += 1
                await self._authenticate(conn, index)
                return await fn(conn)
            except grpc.aio.AioRpcError as err:
                if not transport_failed(err):
                    raise await self._translate(rpc, err, lease, revision) from err
                last = b.UnavailableError(f"etcd {rpc} at {self._targets[index]}: {describe(err)}")
                self._fail_over(index, last)
                if not idempotent:
                    raise last from err
            except asyncio.InvalidStateError as err:
                # grpc.aio's answer to a write on a stream whose RPC already ended: the
                # connection broke before the request went out (etcd restarting), as above.
                last = b.UnavailableError(
                    f"etcd {rpc} at {self._targets[index]}: the stream ended before its request"
                    f" was written ({err})"
                )
                self._fail_over(index, last)
                if not idempotent:
                    raise last from err
            except b.UnavailableError as err:
                last = err
                self._fail_over(index, err)
                if not idempotent:
                    raise
        assert last is not None
        raise last

    async def _connected(self, index: int) -> Conn:
        conn = self._conns.get(index)
        if conn is None:
            conn = self._conns[index] = Conn.dial(
                self._targets[index], self._tls, secure=self._secure[index]
            )
        if conn.channel.get_state(try_to_connect=True) != grpc.ChannelConnectivity.READY:
            try:
                await asyncio.wait_for(conn.channel.channel_ready(), self._dial_timeout_s)
            except TimeoutError:
                why = await self._why_not_connected(conn)
                raise b.UnavailableError(
                    f"etcd endpoint {self._targets[index]}: "
                    f"not connected within {self._dial_timeout_s}s{why}"
                ) from None
        if self._user and not conn.token.value:
            await self._authenticate(conn, index)
        return conn

    async def _why_not_connected(self, conn: Conn) -> str:
        """The reason of the channel's last failure to connect (its TLS handshake failed, the
        server closed the connection, ...), as ": <reason>"; "" if it is not known. A channel
        that failed answers at once; one still connecting is given a short while."""
        probe_s = min(_failure_probe_s, self._dial_timeout_s)
        try:
            await conn.maintenance.Status(rpc_pb2.StatusRequest(), timeout=probe_s)
        except grpc.aio.AioRpcError as err:
            details = err.details() or ""
            return ": " + describe_failure(
                details, ca_option="--etcd-ca", cert_option="--etcd-cert/--etcd-key"
            )
        return ""

    async def _authenticate(self, conn: Conn, index: int) -> None:
        """Get a token for our user (replacing any the connection had)."""
        conn.token.value = ""
        req = rpc_pb2.AuthenticateRequest(name=self._user, password=self._password)
        try:
            resp = await conn.auth.Authenticate(req, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as err:
            where = f"etcd endpoint {self._targets[index]}"
            if err.code() in unavailable_codes:
                raise b.UnavailableError(f"{where}: authenticating: {describe(err)}") from err
            raise EtcdAuthError(
                f"{where}: authenticating as user {self._user!r}: {describe(err)}"
            ) from err
        conn.token.value = resp.token

    def _stale_token(self, err: grpc.aio.AioRpcError) -> bool:
        details = err.details() or ""
        return bool(self._user) and any(text in details for text in stale_token_errors)

    def _fail_over(self, index: int, err: Exception) -> None:
        if len(self._targets) > 1 and self._preferred == index:
            self._preferred = (index + 1) % len(self._targets)
            log.info(
                "etcd endpoint failed; trying the next",
                failed=self._targets[index],
                next=self._targets[self._preferred],
                error=str(err),
            )

    async def _translate(
        self, rpc: str, err: grpc.aio.AioRpcError, lease: int, revision: int
    ) -> b.KeySpaceError:
        return await translate(
            rpc,
            err,
            lease,
            revision,
            with_user=bool(self._user),
            compact_revision=self._compact_revision,
        )

    async def _compact_revision(self) -> int:
        """The current compact revision, or 0 if it cannot be learned. etcd's compaction error
        does not carry it; HashKV at the current revision does (at the cost of hashing the
        retained history, acceptable on this rare error path)."""
        try:
            req = rpc_pb2.HashKVRequest(revision=0)
            resp = await self._call(
                "HashKV",
                lambda c: c.maintenance.HashKV(req, timeout=self._timeout_s),
                idempotent=True,
            )
        except b.KeySpaceError:
            return 0
        return int(resp.compact_revision)
