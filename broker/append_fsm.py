"""The append state machine: every Append RPC (and every pulse) is one run of it.

An append must be all-or-nothing, serializable, durable on every replica of the journal's route
before it reports success, and must never re-assign a journal offset (docs/architecture.md,
Invariants). The machine converges on the distributed state those guarantees need, a
*synchronised* replication pipeline owned by this append, possibly backing up and re-resolving
several times, and then streams the client's content through it. Its states and errors are
declared in append_state.py, its state object in append_run.py.

States (one ``on_<state>`` handler each, grouped by phase in modules of their own: RESOLVE,
AWAIT_DESIRED_REPLICAS, UPDATE_ASSIGNMENTS and UPDATE_SUSPEND in append_route.py; the pipeline's
states in append_sync.py; VALIDATE_PRECONDITIONS in append_preconditions.py; STREAM_CONTENT and
READ_ACKNOWLEDGEMENTS in append_content.py. Tests drive them one at a time):

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
from collections.abc import Awaitable, Callable

from broker.append_content import ContentPhase
from broker.append_preconditions import PreconditionsPhase
from broker.append_rate import burst_bytes_for
from broker.append_route import RoutePhase
from broker.append_rules import complete_despite_cancellation
from broker.append_run import AppendEnv as AppendEnv
from broker.append_run import AppendMessage as AppendMessage
from broker.append_run import Recv as Recv
from broker.append_run import index_refresh_wait_s_default as index_refresh_wait_s_default
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
from broker.append_sync import SyncPhase


class AppendFSM(RoutePhase, SyncPhase, PreconditionsPhase, ContentPhase):
    """One append: its state (append_run.AppendRun) and every phase's handlers, driven here.
    ``req`` is the validated first message of the RPC."""

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
                try:
                    await self.on_stream_content(req, err)
                except asyncio.CancelledError:
                    # Gone while its chunk or its commit went out: a chunk is rolled back; a
                    # commit (or rollback) proposal, already on every replica, has its
                    # acknowledgements read, so that the next append does not take them.
                    await complete_despite_cancellation(self._roll_back(ClientAbortedError()))
                    raise
            # Its reading of the replicas' answers completes despite a cancellation (then only
            # the append's own sum, for a client gone, may be left unfinished).
            await self.on_read_acknowledgements()
        finally:
            self.return_pipeline()

    async def _roll_back(self, err: BaseException) -> None:
        if self.state is State.STREAM_CONTENT:
            await self.on_stream_content(None, err)
        if self.state is State.READ_ACKNOWLEDGEMENTS:
            await self.on_read_acknowledgements()
