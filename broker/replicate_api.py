"""The Replicate RPC: the peer side of a primary's replication pipeline.

A primary opens one Replicate stream per peer and keeps it across many appends. The first
request carries the primary's header (route, etcd revision, and this peer's ID) and a proposal.
The peer resolves the journal at that revision (waiting for its own KeySpace to catch up if
needed) and refuses with WRONG_ROUTE if it resolves a different route: both sides then learn of
the disagreement, and the one behind re-resolves.

Otherwise the peer takes its replica's spool *for the whole life of the stream*. That is the
heart of the distributed lock an append relies on: while a primary's stream holds a peer's
spool, no other primary can replicate to it. Each request is applied to the spool by the same
rules every replica follows (fragment/spool.py); answers go only to acknowledged requests, the
first one carrying the peer's header. When the stream ends, for whatever reason, uncommitted
content is rolled back and the spool is returned to its slot.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from broker.fragment.spool import Spool, SpoolRequestError
from broker.fragment.spool_types import validate_proposal_request
from broker.keyspace.keyspace import WatchStoppedError
from broker.logging import get_logger
from broker.protocol import protocol_pb2 as pb
from broker.protocol.content_wire import ContentChunk
from broker.protocol.labels import is_quorum_journal
from broker.protocol.validate import ValidationError, at
from broker.replica import Replica, SlotInvalidatedError
from broker.resolver import Resolution, ResolveError, Resolver
from broker.topology import as_status, routes_equivalent, validate_header

log = get_logger(__name__)

# A stream re-resolves each time the journal's assignments change while it waits for the
# spool. Each retry follows a real keyspace change, so this bound is only reached by a journal
# whose assignments churn without rest; the primary then retries its pipeline.
resolve_attempts_max = 100

# A content message arrives as a ContentChunk when it carries content alone (content_wire.py).
ReplicateMessage = pb.ReplicateRequest | ContentChunk


def validate_first_request(req: pb.ReplicateRequest) -> None:
    """The header, and the proposal request as any spool checks it (a valid fragment, valid
    registers, no content), as Gazette's ReplicateRequest.Validate does up front: checked only
    once the spool is taken, a malformed first message would wait for a spool the primary's
    stream holds, until its deadline, rather than be refused at once."""
    if not req.HasField("header"):
        raise ValidationError("expected in the first message", "header")
    with at("header"):
        validate_header(req.header)
    if not req.HasField("proposal"):
        raise ValidationError("expected in the first message", "proposal")
    if not req.acknowledge:
        # The first message is the primary's sync proposal, which it awaits the answer of (and
        # the answer carries this broker's header); Gazette refuses one without it too.
        raise ValidationError("expected with the header (the first message)", "acknowledge")
    validate_proposal_request(req, req.proposal.journal)


def validate_later_request(req: pb.ReplicateRequest) -> None:
    if req.HasField("header"):
        raise ValidationError("unexpected after the first message", "header")


class ReplicateApi:
    """The Replicate RPC handler of one broker."""

    def __init__(self, resolver: Resolver) -> None:
        self._resolver = resolver

    async def replicate(
        self,
        request_iterator: AsyncIterator[ReplicateMessage],
        context: grpc.aio.ServicerContext,
    ) -> None:
        stream = aiter(request_iterator)
        received = await anext(stream, None)
        if received is None:
            return
        # A first message of content alone is invalid; validation names what it lacks.
        first = received.message() if isinstance(received, ContentChunk) else received
        try:
            validate_first_request(first)
        except ValidationError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"replicate: {err}")
        spec = self._resolver.lookup_spec(first.proposal.journal)
        if spec is not None and is_quorum_journal(spec.labels):
            # Quorum journals replicate over gazette.quorum.Replica; their spools are written
            # by the quorum applier only (broker/quorum_shell/apply.py).
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"replicate: journal {first.proposal.journal!r} is replicated in quorum mode",
            )

        acquired = await self._acquire(first, context)
        if acquired is None:
            return
        resolved, replica, spool = acquired
        try:
            # A replica that stops (its journal was unassigned here) ends the stream at once,
            # wherever it waits, so that its spool comes back for the shutdown to persist; the
            # primary sees the stream end and rebuilds its pipeline for the new route.
            async with asyncio.timeout(None) as scope:
                loop = asyncio.get_running_loop()
                unregister = replica.on_stop(lambda: scope.reschedule(loop.time()))
                try:
                    await self._serve(first, stream, spool, resolved.header, context)
                finally:
                    unregister()
        except TimeoutError:
            stopping = True
        else:
            stopping = False
        finally:
            # Whatever ended the stream, content not yet committed is dropped.
            spool.must_apply(
                pb.ReplicateRequest(proposal=spool.fragment, registers=spool.registers)
            )
            replica.spool_slot.put(spool)
        if stopping:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, f"replicate: {replica.journal}: replica stopping"
            )

    async def _acquire(
        self, first: pb.ReplicateRequest, context: grpc.aio.ServicerContext
    ) -> tuple[Resolution, Replica, Spool] | None:
        journal = first.proposal.journal
        for _ in range(resolve_attempts_max):
            try:
                resolved = await self._resolver.resolve(
                    journal, require_primary=False, may_proxy=False, proxy_header=first.header
                )
            except ResolveError as err:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"replicate: {err}")
                raise AssertionError("not reached") from err
            except (TimeoutError, WatchStoppedError) as err:
                await context.abort(grpc.StatusCode.UNAVAILABLE, f"replicate: {err}")
                raise AssertionError("not reached") from err
            if resolved.status != pb.OK:
                await context.write(
                    pb.ReplicateResponse(status=as_status(resolved.status), header=resolved.header)
                )
                return None
            if not routes_equivalent(resolved.route, first.header.route):
                await context.write(
                    pb.ReplicateResponse(status=pb.WRONG_ROUTE, header=resolved.header)
                )
                return None
            replica = resolved.replica
            if replica is None:
                await context.abort(
                    grpc.StatusCode.INTERNAL, f"replicate: {journal}: resolved without a replica"
                )
                raise AssertionError("not reached")
            try:
                spool = await replica.spool_slot.take(resolved.invalidated)
            except SlotInvalidatedError:
                continue  # The assignments changed while we waited: resolve again.
            # A spool recovered from this broker's data directory is settled against the
            # primary's first proposal before anything applies to it (spool_recovery.py).
            try:
                settled = await replica.settle_recovery(spool, first.proposal, resolved.invalidated)
            except BaseException:
                replica.spool_slot.put(spool)
                raise
            if not settled:
                replica.spool_slot.put(spool)
                if resolved.invalidated.is_set():
                    continue
                await context.abort(
                    grpc.StatusCode.UNAVAILABLE,
                    f"replicate: {journal}: recovered spool awaits the first store listing",
                )
                raise AssertionError("not reached")
            return resolved, replica, spool
        await context.abort(
            grpc.StatusCode.UNAVAILABLE,
            f"replicate: {journal}: assignments kept changing ({resolve_attempts_max} attempts)",
        )
        raise AssertionError("not reached")

    async def _serve(
        self,
        req: ReplicateMessage,
        stream: AsyncIterator[ReplicateMessage],
        spool: Spool,
        header: pb.Header,
        context: grpc.aio.ServicerContext,
    ) -> None:
        first_response = True
        while True:
            try:
                if isinstance(req, ContentChunk):
                    # Content alone (the bulk of the stream): no request to build, no answer.
                    result = spool.apply_content(req.content, req.content_delta)
                    acknowledge = False
                else:
                    result = spool.apply(req, primary=False)
                    acknowledge = req.acknowledge
            except (SpoolRequestError, ValidationError) as err:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"replicate: {err}")
            except OSError as err:
                log.error("replicate: spool I/O failed", journal=spool.journal, error=str(err))
                await context.abort(grpc.StatusCode.UNAVAILABLE, f"replicate: spool: {err}")
            resp = result.response
            if acknowledge:
                out = resp if resp is not None else pb.ReplicateResponse(status=pb.OK)
                if first_response:
                    out.header.CopyFrom(header)
                    first_response = False
                await context.write(out)
            elif resp is not None and resp.status != pb.OK:
                # Unacknowledged proposals are rolls the primary knows every peer accepts; one
                # that does not apply here means this spool and the primary's disagree.
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"replicate: unacknowledged proposal failed: {pb.Status.Name(resp.status)}",
                )
            nxt = await anext(stream, None)
            if nxt is None:
                return
            try:
                if not isinstance(nxt, ContentChunk):  # A ContentChunk has no header.
                    validate_later_request(nxt)
            except ValidationError as err:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"replicate: {err}")
            req = nxt
