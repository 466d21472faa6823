"""Resolving a read-only request (Read, and ListFragments: fragments_api.py): the resolver
as reads see it, whether a journal may be read, the route member a request is proxied to,
the request header's checks, and resolution with its failures turned into gRPC errors.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol, TypeAlias, cast

import grpc
import grpc.aio

from broker.client.route_cache import pick_endpoint
from broker.fragment.index import FragmentIndex
from broker.protocol import protocol_pb2 as pb
from broker.protocol.validate import ValidationError, at
from broker.resolve_errors import ProxyTargetMismatchError, ResolverStoppedError
from broker.topology import validate_header

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
    except (TimeoutError, ResolverStoppedError, ProxyTargetMismatchError) as err:
        # (A broker going away: the client tries again, or at another broker. A proxied read
        # meant for the broker that had this address before: the proxy's view is behind.)
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"resolving {journal}: {err}")
    except Exception as err:
        # The resolver's own errors (a proxied request from another cluster, a broker that is
        # stopping) are not retriable as the same request to the same broker.
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"resolving {journal}: {err}")
    raise AssertionError("unreachable: context.abort raises")
