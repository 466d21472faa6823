"""The Read RPC: a journal's content, from any offset, optionally blocking at the write head.

A read is resolved like any journal request, but any broker of the journal's route may serve it
(replicas hold the same committed content as the primary). A broker outside the route proxies
the whole stream to a member, unless the client asked it not to (`do_not_proxy`: the answer is
then NOT_JOURNAL_BROKER and the client re-dispatches by the route in the header). A member that
fails UNAVAILABLE before answering (it died, or is starting) is passed over for another, or the
route is re-resolved once it changes, boundedly (``broker.proxy_retry``).

A served read (read_serve.py) is a loop over the replica's FragmentIndex, exactly as Gazette's:
each fragment's metadata, then its content, from the local spool file or from the store.
Resolving a read, and the route member it is proxied to, are read_resolve.py's.

Integrity (beyond Gazette, which trusts its stores): content read from a store is verified
against the fragment's name as it streams (broker/fragment/verify.py; small fragments whole,
before their first byte is sent). A file that fails verification, cannot be decoded, or is
missing though the index lists it, and a read of a range the index knows is lost
(fragment/lost.py), end the stream with the gRPC status DATA_LOSS naming the journal, the
fragment and the store; they are logged and counted (`gazette_read_data_loss_total`). Chunks
of a large fragment sent before its mismatch showed were delivered: the message says how many.
DATA_LOSS rather than a new protocol.Status: an in-band status would need a value Gazette's
clients do not know, while every gRPC client knows DATA_LOSS, and Gazette's own read it as an
error rather than as the journal's end. Other store failures stay UNAVAILABLE (retriable).

Quorum journals (label `gazette.dev/replication-mode=quorum`): a member serves what it has
applied of its own commit offset, which may trail the leader's by a message. So a non-blocking
read first passes the read barrier (quorum_shell/read_barrier.py: learn the leader's commit
offset, wait until this broker applied it), and a read started after an append was acknowledged
sees it through any member; past the barrier's bound it is answered UNAVAILABLE. Blocking reads
wait for their content as they always do.

A hole: a blocking read at an offset below the write head that no fragment covers (a former
primary's fragment not yet listed, or one that will never come) waits like a read at the head,
since a listing may still fill it; the index jumps it only once the fragment after it is hours
old (``fragment/index.py``, ``offset_jump_age_s``). So that such a wait is not silent, a read
still waiting at a hole after ``hole_wait_warning_s`` is logged as a WARNING (journal, offset,
write head) and counted (``gazette_read_hole_waits_total``), once per hole, and keeps waiting
(``broker/read_hole.py``).

Cancellation by the client (or a replica going away, which closes its index) ends the stream
without an error: a blocking read lives until one of them happens, and that is normal.
The served Read handler writes `read`'s responses with `write_responses`, so that a write failing
because the client has just gone ends the stream quietly (grpc.aio's own loop logs it as an
ERROR).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any, Final

import grpc
import grpc.aio

# grpc.aio raises this (it has no public name) when a batch of operations on a call fails in
# core, e.g. a message sent on a call the client has cancelled or whose connection is gone.
from grpc._cython.cygrpc import ExecuteBatchError

from broker import metrics
from broker.client.reader import (
    FragmentContentError,
    validate_read_request,
)
from broker.client.route_cache import ChannelPool
from broker.fragment.index import IndexClosedError, retention_s
from broker.fragment.stores.base import StoreError
from broker.fragment.stores.registry import StoreRegistry
from broker.fragment.verify import FragmentIntegrityError
from broker.logging import get_logger
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import is_quorum_journal
from broker.protocol.validate import ValidationError
from broker.proxy_retry import ProxyAttempts, RetryProxyError
from broker.quorum_shell.read_barrier import QuorumReadUnavailableError
from broker.read_hole import hole_wait_warning_s_default
from broker.read_resolve import (
    Context,
    QuorumReads,
    Resolution,
    Resolver,
    may_read,
    proxy_header,
    proxy_target,
    resolve_again,
    resolve_for_reading,
    resolve_or_abort,
    validate_min_etcd_revision,
    validate_request_header,
)
from broker.read_serve import (
    FileClosedError,
    FragmentPrunedError,
    chunk_bytes_max_default,
    closed_file_requeries_max,
    fragment_url_ttl_s,
    serve_read,
)
from broker.read_staging import StagingArea, StagingError

log = get_logger(__name__)

# After a write fails on a call that is over in core, the handler waits at most this long for
# grpc.aio to deliver the client's cancellation (which cancels the handler's task): returning
# before it arrives would have grpc.aio send the final status on the dead call and log that
# failure as an ERROR. It arrives within a turn or two of the event loop; the bound only keeps
# a handler from lingering if it never does.
client_gone_wait_s: Final = 5.0


# Re-exported: the parts of a read that moved to read_resolve.py and read_serve.py.
__all__ = [
    "Context",
    "QuorumReads",
    "ReadAPI",
    "Resolution",
    "Resolver",
    "chunk_bytes_max_default",
    "closed_file_requeries_max",
    "fragment_url_ttl_s",
    "may_read",
    "proxy_header",
    "proxy_target",
    "resolve_again",
    "resolve_for_reading",
    "resolve_or_abort",
    "serve_read",
    "validate_min_etcd_revision",
    "validate_request_header",
    "write_responses",
]


# --- The RPC --------------------------------------------------------------------------------------


class ReadAPI:
    """The Read RPC handler of a broker: `read(request, context)` is a grpc.aio server-streaming
    method body. `zone` is this broker's zone (proxied reads prefer members in it)."""

    def __init__(
        self,
        resolver: Resolver,
        registry: StoreRegistry,
        channels: ChannelPool,
        *,
        zone: str = "",
        chunk_bytes_max: int = chunk_bytes_max_default,
        hole_wait_warning_s: float = hole_wait_warning_s_default,
        quorum: QuorumReads | None = None,
        staging: StagingArea | None = None,
    ) -> None:
        if chunk_bytes_max < 1:
            raise ValueError(f"chunk_bytes_max: must be >= 1 (got {chunk_bytes_max})")
        if hole_wait_warning_s <= 0:
            raise ValueError(f"hole_wait_warning_s: must be > 0 (got {hole_wait_warning_s})")
        self._resolver = resolver
        self._registry = registry
        self._channels = channels
        self._zone = zone
        self._chunk_bytes_max = chunk_bytes_max
        self._hole_wait_warning_s = hole_wait_warning_s
        # Quorum journals' read barrier (None: served as all-replicas journals are).
        self._quorum = quorum
        # Where stored fragments over 1 MiB are staged to be verified whole before they are
        # served (None: they are read twice, a first pass verifying them).
        self._staging = staging

    async def read(
        self, request: pb.ReadRequest, context: Context
    ) -> AsyncGenerator[pb.ReadResponse, None]:
        metrics.READS.inc()
        try:
            validate_read_request(request)
            validate_request_header(request)
            validate_min_etcd_revision(request)
        except ValidationError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"ReadRequest.{err}")
        resolution, status = await resolve_for_reading(self._resolver, context, request)
        attempts = ProxyAttempts(self._channels)
        while status == pb.OK and (not resolution.is_local or resolution.replica is None):
            proxied = self._proxy(request, resolution.header, context, attempts)
            try:
                async for response in proxied:
                    yield response
                return
            except RetryProxyError as retry:
                revision = resolution.header.etcd.revision
                resolution, status = await resolve_again(
                    self._resolver, context, request, revision, retry.wait_s
                )
            finally:
                # Closed now rather than when collected, so that a read ended early (the
                # client went away) cancels its upstream call at once.
                await proxied.aclose()
        replica = resolution.replica
        if status != pb.OK or replica is None:
            yield pb.ReadResponse(status=status, header=resolution.header)
            return
        spec = resolution.spec
        if (
            not request.block
            and self._quorum is not None
            and spec is not None
            and is_quorum_journal(spec.labels)
        ):
            # Read-your-writes through any member: learn how far the journal is committed
            # before answering at (or reporting) a write head (quorum_shell/read_barrier.py).
            try:
                await self._quorum.read_barrier(request.journal)
            except QuorumReadUnavailableError as err:
                log.info("quorum read refused", journal=request.journal, error=str(err))
                await context.abort(
                    grpc.StatusCode.UNAVAILABLE, f"reading {request.journal}: {err}"
                )
        responses = serve_read(
            request,
            resolution.header,
            replica.index,
            self._registry,
            chunk_bytes_max=self._chunk_bytes_max,
            hole_wait_warning_s=self._hole_wait_warning_s,
            retention_s=retention_s(spec) if spec is not None else 0.0,
            staging=self._staging,
        )
        try:
            async for response in responses:
                yield response
        except IndexClosedError:
            return  # The replica went away: end the stream; the client re-resolves.
        except FragmentIntegrityError as err:
            # Content the index says exists is lost or corrupt: reading again reads the same
            # bytes, so the client must not retry (DATA_LOSS), and an operator must know.
            metrics.record_data_loss(err.failure.value)
            log.error(
                "read failed: data loss",
                journal=request.journal,
                fragment=err.fragment.begin,
                store=err.store,
                failure=err.failure.value,
                error=str(err),
            )
            await context.abort(grpc.StatusCode.DATA_LOSS, f"reading {request.journal}: {err}")
        except (
            StoreError,
            FragmentContentError,
            FileClosedError,
            FragmentPrunedError,
            StagingError,
        ) as err:
            # (Pruned since the last listing: not loss. The index lists the stores again; a
            # read retried after that goes on past the pruned range. A fragment that could not
            # be staged is not lost either.)
            log.warning("read failed", journal=request.journal, error=str(err))
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"reading {request.journal}: {err}")
        finally:
            await responses.aclose()

    async def _proxy(
        self, request: pb.ReadRequest, header: pb.Header, context: Context, attempts: ProxyAttempts
    ) -> AsyncGenerator[pb.ReadResponse, None]:
        """Relay the read from a member of the route. Raises RetryProxyError if the member
        failed before answering and another try may do better (see broker.proxy_retry)."""
        member, endpoint = proxy_target(header, self._zone, attempts.exclude(header.route))
        if not endpoint:
            if (retry := attempts.none_left()) is not None:
                raise retry
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"no endpoint to proxy the read of {request.journal} to (route {header.route})",
            )
        forwarded = pb.ReadRequest()
        forwarded.CopyFrom(request)
        forwarded.header.CopyFrom(proxy_header(header, member))
        call = self._channels.stub(endpoint).Read(forwarded)
        relayed = False
        try:
            async for response in call:
                relayed = True
                yield response
        except grpc.aio.AioRpcError as err:
            if not relayed and (retry := attempts.failed_on(endpoint, err)) is not None:
                log.info("proxied read failed; trying again", endpoint=endpoint, error=str(err))
                raise retry from err
            await context.abort(err.code(), f"proxied read via {endpoint}: {err.details()}")
        finally:
            call.cancel()


async def write_responses(
    responses: AsyncGenerator[Any, None], context: Context, *, journal: str
) -> None:
    """Write each of `responses` (a streaming handler's generator) to the call, as grpc.aio does
    for a handler that yields them, except that a write failing on a call that is over in core
    (the client cancelled or disconnected mid-stream) ends the stream quietly.

    grpc.aio learns that the client closed the call from a separate completion; when the failed
    write is seen first, grpc.aio's own loop logs it as an ERROR with a traceback. Here the
    generator is closed (releasing its files and any proxied call), then the handler waits,
    boundedly, for that completion, which cancels it: grpc.aio logs a cancelled RPC at debug.
    Everything else (aborts and their statuses, other errors, cancellation) propagates as
    before. JournalService.Read (broker/server.py) is this over `ReadAPI.read`; the auth
    interceptor (broker/auth_server.py) writes a yielding Read handler's responses with it too."""
    try:
        async for response in responses:
            try:
                await context.write(response)
            except ExecuteBatchError:
                break
        else:
            return
    finally:
        await responses.aclose()
    log.debug("read ended: the call is over (the client went away)", journal=journal)
    # Nothing resolves this future: the wait ends with the task's cancellation (the client
    # closed the call), or at the bound.
    gone = asyncio.get_running_loop().create_future()
    try:
        async with asyncio.timeout(client_gone_wait_s):
            await gone
    except TimeoutError:
        log.debug("read ended: no cancellation arrived for the failed call", journal=journal)
