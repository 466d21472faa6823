"""The append state machine: every Append RPC (and every pulse) is one run of it.

An append must be all-or-nothing, serializable, durable on every replica of the journal's route
before it reports success, and must never re-assign a journal offset (docs/architecture.md,
Invariants). The machine converges on the distributed state those guarantees need, a
*synchronised* replication pipeline owned by this append, possibly backing up and re-resolving
several times, and then streams the client's content through it. Its states and errors are
declared in append_state.py.

States (one ``on_<state>`` handler each; tests drive them one at a time):

  RESOLVE                 resolve the journal, first waiting for any etcd revision we know of.
                          Fully suspended, and the append resumes: UPDATE_SUSPEND. Not the
                          primary: AWAIT_DESIRED_REPLICAS (we will proxy). Already own the
                          pipeline: START_PIPELINE. Else ACQUIRE_PIPELINE.
  ACQUIRE_PIPELINE        take the replica's pipeline slot (exclusive), or RESOLVE if the
                          resolution is invalidated while waiting.
  START_PIPELINE          a pipeline of the resolved route: UPDATE_ASSIGNMENTS. Otherwise tear
                          down any old one, take the spool, build a new one: SEND_PIPELINE_SYNC.
  SEND_PIPELINE_SYNC      propose the current (or a rolled) fragment and the registers to all.
  RECV_PIPELINE_SYNC      all agree: UPDATE_ASSIGNMENTS. A peer is ahead, or cannot extend the
                          fragment: roll everyone forward (SEND_PIPELINE_SYNC). A peer knows a
                          later route: RESOLVE at that revision.
  UPDATE_ASSIGNMENTS      advertise the synchronised route in the assignment values (a
                          compare-and-set on their mod revisions), then RESOLVE at the new
                          revision; a no-op when they already advertise it.
  AWAIT_DESIRED_REPLICAS  too many replicas (the allocator is moving the journal): RESOLVE at
                          the next revision. Too few: INSUFFICIENT_JOURNAL_BROKERS. Not primary:
                          PROXY. Else VALIDATE_PRECONDITIONS.
  VALIDATE_PRECONDITIONS  the primary store's health, registers, offsets and suspension (see
                          ``on_validate_preconditions``); UPDATE_SUSPEND if the append changes
                          the journal's suspension.
  UPDATE_SUSPEND          write the new suspension into the JournalSpec (a compare-and-set on
                          its and the assignments' mod revisions), then RESOLVE at that
                          revision (append_suspend.py).
  STREAM_CONTENT          forward each client chunk to all replicas; on the commit marker (an
                          empty chunk, then end of stream) propose the commit, on anything else
                          propose the rollback. Then READ_ACKNOWLEDGEMENTS.
  READ_ACKNOWLEDGEMENTS   hand the pipeline to the next append, and in turn read every
                          replica's acknowledgement: FINISHED, or ERROR.
  ERROR, PROXY, FINISHED  terminal.

One round trip in the common case: a pipeline already synchronised for the resolved route makes
every state before STREAM_CONTENT a no-op, and the only wait on the network is reading the
acknowledgements, overlapped with the next append's streaming.

Errors are of two kinds, as in Gazette: a *status* (``resolved.status`` != OK) is an answer the
client gets in its AppendResponse; an *error* (``err``) is a failure of the RPC itself.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from broker import metrics
from broker.append_rate import burst_bytes_for
from broker.append_rules import (
    apply_register_updates,
    assignment_creations,
    complete_despite_cancellation,
    desired_replication,
    has_register_updates,
    may_write,
    update_assignments,
    validate_content_chunk,
)
from broker.append_state import TERMINAL as TERMINAL
from broker.append_state import AppendStreamError as AppendStreamError
from broker.append_state import ClientAbortedError as ClientAbortedError
from broker.append_state import ExpectedEOFError as ExpectedEOFError
from broker.append_state import FSMStateError as FSMStateError
from broker.append_state import IndexNotReadyError as IndexNotReadyError
from broker.append_state import (
    RegisterUpdateWithEmptyAppendError as RegisterUpdateWithEmptyAppendError,
)
from broker.append_state import State as State
from broker.append_state import UnexpectedEOFError as UnexpectedEOFError
from broker.append_suspend import (
    CONTENT_FORBIDDEN,
    NO_RESUME,
    RESUME,
    SuspendStep,
    decide,
    index_is_dirty,
    update_journal_spec,
)
from broker.fragment.naming import sum_from_digest
from broker.fragment.store_health import StoreHealthMonitor
from broker.keyspace.backend import (
    Backend,
    KeySpaceError,
)
from broker.keyspace.keyspace import WatchStoppedError
from broker.logging import get_logger
from broker.pipeline import Dialer, Pipeline, local_offload_bytes_min
from broker.protocol import protocol_pb2 as pb
from broker.protocol.content_wire import ContentChunk
from broker.protocol.limits import labels_per_set_max
from broker.protocol.selector import matches
from broker.protocol.validate import ValidationError
from broker.replica import Replica, SlotInvalidatedError, wait_first
from broker.resolver import Resolution, ResolveError, Resolver
from broker.topology import (
    route_matches_assignments,
    routes_equivalent,
)

log = get_logger(__name__)

T = TypeVar("T")

# How long an append waits for the replica's first fragment store listing before it fails.
# Until that listing, the broker cannot know the journal's largest offset (another broker may
# have persisted content beyond what this one holds), so it must not append.
index_refresh_wait_s_default = 30.0


@dataclass(frozen=True)
class AppendEnv:
    """What the append machine needs of its broker."""

    resolver: Resolver
    backend: Backend
    dialer: Dialer
    # Wall clock, Unix seconds: flush intervals are aligned to it.
    clock: Callable[[], float]
    index_refresh_wait_s: float = index_refresh_wait_s_default
    # Health of fragment stores: appends wait for the primary store's (None: not checked).
    store_health: StoreHealthMonitor | None = None
    peer_response_timeout_s: float = 30.0
    peer_send_timeout_s: float = 30.0


# --- The machine -------------------------------------------------------------------------------

# A content message arrives as a ContentChunk when it carries content alone (content_wire.py).
AppendMessage = pb.AppendRequest | ContentChunk
Recv = Callable[[], Awaitable[tuple[AppendMessage | None, BaseException | None]]]


class AppendFSM:
    """One append. ``req`` is the validated first message of the RPC."""

    def __init__(self, env: AppendEnv, req: pb.AppendRequest) -> None:
        self.env = env
        self.req = req
        self.state = State.RESOLVE
        self.resolved: Resolution | None = None
        self.err: BaseException | None = None
        # The pipeline, and the slot it must go back to while this append owns it.
        self.pln: Pipeline | None = None
        self._pln_slot_of: Replica | None = None
        # True while requests are on the wire whose answers or rollback are still owed: giving
        # the pipeline back then would hand the next append someone else's responses.
        self._pln_dirty = False
        # The etcd revision to resolve at: first the client's (Gazette's min_etcd_revision),
        # then whatever a step learns (a peer's later route, our own etcd update).
        self.read_through_rev = req.min_etcd_revision
        self.roll_to_offset = 0
        self.registers = pb.LabelSet()
        # The suspension UPDATE_SUSPEND writes; and whether to roll the spool once suspended.
        self.next_suspend: pb.JournalSpec.Suspend | None = None
        self._roll_for_suspension = False
        self.client_commit = False
        self.client_fragment: pb.Fragment | None = None
        self._client_summer = hashlib.sha1()
        # The summing of the append's last large chunk, on a worker thread (see _sum_content).
        self._client_summing: asyncio.Future[None] | None = None

    # --- Accessors ---

    @property
    def owns_pipeline(self) -> bool:
        return self._pln_slot_of is not None

    @property
    def status(self) -> int:
        return self.resolved.status if self.resolved is not None else pb.OK

    def _res(self) -> Resolution:
        if self.resolved is None:
            raise FSMStateError(f"{self.state}: no resolution")
        return self.resolved

    def _replica(self) -> Replica:
        replica = self._res().replica
        if replica is None:
            raise FSMStateError(f"{self.state}: resolved locally without a replica")
        return replica

    def _spec(self) -> pb.JournalSpec:
        spec = self._res().spec
        if spec is None:
            raise FSMStateError(f"{self.state}: resolved without a spec")
        return spec

    def _pipeline(self) -> Pipeline:
        if self.pln is None:
            raise FSMStateError(f"{self.state}: no pipeline")
        return self.pln

    def throttle(self, size: int, now: float) -> float:
        """Seconds to hold back ``size`` more content bytes of this append, received at ``now``
        (a monotonic clock), to keep the journal within its spec's ``max_append_rate``. Zero
        unless this append streams content as the journal's primary. Called by the append's
        stream reader (append_api.ChunkReceiver), which does the waiting, before handing the
        chunk on: throttling slows the client through gRPC flow control, it fails nothing."""
        if self.state is not State.STREAM_CONTENT or self.resolved is None:
            return 0.0
        replica, spec = self.resolved.replica, self.resolved.spec
        if replica is None or spec is None:
            return 0.0
        bucket = replica.append_rate
        rate = spec.max_append_rate
        bucket.configure(rate, burst_bytes_max=burst_bytes_for(rate))
        return bucket.reserve(size, now)

    def _must_state(self, state: State) -> None:
        if self.state is not state:
            raise FSMStateError(f"handler of {state.value} called in state {self.state.value}")

    def _fail(self, err: BaseException | None = None, status: int | None = None) -> None:
        if err is not None:
            self.err = err
        if status is not None:
            self._res().status = status
        self.state = State.ERROR

    # --- Driving ---

    async def run_to(self, target: State) -> bool:
        """Run handlers until ``target`` (True) or another terminal state (False)."""
        handlers: dict[State, Callable[[], Awaitable[None]]] = {
            State.RESOLVE: self.on_resolve,
            State.ACQUIRE_PIPELINE: self.on_acquire_pipeline,
            State.START_PIPELINE: self.on_start_pipeline,
            State.SEND_PIPELINE_SYNC: self.on_send_pipeline_sync,
            State.RECV_PIPELINE_SYNC: self.on_recv_pipeline_sync,
            State.UPDATE_ASSIGNMENTS: self.on_update_assignments,
            State.AWAIT_DESIRED_REPLICAS: self.on_await_desired_replicas,
            State.VALIDATE_PRECONDITIONS: self.on_validate_preconditions,
            State.UPDATE_SUSPEND: self.on_update_suspend,
        }
        while self.state is not target:
            handler = handlers.get(self.state)
            if handler is None:
                return False  # Terminal, or STREAM_CONTENT which needs client input.
            await handler()
        return True

    async def run(self, recv: Recv) -> None:
        """Run the whole append, reading content chunks with ``recv`` (which returns (message,
        None), (None, None) at the end of the stream, or (None, error))."""
        try:
            if not await self.run_to(State.STREAM_CONTENT):
                return
            while self.state is State.STREAM_CONTENT:
                try:
                    req, err = await recv()
                except asyncio.CancelledError:
                    # The client went away mid-append: roll back on every replica, keeping the
                    # pipeline healthy for the appends queued behind this one.
                    await complete_despite_cancellation(self._roll_back(ClientAbortedError()))
                    raise
                await self.on_stream_content(req, err)
            await complete_despite_cancellation(self.on_read_acknowledgements())
        finally:
            self.return_pipeline()

    async def _roll_back(self, err: BaseException) -> None:
        if self.state is State.STREAM_CONTENT:
            await self.on_stream_content(None, err)
        if self.state is State.READ_ACKNOWLEDGEMENTS:
            await self.on_read_acknowledgements()

    def return_pipeline(self) -> None:
        """Give the pipeline back if this append still owns it. A pipeline left mid-exchange
        (this append was cancelled or failed while requests were outstanding) is torn down
        rather than handed on."""
        replica, self._pln_slot_of = self._pln_slot_of, None
        if replica is None:
            return
        pln = self.pln
        if pln is not None and self._pln_dirty:
            self._tear_down(replica, pln, expect_err=True)
            pln = self.pln = None
        self._pln_dirty = False
        replica.pipeline_slot.put(pln)

    def _tear_down(self, replica: Replica, pln: Pipeline, *, expect_err: bool) -> None:
        """Release the pipeline's spool now; drain its streams in the replica's TaskGroup."""
        pln.begin_shutdown()
        if not replica.spawn(pln.finish_shutdown(expect_err=expect_err)):
            pln.abort_streams()

    # --- Handlers ---

    async def on_resolve(self) -> None:
        self._must_state(State.RESOLVE)
        req = self.req
        try:
            self.resolved = await self.env.resolver.resolve(
                req.journal,
                require_primary=True,
                may_proxy=not req.do_not_proxy,
                min_revision=self.read_through_rev,
                proxy_header=req.header if req.HasField("header") else None,
            )
        except (ResolveError, TimeoutError, WatchStoppedError) as exc:
            self.err = exc
            self.state = State.ERROR
            return
        res = self.resolved
        if res.status == pb.SUSPENDED and req.suspend == RESUME and res.spec is not None:
            # Fully suspended: no broker serves it. Resume it where it was suspended; the
            # allocator then assigns it (its route is empty until then).
            self.next_suspend = pb.JournalSpec.Suspend(
                level=pb.JournalSpec.Suspend.NONE, offset=res.spec.suspend.offset
            )
            self.state = State.UPDATE_SUSPEND
        elif res.status != pb.OK:
            self.state = State.ERROR
        elif not res.is_local:
            # We hold a pipeline from an earlier resolution but are no longer the primary.
            self.return_pipeline()
            self.pln = None
            self.state = State.AWAIT_DESIRED_REPLICAS
        elif res.replica is None:
            self._fail(ResolveError(f"{res.journal}: resolved to this broker without a replica"))
        elif self.owns_pipeline:
            self.state = State.START_PIPELINE
        else:
            self.state = State.ACQUIRE_PIPELINE

    async def on_acquire_pipeline(self) -> None:
        self._must_state(State.ACQUIRE_PIPELINE)
        replica = self._replica()
        try:
            self.pln = await replica.pipeline_slot.take(self._res().invalidated)
        except SlotInvalidatedError:
            self.state = State.RESOLVE
            return
        self._pln_slot_of = replica
        self.state = State.START_PIPELINE

    async def on_start_pipeline(self) -> None:
        self._must_state(State.START_PIPELINE)
        res, replica = self._res(), self._replica()
        pln = self.pln
        creations = assignment_creations(res)
        if (
            pln is not None
            and pln.matches(res.route)
            and pln.assignment_creations == creations
            and not pln.broken
        ):
            # By construction, a pipeline of the resolved route was synchronised when built.
            self.registers = pln.spool.registers
            self.state = State.UPDATE_ASSIGNMENTS
            return
        if pln is not None:
            self._tear_down(replica, pln, expect_err=pln.broken)
            self.pln = None

        try:
            spool = await replica.spool_slot.take(res.invalidated)
        except SlotInvalidatedError:
            self.state = State.RESOLVE
            return
        if spool.recovery_pending:
            # A spool recovered from this broker's data directory: as the primary, it adopts
            # what the store check leaves of it (fragment/spool_recovery.py).
            try:
                settled = await replica.settle_recovery(spool, None, res.invalidated)
            except BaseException:
                replica.spool_slot.put(spool)
                raise
            if not settled:
                replica.spool_slot.put(spool)
                if res.invalidated.is_set():
                    self.state = State.RESOLVE
                else:
                    self._fail(IndexNotReadyError(f"{res.journal}: no fragment store listing yet"))
                return
        self.registers = spool.registers
        self.roll_to_offset = 0
        previous = replica.synced_route
        if previous is not None and not routes_equivalent(previous, res.route):
            # The route changed since the last synchronised pipeline: start a new fragment, so
            # that no fragment mixes appends replicated to different sets of brokers, and a new
            # member never has to extend content it does not hold.
            self.roll_to_offset = spool.fragment.end
        self.pln = Pipeline.start(
            res.header,
            spool,
            replica.spool_slot,
            self.env.dialer,
            response_timeout_s=self.env.peer_response_timeout_s,
            send_timeout_s=self.env.peer_send_timeout_s,
        )
        self.pln.assignment_creations = creations
        self.state = State.SEND_PIPELINE_SYNC

    async def on_send_pipeline_sync(self) -> None:
        self._must_state(State.SEND_PIPELINE_SYNC)
        pln = self._pipeline()
        proposal = pln.spool.roll_proposal(
            self._spec().fragment, self.env.clock(), self.roll_to_offset
        )
        self._pln_dirty = True
        await pln.scatter(
            pb.ReplicateRequest(proposal=proposal, registers=self.registers, acknowledge=True)
        )
        self.state = State.RECV_PIPELINE_SYNC

    async def on_recv_pipeline_sync(self) -> None:
        self._must_state(State.RECV_PIPELINE_SYNC)
        pln = self._pipeline()
        result = await pln.gather_sync()
        self._pln_dirty = False
        err = pln.recv_err() or pln.send_err()
        if err is not None:
            self._tear_down(self._replica(), pln, expect_err=True)
            self.pln = None
            self._fail(err)
            return
        self.roll_to_offset = result.roll_to_offset
        self.read_through_rev = result.read_through_rev
        if result.roll_to_offset:
            # A peer holds more of the journal, or cannot extend our fragment: roll everyone
            # forward to a new fragment there; all peers can agree to that.
            if result.roll_to_registers is not None:
                self.registers = result.roll_to_registers
            self.state = State.SEND_PIPELINE_SYNC
        elif result.read_through_rev:
            # A peer knows a later, different route: our resolution is stale.
            self._tear_down(self._replica(), pln, expect_err=False)
            self.pln = None
            self.state = State.RESOLVE
        else:
            self._replica().synced_route = pln.route
            self.state = State.UPDATE_ASSIGNMENTS

    async def on_update_assignments(self) -> None:
        self._must_state(State.UPDATE_ASSIGNMENTS)
        res = self._res()
        if route_matches_assignments(res.route, res.assignments):
            self.state = State.AWAIT_DESIRED_REPLICAS
            return
        try:
            self.read_through_rev = await update_assignments(self.env.backend, res)
        except KeySpaceError as exc:
            self._fail(exc)
            return
        self.state = State.RESOLVE

    async def on_await_desired_replicas(self) -> None:
        self._must_state(State.AWAIT_DESIRED_REPLICAS)
        res = self._res()
        have, want = len(res.route.members), desired_replication(self._spec())
        if have > want:
            # The allocator over-subscribed the journal ahead of removing a member (maybe us):
            # wait for the route to shrink rather than replicate to, or proxy to, a leaver.
            self.read_through_rev = res.revision + 1
            self.state = State.RESOLVE
        elif have < want:
            self._fail(status=pb.INSUFFICIENT_JOURNAL_BROKERS)
        elif not res.is_local:
            self.state = State.PROXY
        else:
            self.state = State.VALIDATE_PRECONDITIONS

    async def on_validate_preconditions(self) -> None:
        """The primary store's health, registers, offsets, suspension.

        Appends must land at the furthest known offset of the journal. That is normally the end
        of the pipeline's spool, but if consistency was lost (too many broker or etcd failures),
        the fragment index may know of a larger one: content persisted by brokers this one never
        heard from. The broker does not repair this by itself. Other brokers, partitioned from
        etcd, may still hold local fragments not yet persisted; rolling forward to the index's
        end could double-write offsets they already committed. An operator must instead send an
        append with the explicit new offset (gazctl journals reset-head), as confirmation that
        those brokers are gone. The exception is a journal that may not be written: only
        zero-byte appends (transaction barriers) can reach it, which write no offsets, so it can
        serve as a read-only view of a store written by another cluster.

        An explicit offset is also how a client makes an at-most-once append.

        A journal suspended at a greater offset than the spool's (every broker that held it
        was suspended away, having persisted everything) rolls forward to it first. Then the
        append's suspension control may change the journal's suspension (append_suspend.py).
        """
        self._must_state(State.VALIDATE_PRECONDITIONS)
        res, replica, spec, pln = self._res(), self._replica(), self._spec(), self._pipeline()
        index = replica.index
        if not index.first_refresh.is_set():
            ready = await wait_first(
                [index.first_refresh, res.invalidated], self.env.index_refresh_wait_s
            )
            if not ready:
                self._fail(IndexNotReadyError(f"{res.journal}: no fragment store listing yet"))
                return
            if not index.first_refresh.is_set():
                self.state = State.RESOLVE
                return
        # Content this broker could not persist would pile up in its spools: as Gazette, no
        # append while the journal's primary store is unhealthy (fragment/store_health.py).
        monitor, stores = self.env.store_health, spec.fragment.stores
        if monitor is not None and stores:
            unhealthy = await monitor.wait_healthy(stores[0], res.invalidated)
            if res.invalidated.is_set():
                self.state = State.RESOLVE
                return
            if unhealthy is not None:
                self._fail(unhealthy, status=pb.FRAGMENT_STORE_UNHEALTHY)
                return

        # A peer may hold a larger offset than the index if a commit was not acknowledged by
        # all; such an append failed for its client, which retries (journals are at-least-once
        # under failures), and synchronisation has already rolled us past it.
        index_begin, index_end = index.begin_offset, index.end_offset
        spool_fragment = pln.spool.fragment
        spool_end = spool_fragment.end
        max_offset = max(spool_end, index_end)
        req = self.req

        if (
            req.HasField("check_registers")
            and self.registers.labels
            and not matches(req.check_registers, self.registers)
        ):
            self._fail(status=pb.REGISTER_MISMATCH)
            return
        if has_register_updates(req):
            # Each request's sets are bounded (limits.py), but unions accumulate across appends:
            # a journal's registers stay within the same bound, so that no journal's every
            # later append (and replication) carries an unbounded set.
            after = len(apply_register_updates(self.registers, req).labels)
            if after > labels_per_set_max:
                self._fail(
                    ValidationError(
                        f"the journal's registers would hold {after} labels, over"
                        f" labels_per_set_max ({labels_per_set_max}): subtract some first",
                        "union_registers",
                    )
                )
                return
        if spool_end < spec.suspend.offset:
            self.roll_to_offset = spec.suspend.offset
            self.state = State.SEND_PIPELINE_SYNC
            return
        if spool_end != max_offset and req.offset == 0 and may_write(spec):
            self._fail(status=pb.INDEX_HAS_GREATER_OFFSET)
            return
        if req.offset != 0 and req.offset != max_offset:
            self._fail(status=pb.WRONG_APPEND_OFFSET)
            return
        if req.offset != 0 and spool_end != max_offset:
            # The operator confirmed the index's end: re-synchronise every spool there.
            self.roll_to_offset = max_offset
            self.state = State.SEND_PIPELINE_SYNC
            return

        # The pipeline is synchronised and the append validated: its suspension control.
        decision = decide(
            req.suspend,
            spec.suspend.level,
            index_empty=index_begin == index_end,
            index_dirty=req.suspend not in (RESUME, NO_RESUME)
            and index_is_dirty(index, spec, self.env.clock()),
            spool_end=spool_end,
        )
        if decision.step is SuspendStep.UPDATE:
            self.next_suspend = decision.suspend
            self._roll_for_suspension = decision.roll
            self.state = State.UPDATE_SUSPEND
            return
        if decision.step is SuspendStep.REFUSE:
            self._fail(status=pb.SUSPENDED)
            return
        if decision.step is SuspendStep.SUSPENDED:
            # Suspended (now, or already): the empty append runs to its end, and answers so.
            self._res().status = pb.SUSPENDED
        if self._roll_for_suspension and spool_end > spool_fragment.begin:
            # Suspended PARTIAL with content in the spool: roll it, so that it is persisted
            # now rather than whenever this last replica next rolls.
            self.roll_to_offset = spool_end
        if spool_fragment.begin == index_begin and spool_fragment.end > spool_fragment.begin:
            # The spool holds the journal's very first content: roll it now, so that it is
            # persisted promptly. A store holding any fragment tells a recovering cluster that
            # the journal was written (and needs reset-head); an empty store would look like a
            # new journal, inviting double-writes of its offsets.
            self.roll_to_offset = spool_end
        self.state = State.STREAM_CONTENT

    async def on_update_suspend(self) -> None:
        self._must_state(State.UPDATE_SUSPEND)
        res, suspend = self._res(), self.next_suspend
        if suspend is None:
            raise FSMStateError("update_suspend without a suspension to write")
        try:
            self.read_through_rev = await update_journal_spec(self.env.backend, res, suspend)
        except KeySpaceError as exc:
            self._fail(exc)
            return
        log.info(
            "updated journal suspension",
            journal=res.journal,
            revision=self.read_through_rev,
            level=pb.JournalSpec.Suspend.Level.Name(suspend.level),
            offset=suspend.offset,
        )
        self.state = State.RESOLVE

    async def on_stream_content(self, req: AppendMessage | None, err: BaseException | None) -> None:
        """One client message (``req``), the end of the client's stream (both None), or its
        failure (``err``). See the module docstring."""
        self._must_state(State.STREAM_CONTENT)
        pln, spec = self._pipeline(), self._spec()

        if self.client_fragment is None:
            # First call: maybe roll to a new fragment ahead of this append. The pipeline is
            # synchronised, so every peer will agree; no acknowledgement is needed.
            proposal = pln.spool.roll_proposal(spec.fragment, self.env.clock(), self.roll_to_offset)
            spool_fragment = pln.spool.fragment
            if proposal != spool_fragment:
                self._pln_dirty = True
                await pln.scatter(pb.ReplicateRequest(proposal=proposal, registers=self.registers))
                spool_fragment = pln.spool.fragment
            self.client_fragment = pb.Fragment(
                journal=spool_fragment.journal,
                begin=spool_fragment.end,
                end=spool_fragment.end,
                compression_codec=spool_fragment.compression_codec,
            )
            self._client_summer = hashlib.sha1()
        fragment = self.client_fragment

        if err is None and req is not None and not isinstance(req, ContentChunk):
            # (A ContentChunk holds content alone by construction.)
            try:
                validate_content_chunk(req)
            except ValidationError as exc:
                err = exc
        eof = err is None and req is None
        # Read once: every read of a bytes field of a message copies it out.
        content: bytes | memoryview = req.content if req is not None else b""

        if eof and not self.client_commit:
            err = UnexpectedEOFError()
        elif err is None and req is not None and self.client_commit:
            err = ExpectedEOFError()
        elif err is None and req is not None and not content:
            # The commit marker; the end of the stream must follow.
            self.client_commit = True
            return
        elif err is None and req is not None and not may_write(spec):
            self._res().status = pb.NOT_ALLOWED
        elif err is None and req is not None and self.req.suspend in CONTENT_FORBIDDEN:
            # Suspension requests and SUSPEND_KEEP barriers are empty appends.
            self._res().status = pb.NOT_ALLOWED
        elif err is None and req is not None:
            self._pln_dirty = True
            await self._sum_content(content)
            await pln.scatter_content(
                content,
                fragment.end - fragment.begin,
                append_wire=req.wire if isinstance(req, ContentChunk) else None,
            )
            fragment.end += len(content)
            if pln.send_err() is None:
                return

        # The end of this append's content: commit it, or roll it back. (Its sum is taken once
        # the commit is acknowledged: see _finish_sum.)
        if eof and fragment.end == fragment.begin and has_register_updates(self.req):
            err = RegisterUpdateWithEmptyAppendError()

        if err is None and eof and pln.send_err() is None and self.status == pb.OK:
            proposal = pln.spool.next()
            if fragment.end > fragment.begin:
                self.registers = apply_register_updates(self.registers, self.req)
        else:
            # A client or peer error: the pipeline is still consistent, but every replica
            # must drop the partial content it has spooled.
            proposal = pln.spool.fragment
            self.err = err
        self._pln_dirty = True
        await pln.scatter(
            pb.ReplicateRequest(proposal=proposal, registers=self.registers, acknowledge=True)
        )
        self.state = State.READ_ACKNOWLEDGEMENTS

    async def on_read_acknowledgements(self) -> None:
        self._must_state(State.READ_ACKNOWLEDGEMENTS)
        pln = self._pipeline()
        replica = self._pln_slot_of
        if replica is None:
            raise FSMStateError("read_acknowledgements without owning the pipeline")
        send_err = pln.send_err()
        wait_for, close_after = pln.barrier()

        # Release the send side now: the next append may stream while we wait for our turn.
        self._pln_slot_of = None
        self._pln_dirty = False
        if send_err is None:
            replica.pipeline_slot.put(pln)
        else:
            pln.release_spool()
            replica.pipeline_slot.put(None)  # The next append builds a new pipeline.
        try:
            if send_err is not None:
                await pln.close_send()
            # Our turn comes when every append that sent before us has read its responses.
            await wait_for.wait()
            await pln.gather_ok()
            if send_err is not None:
                await pln.gather_eof()
        finally:
            close_after.set()
        if send_err is not None:
            pln.abort_streams()

        if self.err is not None or self.status != pb.OK:
            self.state = State.ERROR
        elif (recv_err := pln.recv_err()) is not None:
            self._fail(recv_err)
        elif send_err is not None:
            self._fail(send_err)
        else:
            await self._finish_sum()
            metrics.PIPELINE_COMMITS.inc()
            self.state = State.FINISHED

    # --- The append's own sum ---

    async def _sum_content(self, content: bytes | memoryview) -> None:
        """Add ``content`` to the append's running SHA1 (the commit fragment's sum), in order.

        A large chunk is summed on a worker thread, and nothing waits for it until the next
        chunk or ``_finish_sum``: the pipeline's critical section (which every other append of
        the journal waits for) then holds only what must precede the commit proposal, the
        spool's write and sum, not this one too. At most one chunk is pending at a time."""
        if self._client_summing is not None:
            summing, self._client_summing = self._client_summing, None
            await summing
        if len(content) >= local_offload_bytes_min:
            loop = asyncio.get_running_loop()
            self._client_summing = loop.run_in_executor(None, self._client_summer.update, content)
        else:
            self._client_summer.update(content)

    async def _finish_sum(self) -> None:
        """Set the commit fragment's sum, once the last chunk is summed."""
        if self._client_summing is not None:
            summing, self._client_summing = self._client_summing, None
            await summing
        fragment = self.client_fragment
        if fragment is not None and fragment.end > fragment.begin:
            fragment.sum.CopyFrom(sum_from_digest(self._client_summer.digest()))
