"""The lifecycle of this process's shard replicas, as a sans-IO state machine.

The member feeds ``Lifecycle.step`` what the keyspace says is assigned here now (``Assigned``,
one per shard); it answers with the actions that make the running replicas match: start,
promote, update the spec, stop. The member carries them out on ``ShardHandle``s.

States of a local replica and their transitions (Gazette's shard ``transition``):

    (absent)  --assigned slot 0-->            PRIMARY   (start as primary)
    (absent)  --assigned slot > 0-->          STANDBY   (start as standby)
    STANDBY   --moved to slot 0-->            PRIMARY   (promote, same replica)
    STANDBY   --moved to a lower slot > 0-->  STANDBY   (packing: nothing to do)
    any       --same assignment, new value--> same      (nothing: it is our own status write)
    any       --spec changed-->               same      (update the spec)
    any       --assignment replaced-->        stop, then start afresh
    any       --assignment gone-->            (absent)  (stop)

An assignment is *replaced* when its key now has another create revision at a slot that is not
lower: the allocator (or an operator's Unassign) deleted it and a new one was created, so the
replica must start again from its store rather than carry on (its old primary may have been
fenced meanwhile). A PRIMARY never goes back to STANDBY: a primary that loses slot 0 has lost its
assignment, and any new assignment starts afresh.

``status_update`` decides what the member writes into an assignment's value: the status the
handle reports, reduced with what etcd holds (codes only move forward), or nothing when etcd
already says it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from broker.protocol import consumer_pb2 as cpb
from gazette_consumer.shard_handle import ShardRole
from gazette_consumer.topology import IDLE, reduce_status, status_errors_max

# Characters of one error kept in an advertised ReplicaStatus: a traceback-sized message would
# bloat every List response and etcd value, while the full text stays in the process's log.
status_error_chars_max = 1024


class ReplicaState(enum.Enum):
    STANDBY = "standby"
    PRIMARY = "primary"


@dataclass(frozen=True, slots=True)
class Assigned:
    """One local assignment as the keyspace has it now."""

    shard: str
    slot: int
    # Create revision of the assignment key: identifies the assignment across value updates.
    create_revision: int
    spec: cpb.ShardSpec
    # Mod revision of the ShardSpec, to notice spec changes.
    spec_revision: int
    fqn: str


@dataclass(frozen=True, slots=True)
class LocalReplica:
    shard: str
    state: ReplicaState
    slot: int
    create_revision: int
    spec_revision: int


@dataclass(frozen=True, slots=True)
class Start:
    assigned: Assigned
    role: ShardRole


@dataclass(frozen=True, slots=True)
class Promote:
    shard: str


@dataclass(frozen=True, slots=True)
class UpdateSpec:
    shard: str
    spec: cpb.ShardSpec


@dataclass(frozen=True, slots=True)
class Stop:
    shard: str


Action = Start | Promote | UpdateSpec | Stop


class Lifecycle:
    """The local replicas and the transitions between them (see the module docstring)."""

    def __init__(self) -> None:
        self.replicas: dict[str, LocalReplica] = {}

    def step(self, assigned: Mapping[str, Assigned]) -> list[Action]:
        """Actions taking the local replicas to ``assigned``: stops first (so a replaced
        replica's stop is ordered before its successor's start), in shard order."""
        actions: list[Action] = []
        for shard in sorted(self.replicas.keys() - assigned.keys()):
            del self.replicas[shard]
            actions.append(Stop(shard))
        for shard in sorted(assigned):
            a = assigned[shard]
            current = self.replicas.get(shard)
            if current is None:
                actions += self._on_absent(a)
            elif current.state is ReplicaState.STANDBY:
                actions += self._on_standby(current, a)
            else:
                actions += self._on_primary(current, a)
        return actions

    def stop_all(self) -> list[Action]:
        """Stop every replica (the process is exiting or lost its lease)."""
        actions: list[Action] = [Stop(shard) for shard in sorted(self.replicas)]
        self.replicas.clear()
        return actions

    # -- One handler per state ---------------------------------------------------------------

    def _on_absent(self, a: Assigned) -> list[Action]:
        role = ShardRole.PRIMARY if a.slot == 0 else ShardRole.STANDBY
        state = ReplicaState.PRIMARY if a.slot == 0 else ReplicaState.STANDBY
        self.replicas[a.shard] = LocalReplica(
            a.shard, state, a.slot, a.create_revision, a.spec_revision
        )
        return [Start(a, role)]

    def _on_standby(self, r: LocalReplica, a: Assigned) -> list[Action]:
        if a.slot < r.slot:
            # Moved down: the allocator re-keys an assignment to promote or pack it, keeping
            # its value, so this is the same replica (a new create revision is expected).
            state = ReplicaState.PRIMARY if a.slot == 0 else ReplicaState.STANDBY
            self.replicas[a.shard] = LocalReplica(
                a.shard, state, a.slot, a.create_revision, a.spec_revision
            )
            actions: list[Action] = [Promote(a.shard)] if a.slot == 0 else []
            return actions + self._spec_change(r, a)
        return self._same_or_replaced(r, a)

    def _on_primary(self, r: LocalReplica, a: Assigned) -> list[Action]:
        # A primary can only stay at slot 0; anything else is a new assignment.
        return self._same_or_replaced(r, a)

    # -- Shared steps ------------------------------------------------------------------------

    def _same_or_replaced(self, r: LocalReplica, a: Assigned) -> list[Action]:
        if a.create_revision == r.create_revision and a.slot == r.slot:
            self.replicas[a.shard] = LocalReplica(
                a.shard, r.state, r.slot, r.create_revision, a.spec_revision
            )
            return self._spec_change(r, a)
        del self.replicas[a.shard]
        return [Stop(a.shard), *self._on_absent(a)]

    @staticmethod
    def _spec_change(r: LocalReplica, a: Assigned) -> list[Action]:
        return [UpdateSpec(a.shard, a.spec)] if a.spec_revision != r.spec_revision else []


def bounded_status(status: cpb.ReplicaStatus) -> cpb.ReplicaStatus:
    """``status`` with at most ``status_errors_max`` errors of at most
    ``status_error_chars_max`` characters each."""
    out = cpb.ReplicaStatus(code=status.code)
    for error in list(status.errors)[:status_errors_max]:
        if len(error) > status_error_chars_max:
            error = error[: status_error_chars_max - 1] + "…"
        out.errors.append(error)
    return out


def status_update(
    stored: cpb.ReplicaStatus, reported: cpb.ReplicaStatus
) -> cpb.ReplicaStatus | None:
    """The status to write into an assignment whose value holds ``stored``, now that its
    replica reports ``reported``; None if etcd already says it (or the replica reports
    nothing yet)."""
    if reported.code == IDLE:
        return None
    wanted = reduce_status(stored, bounded_status(reported))
    return None if wanted == stored else wanted
