"""The primary's replication pipeline: one long-lived Replicate stream to every peer of a route.

Appends do not open streams of their own. The primary keeps one full-duplex Replicate stream to
each peer of the journal's route and reuses it for append after append, so that the setup and
synchronisation cost is paid once per route rather than once per append. The primary's own spool
is one more participant: every request scattered to the peers is applied to it in-process, and
it is always "acknowledged" at once.

Full duplex. Sending and receiving are owned separately. An append owns the *send* side while it
streams its content and its commit proposal; it then hands the pipeline to the next append (back
into the replica's pipeline slot) and, behind a *read barrier*, reads its own acknowledgements.
The barrier is a chain of events: each reader waits for the one before it to finish reading and
then releases the one after it, so that responses (which every peer sends in request order) are
read in the order their requests were sent, while the next append is already sending. In the
common case an append thus costs one round trip, overlapped with its neighbours'.

Synchronisation (``gather_sync``) is how a pipeline agrees with its peers before its first
append: every peer checks the route and revision in the stream's header, and the proposed
fragment against its own spool. A peer that knows a later, different route makes the primary
re-resolve; a peer that holds more of the journal (it took part in commits the primary missed),
or that cannot extend the current fragment (it just joined), makes the primary roll every spool
forward to a common, empty fragment at the largest offset, adopting the registers that go with
it. Nothing already committed is ever re-assigned an offset.

Errors never raise out of scatter/gather: they are recorded per peer (``send_err``/``recv_err``)
and read by the append once it is its turn, as in Gazette. A pipeline with any error is
*broken* and is torn down by its next owner. Every wait on a peer is bounded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc

from broker import metrics
from broker.fragment.spool import Spool
from broker.grpc_transport import close_stream_call_soon, send_failed
from broker.logging import get_logger
from broker.peer_dialer import Dialer as Dialer
from broker.peer_dialer import message_bytes_max as message_bytes_max
from broker.pipeline_sync import PeerError as PeerError
from broker.pipeline_sync import SyncResult as SyncResult
from broker.pipeline_sync import brief as _brief
from broker.pipeline_sync import judge_sync
from broker.protocol import protocol_pb2 as pb
from broker.protocol.content_wire import (
    BytesLike,
    encode_replicate_content,
)
from broker.replica import Slot
from broker.topology import format_id, routes_equivalent

log = get_logger(__name__)

# How long a peer may take to answer one acknowledged request, or to accept one send (gRPC flow
# control). Peers answer as soon as they have written the bytes to their spool file, so this is
# generous; a peer past it is treated as failed and the pipeline is rebuilt.
peer_response_timeout_s_default = 30.0
peer_send_timeout_s_default = 30.0
# How long tearing a pipeline down (``finish_shutdown``) waits, in all, for its readers' last
# acknowledgements and its peers' ends of stream before it cancels the streams that remain. A
# replica's stop waits for it, and so does a broker's: without this one bound its phases took a
# peer timeout each, one peer after another, from a peer that is alive but does not answer.
pipeline_close_wait_s_default = 10.0
# Content chunks at least this large are applied to the primary's spool on a worker thread while
# they are sent to peers (see ``Pipeline.scatter_content``). Below it, the hand-off costs more
# than the overlap saves.
local_offload_bytes_min = 64 << 10
# Content chunks at least this large are handed to every peer's stream first, then applied to
# the primary's spool while the transport carries them (``Pipeline.scatter_content``). Below
# it, the tasks the concurrent sends need cost more than the overlap saves.
overlap_bytes_min = 64 << 10


class Hasher(Protocol):
    """A running digest (hashlib's SHA1)."""

    def update(self, data: BytesLike, /) -> None: ...


async def _join(fut: asyncio.Future[object]) -> None:
    """Wait until ``fut`` is done, through cancellations (re-raised after): its worker thread
    is using the spool, which nobody else may touch until it finishes. The wait is bounded by
    one chunk's write and SHA1. ``fut``'s own outcome is left to the caller."""
    cancelled = False
    while not fut.done():
        try:
            await asyncio.wait((fut,))
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError()


async def _each(steps: Sequence[Awaitable[None]]) -> None:
    """Run one step per peer (each records its own errors, and raises only if cancelled): one
    in place, several at once. Concurrent steps on the peers' streams complete together, so an
    append waits for the slowest peer rather than for the sum of them, and their completions
    reach the event loop in fewer wake-ups."""
    if len(steps) == 1:
        await steps[0]
    elif steps:
        await asyncio.gather(*steps)


class PipelineInvariantError(AssertionError):
    """The local spool refused a request the pipeline derived from it: a bug."""


@dataclass
class _Peer:
    member: pb.ProcessSpec.ID
    call: Any = None  # grpc.aio.StreamStreamCall; None for the primary's own spool.
    header_sent: bool = False
    # Its end of stream was read (after close_send): the peer closed its side cleanly.
    ended: bool = False
    send_err: BaseException | None = None
    recv_err: BaseException | None = None
    last: pb.ReplicateResponse = field(default_factory=pb.ReplicateResponse)


_SEND_ERRORS = (grpc.RpcError, asyncio.InvalidStateError, OSError, TimeoutError)


class Pipeline:
    """See the module docstring. Built by ``start``; owned through the replica's pipeline slot."""

    def __init__(
        self,
        header: pb.Header,
        spool: Spool,
        spool_slot: Slot[Spool],
        *,
        response_timeout_s: float = peer_response_timeout_s_default,
        send_timeout_s: float = peer_send_timeout_s_default,
        close_wait_s: float = pipeline_close_wait_s_default,
        local_offload: bool = False,
    ) -> None:
        route = header.route
        if not 0 <= route.primary < len(route.members):
            raise ValueError(f"pipeline: route has no primary ({route})")
        self.header = header
        self.spool = spool
        self._spool_slot = spool_slot
        self._response_timeout_s = response_timeout_s
        self._send_timeout_s = send_timeout_s
        self._close_wait_s = close_wait_s
        # Whether large chunks go to the local spool on a worker thread while the peers'
        # sends proceed (see scatter_content): off, as measured not to pay.
        self._local_offload = local_offload
        self._peers = [_Peer(member) for member in route.members]
        self._primary = route.primary
        # The first reader need not wait for anyone.
        self._read_barrier = asyncio.Event()
        self._read_barrier.set()
        self._spool_released = False
        # (key, create revision) of the assignments the pipeline was built for. A member that
        # left and came back (a restarted broker) has an equivalent route but new assignment
        # keys, and a fresh spool: the pipeline must be rebuilt and re-synchronised.
        self.assignment_creations: frozenset[tuple[bytes, int]] = frozenset()

    @classmethod
    def start(
        cls,
        header: pb.Header,
        spool: Spool,
        spool_slot: Slot[Spool],
        dialer: Dialer,
        *,
        response_timeout_s: float = peer_response_timeout_s_default,
        send_timeout_s: float = peer_send_timeout_s_default,
        close_wait_s: float = pipeline_close_wait_s_default,
    ) -> Pipeline:
        """A pipeline around ``spool`` (owned by the caller, and from now on by the pipeline),
        with a Replicate stream opened to every other member of ``header.route``."""
        pln = cls(
            header,
            spool,
            spool_slot,
            response_timeout_s=response_timeout_s,
            send_timeout_s=send_timeout_s,
            close_wait_s=close_wait_s,
        )
        route = header.route
        for index, peer in enumerate(pln._peers):
            if index == pln._primary:
                continue
            endpoint = route.endpoints[index] if index < len(route.endpoints) else ""
            if not endpoint:
                peer.send_err = PeerError(f"{format_id(peer.member)}: no endpoint known")
                continue
            try:
                peer.call = dialer.replicate(endpoint)
            except (ValueError, grpc.RpcError) as exc:
                peer.send_err = exc
        return pln

    def __repr__(self) -> str:
        return f"Pipeline<{self.spool!r} rev={self.header.etcd.revision}>"

    @property
    def route(self) -> pb.Route:
        return self.header.route

    def matches(self, route: pb.Route) -> bool:
        return routes_equivalent(self.header.route, route)

    @property
    def broken(self) -> bool:
        """A peer failed, or a peer's stream already ended: the pipeline must be rebuilt."""
        if self.send_err() is not None or self.recv_err() is not None:
            return True
        return any(p.call is not None and p.call.done() for p in self._peers)

    # --- Sending ---

    async def scatter(self, request: pb.ReplicateRequest) -> None:
        """Send ``request`` to every healthy peer (at once), then apply it to the local spool.
        The first request on each stream carries the pipeline's header, addressed to that
        peer.

        All or nothing under cancellation: a proposal some peers received is applied by every
        peer and by the local spool before a cancellation of the caller (a client that went
        away just after its end of stream) is re-raised. Abandoned half-way, a commit would
        leave replicas holding content their primary rolled back: reads through the primary
        would stop short of it until a replica persisted it, minutes later.

        With no peer to send to (R=1, or every peer failed), only the local spool takes it,
        without a wait in which a cancellation could land: no task is needed to shield it."""
        if not self._sending_peers():
            self._apply_request_locally(request)
            return
        task = asyncio.ensure_future(self._scatter(request))
        cancelled = False
        while not task.done():
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                if task.done() and task.cancelled():
                    raise
                cancelled = True
        task.result()  # Its own error, if it failed.
        if cancelled:
            raise asyncio.CancelledError()

    async def _scatter(self, request: pb.ReplicateRequest) -> None:
        await _each(
            [self._send(peer, self._addressed(peer, request)) for peer in self._sending_peers()]
        )
        self._apply_request_locally(request)

    def _apply_request_locally(self, request: pb.ReplicateRequest) -> None:
        """Apply a scattered request to the local spool (unless it failed before)."""
        local = self._peers[self._primary]
        if local.send_err is None:
            try:
                result = self.spool.apply(request, primary=True)
            except OSError as exc:
                local.send_err = exc
                return
            if result.response is not None and result.response.status != pb.OK:
                raise PipelineInvariantError(
                    f"{self!r}: local spool refused a self-derived proposal: {result.response}"
                )

    def _addressed(self, peer: _Peer, request: pb.ReplicateRequest) -> pb.ReplicateRequest:
        """``request``, with the pipeline's header addressed to ``peer`` if it is the first
        request of its stream."""
        if peer.header_sent:
            return request
        out = pb.ReplicateRequest()
        out.CopyFrom(request)
        out.header.CopyFrom(self.header)
        out.header.process_id.CopyFrom(peer.member)
        return out

    async def scatter_content(
        self,
        content: BytesLike,
        content_delta: int,
        *,
        also_hash: Hasher | None = None,
        append_wire: bytes | None = None,
    ) -> None:
        """``scatter`` of a content chunk, at less cost: it is encoded once for all peers, and
        the local spool takes the bytes without a request around them. ``also_hash`` (the
        append's own running SHA1) is updated with the content meanwhile.

        ``append_wire``, if given, is the received encoding of the AppendRequest the content
        arrived in, holding the content field alone (a ContentChunk's ``wire``). Both messages
        hold the content in field 4, so with ``content_delta`` zero (the first chunk of an
        append) those very bytes also encode the ReplicateRequest: they go to the peers
        without being copied.

        The chunk goes to every peer at once (``_each``): an append waits for its slowest peer,
        not for the sum of them, and under load the sends' completions reach the event loop in
        fewer wake-ups. A large chunk (``overlap_bytes_min``) is handed to every peer's stream
        first and applied to the local spool, on the event loop, while the transport carries
        it; the sends are awaited after. (Alternated A/B, three `gazette serve` on etcd, one
        appender, durable spools, load average 11-23: R=3 1 MiB appends 52 vs 41 MB/s median,
        better in 8 of 12 pairs; R=3 1 KiB x 64 212 vs 167 appends/s, 9 of 12; R=1, which has
        no peers, 118 either way.)

        With `local_offload`, a large chunk is written (and summed) on a worker thread instead,
        in parallel with the peers' sends, and the worker owns the spool until it is done, so
        this returns only then, even if cancelled. That hand-off to the worker and back does
        not pay: at R=3 (three gazette serve, 1 MiB appends, alternated runs), applying in
        place measured as fast or faster (one appender 142/151 vs 133/140 MB/s on memory
        spools, 126/129 on tmpfs either way; four appenders 188/182 vs 168/178, and 158/167 vs
        152/151), with less CPU per MiB on the primary (5.0-5.3 vs 5.3-5.9 ms). Every stream
        already carries its header here (a pipeline's first request is its synchronising
        proposal)."""
        peers = self._sending_peers()
        if any(not peer.header_sent for peer in peers):
            raise PipelineInvariantError(f"{self!r}: content before synchronisation")
        wire = b""
        if peers:
            if append_wire is not None and content_delta == 0:
                wire = append_wire
            else:
                wire = encode_replicate_content(content, content_delta)
        if self._local_offload:
            await self._scatter_offloaded(peers, wire, content, content_delta, also_hash)
            return
        if peers and len(content) >= overlap_bytes_min:
            sends = [asyncio.ensure_future(self._send(peer, wire)) for peer in peers]
            try:
                # Each send starts, handing its bytes to gRPC; the transport carries them
                # while the local spool writes and sums them (both release the GIL) below.
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                for send in sends:
                    send.cancel()
                await asyncio.gather(*sends, return_exceptions=True)
                raise
            self._apply_locally(content, content_delta, also_hash)
            await _each(sends)
            return
        await _each([self._send(peer, wire) for peer in peers])
        self._apply_locally(content, content_delta, also_hash)

    def _apply_locally(
        self, content: BytesLike, content_delta: int, also_hash: Hasher | None
    ) -> None:
        if also_hash is not None:
            also_hash.update(content)
        local = self._peers[self._primary]
        if local.send_err is None:
            try:
                self.spool.apply_content(content, content_delta)
            except OSError as exc:
                local.send_err = exc

    async def _scatter_offloaded(
        self,
        peers: list[_Peer],
        wire: bytes,
        content: BytesLike,
        content_delta: int,
        also_hash: Hasher | None,
    ) -> None:
        """scatter_content with `local_offload`: a large chunk goes to the local spool on a
        worker thread while the peers' sends proceed."""
        local = self._peers[self._primary]
        applying: asyncio.Future[object] | None = None
        if local.send_err is None and len(content) >= local_offload_bytes_min:
            applying = asyncio.get_running_loop().run_in_executor(
                None, self.spool.apply_content, content, content_delta
            )
        try:
            await _each([self._send(peer, wire) for peer in peers])
            if also_hash is not None:
                also_hash.update(content)
        finally:
            if applying is not None:
                await _join(applying)
        if local.send_err is None:
            try:
                if applying is None:
                    self.spool.apply_content(content, content_delta)
                else:
                    applying.result()
            except OSError as exc:
                local.send_err = exc

    def _sending_peers(self) -> list[_Peer]:
        return [
            peer
            for index, peer in enumerate(self._peers)
            if index != self._primary and peer.call is not None and peer.send_err is None
        ]

    async def _send(self, peer: _Peer, out: pb.ReplicateRequest | bytes) -> None:
        try:
            async with asyncio.timeout(self._send_timeout_s):
                await peer.call.write(out)
            peer.header_sent = True
        except _SEND_ERRORS as exc:
            # Usually the peer broke the stream; its actual error is read by gather.
            peer.send_err = exc

    async def close_send(self) -> None:
        """Roll back any partial content of the local spool, give the spool back, and close the
        send side of every stream (peers then roll back theirs and end their streams), of
        all at once: a stuck peer holds the close for one send timeout, not one each."""
        self.release_spool()
        await _each([self._close_send(peer) for peer in self._sending_peers()])

    async def _close_send(self, peer: _Peer) -> None:
        try:
            async with asyncio.timeout(self._send_timeout_s):
                await peer.call.done_writing()
        except _SEND_ERRORS as exc:
            peer.send_err = exc

    def release_spool(self) -> None:
        """Roll back the local spool's pending content and return it to its slot (once)."""
        if self._spool_released:
            return
        self._spool_released = True
        spool = self.spool
        spool.must_apply(pb.ReplicateRequest(proposal=spool.fragment, registers=spool.registers))
        self._spool_slot.put(spool)

    def note_ended_peers(self) -> None:
        """Take a peer whose stream has already ended for one that failed: before close_send
        a peer ends its stream only by failing (a full disk, say). An append that is about to
        propose its commit calls this, and proposes the rollback instead if a peer failed: its
        outcome is then certain (nothing committed) instead of unknown, and a client's retry
        does not append the content a second time while that peer keeps failing."""
        for peer in self._peers:
            call = peer.call
            if call is not None and peer.send_err is None and not peer.ended and call.done():
                peer.send_err = PeerError("its stream ended before the commit (the peer failed)")

    def send_err(self) -> BaseException | None:
        for peer in self._peers:
            if peer.send_err is not None:
                return _describe(peer, peer.send_err, "send to")
        return None

    # --- Receiving ---

    def barrier(self) -> tuple[asyncio.Event, asyncio.Event]:
        """Install a read barrier: returns (wait_for, close_after). The caller, after sending
        everything and handing the pipeline on, waits for ``wait_for``, reads its responses,
        then sets ``close_after`` (always: in a ``finally``)."""
        wait_for = self._read_barrier
        self._read_barrier = close_after = asyncio.Event()
        return wait_for, close_after

    async def _read(self, peer: _Peer) -> pb.ReplicateResponse | None:
        """The peer's next response; None at a clean end of stream."""
        try:
            async with asyncio.timeout(self._response_timeout_s):
                msg = await peer.call.read()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            # grpc raises CancelledError from a read of a call cancelled locally: the streams
            # were aborted under this reader (finish_shutdown's bound passed). That is the
            # peer's failure for the reader's append, not a cancellation of the reader.
            raise PeerError("stream cancelled by the pipeline's teardown") from None
        if msg is grpc.aio.EOF:
            return None
        if not isinstance(msg, pb.ReplicateResponse):
            raise PeerError(f"unexpected message {msg!r}")
        return msg

    def has_peers_to_read(self) -> bool:
        """Whether ``gather`` has a peer to read from (none at R=1)."""
        return any(
            index != self._primary and peer.call is not None and peer.recv_err is None
            for index, peer in enumerate(self._peers)
        )

    async def gather(self) -> None:
        """Read the next response of every healthy peer (from all at once)."""
        await _each(
            [
                self._read_next(peer)
                for index, peer in enumerate(self._peers)
                if index != self._primary and peer.call is not None and peer.recv_err is None
            ]
        )

    async def _read_next(self, peer: _Peer) -> None:
        try:
            resp = await self._read(peer)
        except (grpc.RpcError, PeerError, TimeoutError, asyncio.InvalidStateError) as exc:
            peer.recv_err = exc
            return
        if resp is None:
            # An end of stream is only expected by gather_eof.
            peer.recv_err = PeerError("unexpected end of stream")
            return
        peer.last = resp

    async def gather_ok(self) -> None:
        """gather, treating any status but OK as an error of that peer."""
        await self.gather()
        for index, peer in enumerate(self._peers):
            if index == self._primary or peer.call is None or peer.recv_err is not None:
                continue
            if peer.last.status != pb.OK:
                peer.recv_err = PeerError(f"unexpected response {_brief(peer.last)}")

    async def gather_sync(self) -> SyncResult:
        """gather the answers to a synchronising proposal (see the module docstring)."""
        metrics.PIPELINE_SYNCS.inc()
        await self.gather()
        answers = {
            index: peer.last
            for index, peer in enumerate(self._peers)
            if index != self._primary and peer.call is not None and peer.recv_err is None
        }
        out, errors = judge_sync(self.header, self.spool.fragment.end, answers)
        for index, err in errors.items():
            self._peers[index].recv_err = err
        return out

    async def gather_eof(self) -> None:
        """Read the expected end of every healthy peer's stream (after close_send), from all
        at once."""
        await _each(
            [
                self._read_eof(peer)
                for index, peer in enumerate(self._peers)
                if index != self._primary and peer.call is not None and peer.recv_err is None
            ]
        )

    async def _read_eof(self, peer: _Peer) -> None:
        try:
            resp = await self._read(peer)
        except (grpc.RpcError, PeerError, TimeoutError, asyncio.InvalidStateError) as exc:
            peer.recv_err = exc
            return
        if resp is not None:
            peer.recv_err = PeerError(f"expected end of stream, got {_brief(resp)}")
        else:
            peer.ended = True

    def recv_err(self) -> BaseException | None:
        for peer in self._peers:
            if peer.recv_err is not None:
                return _describe(peer, peer.recv_err, "recv from")
        return None

    # --- Teardown ---

    def begin_shutdown(self) -> None:
        """The synchronous half of a shutdown: give the spool back at once (so that a new
        pipeline can be built right away). ``finish_shutdown`` must follow."""
        self.release_spool()

    async def finish_shutdown(self, *, expect_err: bool) -> None:
        """Close every stream gracefully, after the readers still owed responses are done;
        once ``close_wait_s`` has passed, cancel every stream, whatever remains.

        Cancelling loses nothing acknowledged: an append is acknowledged to its client only
        once every peer acknowledged its commit, and a reader cut short fails its append
        instead (the peers, their streams cancelled, roll back what they hold uncommitted)."""
        wait_for, close_after = self.barrier()
        try:
            async with asyncio.timeout(self._close_wait_s):
                await self.close_send()
                if not expect_err and self.send_err() is not None:
                    log.warning("tearing down pipeline: close failed", error=str(self.send_err()))
                await wait_for.wait()
                await self.gather_eof()
            if not expect_err and self.recv_err() is not None:
                log.warning(
                    "tearing down pipeline: streams ended badly", error=str(self.recv_err())
                )
        except TimeoutError:
            log.warning(
                "tearing down pipeline: peers did not end their streams in time; cancelled",
                journal=self.spool.journal,
                peers=[format_id(peer.member) for peer in self._unended_peers()],
                readers_done=wait_for.is_set(),
                close_wait_s=self._close_wait_s,
            )
        finally:
            close_after.set()
            self.abort_streams()

    def _unended_peers(self) -> list[_Peer]:
        """The peers whose stream neither ended cleanly nor failed: they did not answer."""
        return [
            peer
            for index, peer in enumerate(self._peers)
            if index != self._primary
            and peer.call is not None
            and not peer.ended
            and peer.recv_err is None
        ]

    def abort_streams(self) -> None:
        """Cancel every peer stream (peers roll back whatever was not committed)."""
        for peer in self._peers:
            if peer.call is not None:
                # Also a stream the peer ended: its request side must still be finished.
                close_stream_call_soon(peer.call)


def _describe(peer: _Peer, err: BaseException, verb: str) -> PeerError:
    if isinstance(err, grpc.aio.AioRpcError):
        detail = f"{err.code().name}: {err.details()}"
        if send_failed(err):
            # gRPC's own failure to send on a stream the peer already ended (a full disk
            # there, say): the peer's status lost the race with our write, so only its log
            # has the reason. Say where to look rather than leave "Internal error" alone.
            detail += f" (the stream broke: {format_id(peer.member)}'s log says why)"
    else:
        detail = str(err) or type(err).__name__
    out = PeerError(f"{verb} {format_id(peer.member)}: {detail}")
    out.__cause__ = err
    return out
