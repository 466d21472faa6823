"""One append's state: what every phase of the append machine reads and writes.

`AppendRun` is the typed state object behind the machine (append_fsm.py). It holds the append's
request, its current state and resolution, the pipeline it owns, and what the phases have
decided so far (the offset to roll to, the registers, the commit fragment), with the accessors
that check a phase runs where it may. The phases are mixins over it, one module each:
append_route.py (resolution and the route in etcd), append_sync.py (a synchronised pipeline),
append_preconditions.py (the append's checks) and append_content.py (content, commit and
acknowledgements). `AppendEnv` is what the machine needs of its broker.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from broker.append_state import FSMStateError, State
from broker.fragment.store_health import StoreHealthMonitor
from broker.keyspace.backend import Backend
from broker.peer_dialer import Dialer
from broker.pipeline import Pipeline, pipeline_close_wait_s_default
from broker.protocol import protocol_pb2 as pb
from broker.protocol.content_wire import ContentChunk
from broker.replica import Replica
from broker.resolver import Resolution, Resolver

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
    # How long a torn-down pipeline waits for its peers to end their streams (pipeline.py).
    pipeline_close_wait_s: float = pipeline_close_wait_s_default


# A content message arrives as a ContentChunk when it carries content alone (content_wire.py).
AppendMessage = pb.AppendRequest | ContentChunk
Recv = Callable[[], Awaitable[tuple[AppendMessage | None, BaseException | None]]]


class AppendRun:
    """One append's state. ``req`` is the validated first message of the RPC."""

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
        # Whether this append proposed its commit (of content) to the replicas: a failure
        # read afterwards leaves its outcome unknown (append_content.py).
        self.commit_proposed = False
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

    def _must_state(self, state: State) -> None:
        if self.state is not state:
            raise FSMStateError(f"handler of {state.value} called in state {self.state.value}")

    def _fail(self, err: BaseException | None = None, status: int | None = None) -> None:
        if err is not None:
            self.err = err
        if status is not None:
            self._res().status = status
        self.state = State.ERROR

    # --- Owning the pipeline ---

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
