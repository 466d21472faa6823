"""The append machine's route phase: where the append goes, and the route's record in etcd.

  RESOLVE                 resolve the journal, first waiting for any etcd revision we know of.
                          Fully suspended, and the append resumes: UPDATE_SUSPEND. Not the
                          primary: AWAIT_DESIRED_REPLICAS (we will proxy). Already own the
                          pipeline: START_PIPELINE. Else ACQUIRE_PIPELINE.
  AWAIT_DESIRED_REPLICAS  too many replicas (the allocator is moving the journal): RESOLVE at
                          the next revision. Too few: INSUFFICIENT_JOURNAL_BROKERS. Not primary:
                          PROXY. Else VALIDATE_PRECONDITIONS.
  UPDATE_ASSIGNMENTS      advertise the synchronised route in the assignment values (a
                          compare-and-set on their mod revisions), then RESOLVE at the new
                          revision; a no-op when they already advertise it.
  UPDATE_SUSPEND          write the new suspension into the JournalSpec (a compare-and-set on
                          its and the assignments' mod revisions), then RESOLVE at that
                          revision (append_suspend.py).

A mixin of the machine (append_fsm.py) over its state (append_run.py).
"""

from __future__ import annotations

from broker.append_rules import desired_replication, update_assignments
from broker.append_run import AppendRun
from broker.append_state import FSMStateError, State
from broker.append_suspend import RESUME, update_journal_spec
from broker.keyspace.backend import KeySpaceError
from broker.keyspace.keyspace import WatchStoppedError
from broker.logging import get_logger
from broker.protocol import protocol_pb2 as pb
from broker.resolver import ReplicaNotReadyError, ResolveError
from broker.topology import route_matches_assignments

log = get_logger(__name__)


class RoutePhase(AppendRun):
    """RESOLVE, AWAIT_DESIRED_REPLICAS, UPDATE_ASSIGNMENTS, UPDATE_SUSPEND."""

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
            self._fail(
                ReplicaNotReadyError(f"{res.journal}: resolved to this broker without a replica")
            )
        elif self.owns_pipeline:
            self.state = State.START_PIPELINE
        else:
            self.state = State.ACQUIRE_PIPELINE

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
