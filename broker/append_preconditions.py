"""The append machine's checks: VALIDATE_PRECONDITIONS.

  VALIDATE_PRECONDITIONS  the primary store's health, registers, offsets and suspension (see
                          ``on_validate_preconditions``); UPDATE_SUSPEND if the append changes
                          the journal's suspension; else STREAM_CONTENT.

A mixin of the machine (append_fsm.py) over its state (append_run.py).
"""

from __future__ import annotations

from broker.append_rules import apply_register_updates, has_register_updates, may_write
from broker.append_run import AppendRun
from broker.append_state import IndexNotReadyError, State
from broker.append_suspend import NO_RESUME, RESUME, SuspendStep, decide, index_is_dirty
from broker.fragment.index import FragmentIndex
from broker.protocol import protocol_pb2 as pb
from broker.protocol.limits import labels_per_set_max
from broker.protocol.selector import matches
from broker.protocol.validate import ValidationError
from broker.replica import wait_first


class PreconditionsPhase(AppendRun):
    """VALIDATE_PRECONDITIONS."""

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
        pln = self._pipeline()
        if not await self._index_listed() or not await self._store_healthy():
            return
        # A peer may hold a larger offset than the index if a commit was not acknowledged by
        # all; such an append failed for its client, which retries (journals are at-least-once
        # under failures), and synchronisation has already rolled us past it.
        index = self._replica().index
        spool_fragment = pln.spool.fragment
        if not self._registers_ok() or not self._offset_ok(spool_fragment.end, index.end_offset):
            return
        self._suspension_control(index, spool_fragment)

    async def _index_listed(self) -> bool:
        """Whether the replica's fragment index has had its first store listing, waiting for it
        (boundedly). False: the state moved on (RESOLVE, or ERROR past the bound)."""
        res, index = self._res(), self._replica().index
        if index.first_refresh.is_set():
            return True
        ready = await wait_first(
            [index.first_refresh, res.invalidated], self.env.index_refresh_wait_s
        )
        if not ready:
            self._fail(IndexNotReadyError(f"{res.journal}: no fragment store listing yet"))
            return False
        if not index.first_refresh.is_set():
            self.state = State.RESOLVE
            return False
        return True

    async def _store_healthy(self) -> bool:
        """Whether the journal's primary store is healthy, waiting while it is not. Content this
        broker could not persist would pile up in its spools: as Gazette, no append while the
        journal's primary store is unhealthy (fragment/store_health.py). False: the state moved
        on (RESOLVE, or FRAGMENT_STORE_UNHEALTHY)."""
        res = self._res()
        monitor, stores = self.env.store_health, self._spec().fragment.stores
        if monitor is None or not stores:
            return True
        unhealthy = await monitor.wait_healthy(stores[0], res.invalidated)
        if res.invalidated.is_set():
            self.state = State.RESOLVE
            return False
        if unhealthy is not None:
            self._fail(unhealthy, status=pb.FRAGMENT_STORE_UNHEALTHY)
            return False
        return True

    def _registers_ok(self) -> bool:
        """The append's register check, and the bound on the registers its updates leave.
        False: it failed (REGISTER_MISMATCH, or a ValidationError)."""
        req = self.req
        if (
            req.HasField("check_registers")
            and self.registers.labels
            and not matches(req.check_registers, self.registers)
        ):
            self._fail(status=pb.REGISTER_MISMATCH)
            return False
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
                return False
        return True

    def _offset_ok(self, spool_end: int, index_end: int) -> bool:
        """Whether the append lands at the journal's furthest known offset (see
        ``on_validate_preconditions``). False: it failed, or every spool must first roll
        forward (SEND_PIPELINE_SYNC)."""
        spec, req = self._spec(), self.req
        max_offset = max(spool_end, index_end)
        if spool_end < spec.suspend.offset:
            self.roll_to_offset = spec.suspend.offset
            self.state = State.SEND_PIPELINE_SYNC
            return False
        if spool_end != max_offset and req.offset == 0 and may_write(spec):
            self._fail(status=pb.INDEX_HAS_GREATER_OFFSET)
            return False
        if req.offset != 0 and req.offset != max_offset:
            self._fail(status=pb.WRONG_APPEND_OFFSET)
            return False
        if req.offset != 0 and spool_end != max_offset:
            # The operator confirmed the index's end: re-synchronise every spool there.
            self.roll_to_offset = max_offset
            self.state = State.SEND_PIPELINE_SYNC
            return False
        return True

    def _suspension_control(self, index: FragmentIndex, spool_fragment: pb.Fragment) -> None:
        """The pipeline is synchronised and the append validated: apply its suspension control
        (UPDATE_SUSPEND, SUSPENDED, or on to STREAM_CONTENT, maybe rolling the spool first)."""
        req, spec = self.req, self._spec()
        index_begin, index_end = index.begin_offset, index.end_offset
        spool_end = spool_fragment.end
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
