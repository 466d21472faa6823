"""The Read RPC: a journal's content, from any offset, optionally blocking at the write head.

A read is resolved like any journal request, but any broker of the journal's route may serve it
(replicas hold the same committed content as the primary). A broker outside the route proxies
the whole stream to a member, unless the client asked it not to (`do_not_proxy`: the answer is
then NOT_JOURNAL_BROKER and the client re-dispatches by the route in the header). A member that
fails UNAVAILABLE before answering (it died, or is starting) is passed over for another, or the
route is re-resolved once it changes, boundedly (``broker.proxy_retry``).

A served read is a loop over the replica's FragmentIndex, exactly as Gazette's:

1. Query the index at the read offset (-1: the write head). A blocking read waits until some
   fragment covers it; a non-blocking one answers OFFSET_NOT_YET_AVAILABLE there.
2. Send a *metadata* response: the offset the read resolved to (larger than asked after a jump
   over a gap), the write head, the covering fragment, and for a persisted fragment a signed URL
   of its file. The first response also carries the header (route and etcd revision).
3. Stop after it if the client wanted `metadata_only`, if the fragment is persisted and the
   client reads store files itself (`do_not_proxy`), or if `end_offset` is reached.
4. Stream the fragment's content from the offset in chunks of at most `chunk_bytes_max`: from
   the local spool file if the fragment is local, else from the store (decompressed). Stop at
   `end_offset`; otherwise go to 1 at the fragment's end.

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
from typing import Any, Final, Protocol, TypeAlias, cast

import grpc
import grpc.aio

# grpc.aio raises this (it has no public name) when a batch of operations on a call fails in
# core, e.g. a message sent on a call the client has cancelled or whose connection is gone.
from grpc._cython.cygrpc import ExecuteBatchError

from broker import metrics
from broker.client.reader import (
    FragmentContentError,
    FragmentContentReader,
    missing_fragment_error,
    validate_read_request,
)
from broker.client.route_cache import ChannelPool, pick_endpoint
from broker.fragment.index import FragmentIndex, IndexClosedError, QueryResult
from broker.fragment.spool_file import SpoolFile
from broker.fragment.stores.base import FragmentNotFoundError, StoreError
from broker.fragment.stores.registry import StoreRegistry
from broker.fragment.verify import FragmentIntegrityError
from broker.logging import get_logger
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import is_quorum_journal
from broker.protocol.validate import ValidationError, at
from broker.proxy_retry import ProxyAttempts, RetryProxyError
from broker.quorum_shell.read_barrier import QuorumReadUnavailableError
from broker.read_hole import hole_wait_warning_s_default, wait_covered
from broker.resolve_errors import ResolverStoppedError
from broker.topology import validate_header

log = get_logger(__name__)

# Content chunks of a Read stream are at most this large (Gazette's 128 KiB).
chunk_bytes_max_default: Final = 1 << 17
# Signed fragment URLs in read metadata are valid this long: long enough to open the file, not
# to pass it around. Gazette's value.
fragment_url_ttl_s: Final = 60.0
# A local fragment whose file is closed under a read (it was just persisted) is re-queried; if
# the index keeps answering with closed files this many times in a row, something is broken.
closed_file_requeries_max: Final = 8
# After a write fails on a call that is over in core, the handler waits at most this long for
# grpc.aio to deliver the client's cancellation (which cancels the handler's task): returning
# before it arrives would have grpc.aio send the final status on the dead call and log that
# failure as an ERROR. It arrives within a turn or two of the event loop; the bound only keeps
# a handler from lingering if it never does.
client_gone_wait_s: Final = 5.0

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


# --- What the read path needs from the resolver (broker/resolver.py) -----------------------------


class Replica(Protocol):
    @property
    def index(self) -> FragmentIndex: ...


class Resolution(Protocol):
    """The parts of resolver.Resolution a read uses."""

    @property
    def status(self) -> int: ...

    @property
    def header(self) -> pb.Header: ...

    @property
    def spec(self) -> pb.JournalSpec | None: ...

    @property
    def replica(self) -> Replica | None: ...

    @property
    def is_local(self) -> bool: ...


class QuorumReads(Protocol):
    """The broker's quorum journals (quorum_shell/journals.py), as reads use them."""

    async def read_barrier(self, journal: str) -> None: ...


class Resolver(Protocol):
    async def resolve(
        self,
        journal: str,
        *,
        require_primary: bool,
        may_proxy: bool,
        min_revision: int = 0,
        proxy_header: pb.Header | None = None,
    ) -> Resolution: ...


def may_read(spec: pb.JournalSpec | None) -> bool:
    """Whether the spec's flags allow reads (all but write-only journals)."""
    return spec is not None and spec.flags != pb.JournalSpec.O_WRONLY


def proxy_target(
    header: pb.Header, zone: str = "", exclude: set[str] | frozenset[str] = frozenset()
) -> tuple[pb.ProcessSpec.ID, str]:
    """The route member (and its endpoint) a request resolved to `header` is proxied to: the
    header's process if it names one, else a member in `zone`, else the primary, else any;
    never one whose endpoint is in `exclude` (the endpoint is then "")."""
    route = header.route
    if header.process_id.zone or header.process_id.suffix:
        for index, member in enumerate(route.members):
            if member == header.process_id and index < len(route.endpoints):
                endpoint = route.endpoints[index]
                return member, endpoint if endpoint not in exclude else ""
        return header.process_id, ""
    endpoint = pick_endpoint(route, require_primary=False, zone=zone, exclude=exclude)
    for index, candidate in enumerate(route.endpoints):
        if endpoint and candidate == endpoint:
            return route.members[index], endpoint
    return pb.ProcessSpec.ID(), ""


def proxy_header(header: pb.Header, member: pb.ProcessSpec.ID) -> pb.Header:
    """`header` addressed to `member`, to forward with a proxied request."""
    out = pb.Header()
    out.CopyFrom(header)
    out.process_id.CopyFrom(member)
    return out


def validate_request_header(request: Any) -> None:
    if request.HasField("header"):
        with at("header"):
            validate_header(request.header)


def validate_min_etcd_revision(request: pb.ReadRequest | pb.AppendRequest) -> None:
    if request.min_etcd_revision < 0:
        raise ValidationError(
            f"must be >= 0 (got {request.min_etcd_revision})", "min_etcd_revision"
        )


# --- Serving from the local index -----------------------------------------------------------------


async def serve_read(
    request: pb.ReadRequest,
    header: pb.Header,
    index: FragmentIndex,
    registry: StoreRegistry,
    *,
    chunk_bytes_max: int = chunk_bytes_max_default,
    hole_wait_warning_s: float = hole_wait_warning_s_default,
) -> AsyncGenerator[pb.ReadResponse, None]:
    """The responses of a read served from `index` (see the module docstring). Raises
    IndexClosedError if the index closes, StoreError / FragmentContentError if a store fails."""
    req = pb.ReadRequest()
    req.CopyFrom(request)
    first = True
    closed_files = 0
    while True:
        if req.block:
            result = await wait_covered(index, req, hole_wait_warning_s)
        else:
            result = index.query(req.offset, begin_mod_time=req.begin_mod_time)
        response = await _metadata(result, registry)
        if first:
            response.header.CopyFrom(header)
            first = False
        yield response

        if (
            response.status != pb.OK
            or req.metadata_only
            or (result.file is None and req.do_not_proxy)
            or (req.end_offset and response.offset >= req.end_offset)
        ):
            return
        fragment = response.fragment
        req.offset = response.offset

        if result.file is not None:
            content = _local_content(result.file, fragment, req.offset, chunk_bytes_max)
        else:
            content = _store_content(registry, fragment, req.offset, chunk_bytes_max)
        try:
            async for chunk in content:
                if req.end_offset:
                    chunk = chunk[: req.end_offset - req.offset]
                metrics.READ_BYTES.inc(len(chunk))
                yield pb.ReadResponse(offset=req.offset, content=chunk)
                req.offset += len(chunk)
                if req.end_offset and req.offset >= req.end_offset:
                    return
            closed_files = 0
        except _FileClosedError:
            # Persisted and closed under us: the index now answers with the stored fragment.
            closed_files += 1
            if closed_files > closed_file_requeries_max:
                raise
        finally:
            await content.aclose()


async def _metadata(result: QueryResult, registry: StoreRegistry) -> pb.ReadResponse:
    if result.lost is not None:
        # Content the index knows is gone: never answered as a gap (which a reader would wait
        # at, or take for the journal's end).
        raise result.lost.error()
    if result.fragment is None:
        return pb.ReadResponse(
            status=pb.OFFSET_NOT_YET_AVAILABLE, offset=result.offset, write_head=result.write_head
        )
    response = pb.ReadResponse(
        status=pb.OK, offset=result.offset, write_head=result.write_head, fragment=result.fragment
    )
    fragment = result.fragment
    if result.file is None and fragment.backing_store and fragment.mod_time:
        store = registry.get(fragment.backing_store)
        response.fragment_url = await store.signed_url(fragment, fragment_url_ttl_s)
    return response


class _FileClosedError(Exception):
    """A local fragment's file was closed while being read."""


async def _local_content(
    file: SpoolFile, fragment: pb.Fragment, offset: int, chunk_bytes_max: int
) -> AsyncGenerator[bytes, None]:
    # Committed content is immutable in the file (the spool writes only beyond it), so it is
    # read without coordinating with the spool's owner. Reads are positional and small; they
    # are served from the page cache in the common case of a reader near the head.
    while offset < fragment.end:
        want = min(chunk_bytes_max, fragment.end - offset)
        if file.closed:
            raise _FileClosedError()
        try:
            data = file.pread(want, offset - fragment.begin)
        except ValueError:
            if file.closed:
                raise _FileClosedError() from None
            raise
        if len(data) != want:
            raise FragmentContentError(
                f"local file of {fragment.journal} [{fragment.begin}, {fragment.end}) is short:"
                f" read {len(data)} of {want} bytes at offset {offset}"
            )
        yield data
        offset += want


async def _store_content(
    registry: StoreRegistry, fragment: pb.Fragment, offset: int, chunk_bytes_max: int
) -> AsyncGenerator[bytes, None]:
    # The index lists this fragment, so its file must exist: a missing one is lost content,
    # not a store that is unavailable for a moment.
    try:
        raw = await registry.get(fragment.backing_store).open(fragment)
    except FragmentNotFoundError as err:
        raise missing_fragment_error(fragment, err) from err
    # Verified against the fragment's name as it is read (FragmentIntegrityError).
    try:
        reader = FragmentContentReader(
            raw, fragment, offset, chunk_bytes_max=chunk_bytes_max, store=fragment.backing_store
        )
    except BaseException:
        await raw.aclose()
        raise
    try:
        while data := await reader.read():
            yield data
    finally:
        await reader.aclose()


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
        except (StoreError, FragmentContentError, _FileClosedError) as err:
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


async def resolve_for_reading(
    resolver: Resolver, context: Context, request: pb.ReadRequest | pb.FragmentsRequest
) -> tuple[Resolution, pb.Status]:
    """Resolve a read-only request (Read, ListFragments: any replica serves it, proxied unless
    `do_not_proxy`), and the status to answer with: OK to serve it, or why not."""
    resolution = await resolve_or_abort(
        resolver,
        context,
        request.journal,
        require_primary=False,
        may_proxy=not request.do_not_proxy,
        header=request.header if request.HasField("header") else None,
        # A client's request to see at least this etcd revision (Read only).
        min_revision=request.min_etcd_revision if isinstance(request, pb.ReadRequest) else 0,
    )
    status = cast(pb.Status, resolution.status)
    if status == pb.OK and not may_read(resolution.spec):
        status = pb.NOT_ALLOWED
    return resolution, status


async def resolve_again(
    resolver: Resolver,
    context: Context,
    request: pb.ReadRequest | pb.FragmentsRequest,
    after_revision: int,
    wait_s: float,
) -> tuple[Resolution, pb.Status]:
    """Resolve a read-only request again after proxying it failed: once the keyspace has moved
    past `after_revision` (the route may have changed), or after `wait_s` (0: at once) as it
    stands. Returns what resolve_for_reading does."""
    journal = request.journal
    try:
        if wait_s > 0:
            try:
                async with asyncio.timeout(wait_s):
                    resolution = await resolver.resolve(
                        journal,
                        require_primary=False,
                        may_proxy=True,
                        min_revision=after_revision + 1,
                    )
            except TimeoutError:
                resolution = await resolver.resolve(journal, require_primary=False, may_proxy=True)
        else:
            resolution = await resolver.resolve(journal, require_primary=False, may_proxy=True)
    except Exception as err:
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"re-resolving {journal}: {err}")
        raise AssertionError("unreachable: context.abort raises") from err
    status = cast(pb.Status, resolution.status)
    if status == pb.OK and not may_read(resolution.spec):
        status = pb.NOT_ALLOWED
    return resolution, status


async def resolve_or_abort(
    resolver: Resolver,
    context: Context,
    journal: str,
    *,
    require_primary: bool,
    may_proxy: bool,
    header: pb.Header | None,
    min_revision: int = 0,
) -> Resolution:
    """Resolve, turning failures to resolve at all into gRPC errors (a keyspace that does not
    reach ``min_revision`` within the resolver's bound: UNAVAILABLE)."""
    try:
        return await resolver.resolve(
            journal,
            require_primary=require_primary,
            may_proxy=may_proxy,
            min_revision=min_revision,
            proxy_header=header,
        )
    except (TimeoutError, ResolverStoppedError) as err:
        # (A broker going away: the client tries again, or at another broker.)
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"resolving {journal}: {err}")
    except Exception as err:
        # The resolver's own errors (a proxied request from another cluster, a broker that is
        # stopping) are not retriable as the same request to the same broker.
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"resolving {journal}: {err}")
    raise AssertionError("unreachable: context.abort raises")
