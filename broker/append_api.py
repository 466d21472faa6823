"""The Append RPC: validate the request, run the append machine, answer or proxy.

The first message of an Append stream names the journal and the append's preconditions; the
messages after it carry content; an empty message followed by the end of the stream commits.
Anything else (the stream ends without the empty message, the client cancels, a malformed
message) rolls the append back on every replica.

Flow control. Appends are not buffered by the broker: content goes straight to the replicas
while this append holds the journal's pipeline, which every other append of the journal waits
for. A client that streams slowly would hold them all up, so the broker polices a minimum rate
with a credit of ``min_rate_bytes_per_s * burst_s`` bytes (append_rate.MinRateCredit): a client
that keeps up with the minimum rate over every window of ``burst_s`` seconds is admitted, bursty
or steady (by default, 64 KiB/s over 5 s: a client sending 1 MiB every 1.5 s is well within it);
one that stalls is aborted (and rolled back) with RESOURCE_EXHAUSTED at most ``burst_s`` after
its last chunk.

The other bound is a maximum: a journal whose spec sets ``max_append_rate`` has its content
held back (never refused) to stay within it, per journal, on the primary (append_rate.py). The
time the broker holds a stream back is not charged to the client's minimum rate.

Proxying. A broker that is not the journal's primary forwards the whole stream to the primary,
unchanged except for the resolved header (which tells the primary which revision we saw), and
relays its answer. A primary that fails UNAVAILABLE before the stream's first message reached it
(it died, or is restarting) has read nothing of the client's: the broker waits, boundedly, for
the route to change and runs the append again (``broker.proxy_retry``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable

import grpc

from broker import metrics
from broker.append_fsm import (
    AppendEnv,
    AppendFSM,
    AppendMessage,
    AppendStreamError,
    ClientAbortedError,
    IndexNotReadyError,
    State,
)
from broker.append_receive import (
    ChunkReceiver,
    FlowControlUnderflowError,
    flow_control_burst_s_default,
    min_append_rate_bytes_per_s_default,
)
from broker.grpc_transport import close_stream_call
from broker.keyspace.backend import KeySpaceError
from broker.keyspace.keyspace import WatchStoppedError
from broker.logging import get_logger
from broker.pipeline import PeerError
from broker.protocol import protocol_pb2 as pb
from broker.protocol.content_wire import ContentChunk
from broker.protocol.labels import is_quorum_journal
from broker.protocol.validate import (
    ValidationError,
    at,
    validate_journal_name,
    validate_label_selector,
    validate_label_set,
)
from broker.proxy_retry import ProxyAttempts, RetryProxyError
from broker.quorum_shell.append import quorum_append
from broker.quorum_shell.dispatch import quorum_mode_refusal
from broker.quorum_shell.journals import QuorumJournals
from broker.read_api import validate_min_etcd_revision
from broker.request_stream import read_to_end
from broker.resolver import (
    ProxyTargetMismatchError,
    ReplicaNotReadyError,
    ResolveError,
    ResolverStoppedError,
)
from broker.topology import as_status, member_index, validate_header

log = get_logger(__name__)


def validate_append_request(req: pb.AppendRequest) -> None:
    """The first message of an Append stream."""
    if req.HasField("header"):
        with at("header"):
            validate_header(req.header)
    with at("journal"):
        validate_journal_name(req.journal)
    if req.offset < 0:
        raise ValidationError(f"must be >= 0 (got {req.offset})", "offset")
    if req.content:
        raise ValidationError("unexpected in the first message", "content")
    if req.HasField("check_registers"):
        with at("check_registers"):
            validate_label_selector(req.check_registers)
    if req.HasField("union_registers"):
        with at("union_registers"):
            validate_label_set(req.union_registers)
    if req.HasField("subtract_registers"):
        with at("subtract_registers"):
            validate_label_set(req.subtract_registers)
    if req.suspend not in pb.AppendRequest.Suspend.values():
        raise ValidationError(
            f"must be one of {', '.join(pb.AppendRequest.Suspend.keys())} (got {req.suspend})",
            "suspend",
        )
    validate_min_etcd_revision(req)


async def proxy_append(
    env: AppendEnv,
    first: pb.AppendRequest,
    header: pb.Header,
    stream: AsyncIterator[AppendMessage],
    attempts: ProxyAttempts | None = None,
) -> pb.AppendResponse:
    """Forward the Append stream to the broker ``header`` resolved it to; relay its answer.
    Content chunks are forwarded as the bytes they arrived as. If the primary fails
    UNAVAILABLE before the first message could be sent to it (it died, or is restarting),
    nothing of ``stream`` has been read yet: with ``attempts`` left, RetryProxyError says to
    wait for the route to change and try again (broker.proxy_retry)."""
    route = header.route
    index = member_index(route, header.process_id)
    endpoint = route.endpoints[index] if 0 <= index < len(route.endpoints) else ""
    if not endpoint:
        raise PeerError(f"no endpoint known for {header.process_id}")
    forwarded = pb.AppendRequest()
    forwarded.CopyFrom(first)
    forwarded.header.CopyFrom(header)
    call = env.dialer.append(endpoint)
    started = False  # Whether the client's stream is being read (no retry past that).

    async def forward() -> None:
        nonlocal started
        try:
            await call.write(forwarded)
            started = True
            async for req in stream:
                await call.write(req.wire if isinstance(req, ContentChunk) else req)
            await call.done_writing()
        except (grpc.RpcError, asyncio.InvalidStateError):
            pass  # The primary ended the call; its status (awaited below) says why.

    async def answer() -> pb.AppendResponse:
        resp: pb.AppendResponse = await call
        return resp

    # The primary may answer before our client ends its stream: it refused the append, or
    # aborted it (a malformed message, a stalled client). Relay that at once, rather than
    # wait for a client message that may never come.
    forwarding = asyncio.ensure_future(forward())
    answering = asyncio.ensure_future(answer())
    try:
        await asyncio.wait([forwarding, answering], return_when=asyncio.FIRST_COMPLETED)
        if forwarding.done():
            forwarding.result()
        try:
            return await answering
        except grpc.aio.AioRpcError as err:
            if started or attempts is None or attempts.failed_on(endpoint, err) is None:
                raise
            # Only the primary takes the append: wait for the route to change.
            retry = attempts.none_left()
            if retry is None:
                raise
            log.info("proxied append failed; waiting for the route", endpoint=endpoint, error=err)
            raise retry from err
    finally:
        for task in (forwarding, answering):
            task.cancel()
        await asyncio.gather(forwarding, answering, return_exceptions=True)
        # Our client went away (or we failed) before the primary answered: cancel, so that
        # the primary rolls the append back (and finish the call's request side in any case).
        await close_stream_call(call)


class AppendApi:
    """The Append RPC handler of one broker."""

    def __init__(
        self,
        env: AppendEnv,
        *,
        min_rate_bytes_per_s: int = min_append_rate_bytes_per_s_default,
        burst_s: float = flow_control_burst_s_default,
        quorum: QuorumJournals | None = None,
    ) -> None:
        self.env = env
        # The broker's quorum journals; None: quorum journals are refused (dispatch.py).
        self.quorum = quorum
        self._min_rate = min_rate_bytes_per_s
        self._burst_s = burst_s

    async def _quorum_append(
        self,
        quorum: QuorumJournals,
        first: pb.AppendRequest,
        spec: pb.JournalSpec,
        stream: AsyncIterator[AppendMessage],
        context: grpc.aio.ServicerContext,
    ) -> pb.AppendResponse:
        """A quorum journal's append (quorum_shell/append.py). A broker that does not lead it
        proxies it to the leader as a replica proxies to the primary: a leader that fails
        UNAVAILABLE before reading any of the stream (it died) is tried again, boundedly, once
        the keyspace moves (a new leader in the term register, or a new route)."""
        resolver = self.env.resolver
        attempts = ProxyAttempts()

        async def proxy(header: pb.Header) -> pb.AppendResponse:
            return await proxy_append(self.env, first, header, stream, attempts)

        # A request proxied here carries the proxying broker's header: it must be of our
        # cluster and for us, and our mirror first reaches the revision it saw.
        proxied = first.header if first.HasField("header") else None
        while True:
            try:
                res = await resolver.resolve(
                    first.journal, require_primary=False, may_proxy=True, proxy_header=proxied
                )
            except (ResolveError, TimeoutError, WatchStoppedError) as err:
                await read_to_end(stream)  # So that the client hears why (request_stream.py).
                code, detail = _grpc_error(err)
                await context.abort(code, f"append to {first.journal}: {detail}")
                raise AssertionError("not reached") from err
            etcd, local = res.header.etcd, res.local_id
            appended = quorum_append(
                quorum,
                local,
                etcd,
                first,
                spec,
                stream,
                context,
                told=res.header.route,
                proxy=proxy,
            )
            # A leader that failed before reading the stream: again once the keyspace moves.
            response = await _proxy_once(self.env, appended, res.revision, context)
            if response is not None:
                return response

    async def append(
        self, request_iterator: AsyncIterator[AppendMessage], context: grpc.aio.ServicerContext
    ) -> pb.AppendResponse:
        stream = aiter(request_iterator)
        received = await anext(stream, None)
        if received is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "append: empty request stream")
            raise AssertionError("not reached")  # context.abort raises.
        # A first message of content alone is invalid; validation names what it lacks.
        first = received.message() if isinstance(received, ContentChunk) else received
        try:
            validate_append_request(first)
        except ValidationError as err:
            await read_to_end(stream)  # So that the client hears why (request_stream.py).
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"append: {err}")

        spec = self.env.resolver.lookup_spec(first.journal)
        if self.quorum is not None and spec is not None and is_quorum_journal(spec.labels):
            return await self._quorum_append(self.quorum, first, spec, stream, context)
        refusal = quorum_mode_refusal(first.journal, spec)
        if refusal is not None:
            await read_to_end(stream)  # So that the client hears why (request_stream.py).
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"append: {refusal}")

        attempts = ProxyAttempts()
        while True:
            fsm = AppendFSM(self.env, first)
            receiver = ChunkReceiver(
                stream,
                min_rate_bytes_per_s=self._min_rate,
                burst_s=self._burst_s,
                throttle=fsm.throttle,
            )
            try:
                await fsm.run(receiver.recv)
            finally:
                receiver.close()
            res = fsm.resolved
            if fsm.state is not State.PROXY or res is None:
                break
            proxied_append = proxy_append(self.env, first, res.header, stream, attempts)
            # Resolve (and run) the append again once the route changes, or after the wait.
            response = await _proxy_once(self.env, proxied_append, res.revision, context)
            if response is not None:
                return response
        if fsm.state is State.FINISHED and res is not None and fsm.client_fragment is not None:
            metrics.record_append(pb.OK, fsm.client_fragment.end - fsm.client_fragment.begin)
            return pb.AppendResponse(
                status=pb.OK,
                header=res.header,
                commit=fsm.client_fragment,
                registers=fsm.registers,
                total_chunks=receiver.total_chunks,
                delayed_chunks=receiver.delayed_chunks,
            )
        if res is not None and fsm.status != pb.OK:
            metrics.record_append(fsm.status)
            resp = pb.AppendResponse(status=as_status(fsm.status), header=res.header)
            if fsm.status == pb.REGISTER_MISMATCH:
                resp.registers.CopyFrom(fsm.registers)
            if fsm.status == pb.FRAGMENT_STORE_UNHEALTHY:
                resp.store_health_error = str(fsm.err)
            return resp
        code, detail = _grpc_error(fsm.err)
        log.warning("served Append RPC failed", journal=first.journal, error=detail)
        if not isinstance(fsm.err, FlowControlUnderflowError | ClientAbortedError):
            # So that the client hears why, UNAVAILABLE (retry) included (request_stream.py).
            # Not for a client that went away, nor one refused for falling behind the minimum
            # rate: reading on would only let it hold the broker longer.
            await read_to_end(stream)
        # Named: a client that writes many journals (a Spark task, a shard) shows the refusal
        # as it came, and "send to <broker>: No space left on device" alone hides which one.
        await context.abort(code, f"append to {first.journal}: {detail}")
        raise AssertionError("not reached")  # context.abort raises.


async def _proxy_once(
    env: AppendEnv,
    append: Awaitable[pb.AppendResponse],
    revision: int,
    context: grpc.aio.ServicerContext,
) -> pb.AppendResponse | None:
    """One try of an append that may be proxied (``proxy_append``, directly or through the
    quorum leader's routing): its response; or None, to try again, when the proxied call
    failed before anything of the client's was consumed (RetryProxyError), after waiting for
    the keyspace to move past ``revision`` for at most the retry's wait. A proxied call that
    failed otherwise aborts the RPC with its status (a PeerError: UNAVAILABLE)."""
    try:
        return await append
    except RetryProxyError as retry:
        with contextlib.suppress(TimeoutError, WatchStoppedError):
            await env.resolver.ks.wait_for_revision(revision + 1, retry.wait_s)
        return None
    except grpc.aio.AioRpcError as exc:
        await context.abort(exc.code(), f"append (proxied): {exc.details()}")
    except PeerError as exc:
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"append (proxy): {exc}")
    raise AssertionError("not reached")  # context.abort raises.


def _grpc_error(err: BaseException | None) -> tuple[grpc.StatusCode, str]:
    detail = str(err) if err is not None else "failed"
    if isinstance(err, FlowControlUnderflowError):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, detail
    if isinstance(err, ClientAbortedError):
        return grpc.StatusCode.CANCELLED, detail
    if isinstance(err, ValidationError | AppendStreamError):
        return grpc.StatusCode.INVALID_ARGUMENT, detail
    if isinstance(err, ResolverStoppedError | ReplicaNotReadyError | ProxyTargetMismatchError):
        # This broker is going away (its lease lost, or exiting), or its replica of the
        # journal is not up yet: another attempt, here or at the broker the client learns of
        # next, may succeed. (Found by the soak: a broker whose lease expired under load
        # answered FAILED_PRECONDITION, which clients take as final.) A proxied request meant
        # for the broker that had this address before (restarted, not announced yet): the
        # proxy's view is behind, and its next attempt goes where it should. (Found by the
        # soak: a shard's output append failed for good, and the shard with it.)
        return grpc.StatusCode.UNAVAILABLE, detail
    if isinstance(err, ResolveError):
        # A proxied request meant for another cluster or broker: no retry fixes it.
        return grpc.StatusCode.FAILED_PRECONDITION, detail
    if isinstance(err, TimeoutError | WatchStoppedError | IndexNotReadyError):
        return grpc.StatusCode.UNAVAILABLE, detail
    if isinstance(err, PeerError | KeySpaceError | grpc.RpcError):
        return grpc.StatusCode.UNAVAILABLE, detail
    return grpc.StatusCode.INTERNAL, detail
