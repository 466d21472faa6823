"""The ListFragments RPC: a page of a journal's fragments, local and persisted; and the
FragmentStoreHealth RPC: the health of a fragment store (fragment/store_health.py).

Answered from a replica's FragmentIndex (any broker of the route), once the index has listed the
stores at least once: before that, it knows only the local spool and would answer a partial
listing. Fragments come in offset order, at most `page_limit` per response (1000 by default,
10000 at most); `next_page_token` is the begin offset to ask for next, or 0 after the last page.
A broker outside the route proxies the listing to a member, passing over members that fail
UNAVAILABLE before answering, as reads do (``broker.proxy_retry``).

A time range selects fragments by modification time: `begin_mod_time` drops fragments persisted
before it, and a non-zero `end_mod_time` drops those persisted after it *and* those not yet
persisted (they have no modification time). With `signatureTTL`, each persisted fragment comes
with a signed URL of its file, valid that long.

FragmentStoreHealth answers OK, or FRAGMENT_STORE_UNHEALTHY with the error of the store's last
health check (waiting for its first check, within a bound); with `check_delete`, a healthy
store is also put through the delete probe under `check_delete_prefix`. Any broker answers,
about any store URL (not only the stores of its journals), with an unrouted header.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
from collections.abc import Callable, Sequence
from typing import Final

import grpc
import grpc.aio

from broker.client.route_cache import ChannelPool
from broker.fragment.index import IndexClosedError
from broker.fragment.store_health import (
    FirstCheckPendingError,
    StoreHealthMonitor,
    StoreUnhealthyError,
    check_delete,
)
from broker.fragment.stores.base import StoreError, StoreURL, signed_url_ttl_max_s
from broker.fragment.stores.registry import StoreRegistry
from broker.protocol import protocol_pb2 as pb
from broker.protocol.tokens import validate_path_component
from broker.protocol.urls import FRAGMENT_STORE_SCHEMES, validate_fragment_store
from broker.protocol.validate import (
    ValidationError,
    at,
    validate_duration,
    validate_journal_name,
)
from broker.proxy_retry import ProxyAttempts, RetryProxyError
from broker.read_api import (
    Context,
    Resolver,
    proxy_header,
    proxy_target,
    resolve_again,
    resolve_for_reading,
    validate_request_header,
)

# Fragments per response when the request sets no page limit, and the largest limit allowed
# (Gazette's values).
page_limit_default: Final = 1000
page_limit_max: Final = 10_000
# How long a listing waits for the replica's first store listing before failing UNAVAILABLE.
first_refresh_wait_s_default: Final = 30.0
# Longest a check_delete_prefix may be (Gazette's: a journal name's).
check_delete_prefix_len_max: Final = 512


def validate_fragments_request(request: pb.FragmentsRequest) -> None:
    """Gazette's FragmentsRequest rules, with the offending field named."""
    validate_request_header(request)
    with at("journal"):
        validate_journal_name(request.journal)
    if request.end_mod_time != 0 and request.end_mod_time < request.begin_mod_time:
        raise ValidationError(
            f"must be 0 or >= begin_mod_time {request.begin_mod_time} (got {request.end_mod_time})",
            "end_mod_time",
        )
    if request.next_page_token < 0:
        raise ValidationError(f"must be >= 0 (got {request.next_page_token})", "next_page_token")
    if not 0 <= request.page_limit <= page_limit_max:
        raise ValidationError(
            f"must be in [0, {page_limit_max}] (got {request.page_limit})", "page_limit"
        )
    if request.HasField("signatureTTL"):
        with at("signatureTTL"):
            validate_duration(request.signatureTTL)
        ttl_s = request.signatureTTL.ToNanoseconds() / 1e9
        if not 0 < ttl_s <= signed_url_ttl_max_s:
            raise ValidationError(
                f"must be in (0s, {signed_url_ttl_max_s:g}s] (got {ttl_s:g}s)", "signatureTTL"
            )


def _begin(fragment: pb.Fragment) -> int:
    return fragment.begin


def select_page(
    request: pb.FragmentsRequest, fragments: Sequence[pb.Fragment]
) -> tuple[list[pb.Fragment], int]:
    """The fragments of one page (from the first beginning at or after `next_page_token`) and
    the token of the next page (0 if none). `fragments` are in offset order."""
    limit = request.page_limit or page_limit_default
    position = bisect.bisect_left(fragments, request.next_page_token, key=_begin)
    out: list[pb.Fragment] = []
    while position < len(fragments) and len(out) < limit:
        fragment = fragments[position]
        position += 1
        mod_time = fragment.mod_time
        if mod_time != 0 and mod_time < request.begin_mod_time:
            continue  # Persisted before the range.
        if request.end_mod_time != 0 and (mod_time == 0 or mod_time > request.end_mod_time):
            continue  # Persisted after the range, or not persisted at all.
        out.append(fragment)
    next_token = fragments[position].begin if position < len(fragments) else 0
    return out, next_token


class FragmentsAPI:
    """The ListFragments RPC handler: `list_fragments(request, context)` is a grpc.aio unary
    method body."""

    def __init__(
        self,
        resolver: Resolver,
        registry: StoreRegistry,
        channels: ChannelPool,
        *,
        zone: str = "",
        first_refresh_wait_s: float = first_refresh_wait_s_default,
    ) -> None:
        self._resolver = resolver
        self._first_refresh_wait_s = first_refresh_wait_s
        self._registry = registry
        self._channels = channels
        self._zone = zone

    async def list_fragments(
        self, request: pb.FragmentsRequest, context: Context
    ) -> pb.FragmentsResponse:
        try:
            validate_fragments_request(request)
        except ValidationError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"FragmentsRequest.{err}")
        resolution, status = await resolve_for_reading(self._resolver, context, request)
        attempts = ProxyAttempts(self._channels)
        while status == pb.OK and (not resolution.is_local or resolution.replica is None):
            try:
                return await self._proxy(request, resolution.header, context, attempts)
            except RetryProxyError as retry:
                revision = resolution.header.etcd.revision
                resolution, status = await resolve_again(
                    self._resolver, context, request, revision, retry.wait_s
                )
        replica = resolution.replica
        if status != pb.OK or replica is None:
            return pb.FragmentsResponse(status=status, header=resolution.header)

        index = replica.index
        try:
            await index.wait_first_refresh(self._first_refresh_wait_s)
        except (TimeoutError, IndexClosedError) as err:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"fragments of {request.journal} are not listed yet: {str(err) or 'timed out'}",
            )
        page, next_token = select_page(request, index.fragments())
        response = pb.FragmentsResponse(
            status=pb.OK, header=resolution.header, next_page_token=next_token
        )
        sign_ttl_s = (
            request.signatureTTL.ToNanoseconds() / 1e9 if request.HasField("signatureTTL") else 0.0
        )
        for fragment in page:
            entry = response.fragments.add(spec=fragment)
            if sign_ttl_s and fragment.backing_store and fragment.mod_time:
                try:
                    store = self._registry.get(fragment.backing_store)
                    entry.signed_url = await store.signed_url(fragment, sign_ttl_s)
                except (StoreError, ValidationError) as err:
                    await context.abort(
                        grpc.StatusCode.UNAVAILABLE,
                        f"signing {fragment.backing_store} fragment of {request.journal}: {err}",
                    )
        return response

    async def _proxy(
        self,
        request: pb.FragmentsRequest,
        header: pb.Header,
        context: Context,
        attempts: ProxyAttempts,
    ) -> pb.FragmentsResponse:
        """The listing from a member of the route. Raises RetryProxyError if the member failed
        and another try may do better (see broker.proxy_retry)."""
        member, endpoint = proxy_target(header, self._zone, attempts.exclude(header.route))
        if not endpoint:
            if (retry := attempts.none_left()) is not None:
                raise retry
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"no endpoint to proxy the listing of {request.journal} to",
            )
        forwarded = pb.FragmentsRequest()
        forwarded.CopyFrom(request)
        forwarded.header.CopyFrom(proxy_header(header, member))
        try:
            response: pb.FragmentsResponse = await self._channels.stub(endpoint).ListFragments(
                forwarded
            )
        except grpc.aio.AioRpcError as err:
            if (retry := attempts.failed_on(endpoint, err)) is not None:
                raise retry from err
            await context.abort(err.code(), f"proxied listing via {endpoint}: {err.details()}")
        return response


# --- FragmentStoreHealth ------------------------------------------------------------------------


def validate_store_health_request(request: pb.FragmentStoreHealthRequest) -> None:
    """Gazette's FragmentStoreHealthRequest rules (our in-process schemes, e.g. memory://, are
    left to the store registry)."""
    with at("fragment_store"):
        if StoreURL.parse(request.fragment_store).scheme in FRAGMENT_STORE_SCHEMES:
            validate_fragment_store(request.fragment_store)
    prefix = request.check_delete_prefix
    if not prefix:
        return
    with at("check_delete_prefix"):
        if not request.check_delete:
            raise ValidationError("cannot be set when check_delete is false")
        if not prefix.endswith("/"):
            raise ValidationError(f"must end in '/' (got {prefix!r})")
        trimmed = prefix[:-1]
        if trimmed == ".." or trimmed.startswith("../"):
            raise ValidationError(f"cannot traverse outside the store (got {prefix!r})")
        validate_path_component(trimmed, 1, check_delete_prefix_len_max)


class StoreHealthAPI:
    """The FragmentStoreHealth RPC handler. ``header_of`` gives the unrouted header to answer
    with (this broker, no route, the keyspace's revision)."""

    def __init__(self, monitor: StoreHealthMonitor, header_of: Callable[[], pb.Header]) -> None:
        self._monitor = monitor
        self._header_of = header_of

    async def fragment_store_health(
        self, request: pb.FragmentStoreHealthRequest, context: Context
    ) -> pb.FragmentStoreHealthResponse:
        url = request.fragment_store
        response = pb.FragmentStoreHealthResponse(status=pb.OK, header=self._header_of())
        try:
            validate_store_health_request(request)
            if not self._monitor.has_room_for(url):
                # Answered without building a store for yet another URL a client names.
                _, error = self._monitor.status(url)
                response.status = pb.FRAGMENT_STORE_UNHEALTHY
                response.store_health_error = str(error)
                return response
            with at("fragment_store"):
                store = self._monitor.registry.get(url)
        except ValidationError as err:  # StoreURLError included: an unsupported scheme.
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"FragmentStoreHealthRequest.{err}"
            )
        next_check, error = self._monitor.status(url)
        if isinstance(error, FirstCheckPendingError):
            # The first check is bounded by its own timeout; wait a little longer than that.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._monitor.schedule.check_timeout_s + 5.0):
                    await next_check.wait()
            _, error = self._monitor.status(url)
        if error is None and request.check_delete:
            try:
                await check_delete(store, request.check_delete_prefix)
            except StoreUnhealthyError as err:
                error = err
        if error is not None:
            response.status = pb.FRAGMENT_STORE_UNHEALTHY
            response.store_health_error = str(error)
        return response
