"""The append machine's pipeline phase: own a replication pipeline synchronised with the route.

  ACQUIRE_PIPELINE        take the replica's pipeline slot (exclusive), or RESOLVE if the
                          resolution is invalidated while waiting.
  START_PIPELINE          a pipeline of the resolved route: UPDATE_ASSIGNMENTS. Otherwise tear
                          down any old one, take the spool, build a new one: SEND_PIPELINE_SYNC.
  SEND_PIPELINE_SYNC      propose the current (or a rolled) fragment and the registers to all.
  RECV_PIPELINE_SYNC      all agree: UPDATE_ASSIGNMENTS. A peer is ahead, or cannot extend the
                          fragment: roll everyone forward (SEND_PIPELINE_SYNC). A peer knows a
                          later route: RESOLVE at that revision.

A mixin of the machine (append_fsm.py) over its state (append_run.py); the pipeline itself is
pipeline.py.
"""

from __future__ import annotations

from broker.append_rules import assignment_creations
from broker.append_run import AppendRun
from broker.append_state import IndexNotReadyError, State
from broker.fragment.spool import Spool
from broker.pipeline import Pipeline
from broker.protocol import protocol_pb2 as pb
from broker.replica import SlotInvalidatedError
from broker.topology import routes_equivalent


class SyncPhase(AppendRun):
    """ACQUIRE_PIPELINE, START_PIPELINE, SEND_PIPELINE_SYNC, RECV_PIPELINE_SYNC."""

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

        spool = await self._take_spool()
        if spool is None:
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
            close_wait_s=self.env.pipeline_close_wait_s,
        )
        self.pln.assignment_creations = creations
        self.state = State.SEND_PIPELINE_SYNC

    async def _take_spool(self) -> Spool | None:
        """The replica's spool, for a new pipeline; settled first if it was recovered from this
        broker's data directory (as the primary, it adopts what the store check leaves of it:
        fragment/spool_recovery.py). None: the state moved on (RESOLVE, or ERROR)."""
        res, replica = self._res(), self._replica()
        try:
            spool = await replica.spool_slot.take(res.invalidated)
        except SlotInvalidatedError:
            self.state = State.RESOLVE
            return None
        if not spool.recovery_pending:
            return spool
        try:
            settled = await replica.settle_recovery(spool, None, res.invalidated)
        except BaseException:
            replica.spool_slot.put(spool)
            raise
        if settled:
            return spool
        replica.spool_slot.put(spool)
        if res.invalidated.is_set():
            self.state = State.RESOLVE
        else:
            self._fail(IndexNotReadyError(f"{res.journal}: no fragment store listing yet"))
        return None

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
