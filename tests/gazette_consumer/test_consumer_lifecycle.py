"""The local replica state machine, one transition per test, and the status-write decision."""

from __future__ import annotations

from google.protobuf.duration_pb2 import Duration

from broker.protocol import consumer_pb2 as cpb
from gazette_consumer.lifecycle import (
    Assigned,
    Lifecycle,
    LocalReplica,
    Promote,
    ReplicaState,
    Start,
    Stop,
    UpdateSpec,
    bounded_status,
    status_error_chars_max,
    status_update,
)
from gazette_consumer.shard_handle import ShardRole

IDLE, BACKFILL, STANDBY, PRIMARY, FAILED = (
    cpb.ReplicaStatus.IDLE,
    cpb.ReplicaStatus.BACKFILL,
    cpb.ReplicaStatus.STANDBY,
    cpb.ReplicaStatus.PRIMARY,
    cpb.ReplicaStatus.FAILED,
)


def assigned(
    shard: str = "shard-a",
    slot: int = 0,
    created: int = 10,
    spec_revision: int = 5,
    hot_standbys: int = 0,
) -> Assigned:
    s = cpb.ShardSpec(id=shard, max_txn_duration=Duration(seconds=1), hot_standbys=hot_standbys)
    return Assigned(shard, slot, created, s, spec_revision, f"/root/items/{shard}")


def status(code: int, *errors: str) -> cpb.ReplicaStatus:
    return cpb.ReplicaStatus(code=code, errors=list(errors))  # type: ignore[arg-type]


def started(life: Lifecycle, a: Assigned) -> Lifecycle:
    life.step({a.shard: a})
    return life


# --- From absent ---------------------------------------------------------------------------------


def test_slot_zero_starts_a_primary() -> None:
    life = Lifecycle()
    a = assigned(slot=0)
    assert life.step({"shard-a": a}) == [Start(a, ShardRole.PRIMARY)]
    assert life.replicas["shard-a"] == LocalReplica("shard-a", ReplicaState.PRIMARY, 0, 10, 5)


def test_a_higher_slot_starts_a_standby() -> None:
    life = Lifecycle()
    a = assigned(slot=2)
    assert life.step({"shard-a": a}) == [Start(a, ShardRole.STANDBY)]
    assert life.replicas["shard-a"].state is ReplicaState.STANDBY


# --- From STANDBY --------------------------------------------------------------------------------


def test_a_standby_moved_to_slot_zero_is_promoted_in_place() -> None:
    life = started(Lifecycle(), assigned(slot=1, created=10))
    # The allocator re-keys the assignment: a new create revision, at a lower slot.
    assert life.step({"shard-a": assigned(slot=0, created=12)}) == [Promote("shard-a")]
    assert life.replicas["shard-a"] == LocalReplica("shard-a", ReplicaState.PRIMARY, 0, 12, 5)


def test_a_standby_packed_to_a_lower_slot_stays_a_standby() -> None:
    life = started(Lifecycle(), assigned(slot=3, created=10))
    assert life.step({"shard-a": assigned(slot=1, created=12)}) == []
    assert life.replicas["shard-a"] == LocalReplica("shard-a", ReplicaState.STANDBY, 1, 12, 5)


def test_a_promotion_with_a_new_spec_updates_it_too() -> None:
    life = started(Lifecycle(), assigned(slot=1))
    new = assigned(slot=0, created=12, spec_revision=9, hot_standbys=1)
    assert life.step({"shard-a": new}) == [Promote("shard-a"), UpdateSpec("shard-a", new.spec)]


def test_a_standby_whose_assignment_was_replaced_restarts() -> None:
    life = started(Lifecycle(), assigned(slot=1, created=10))
    new = assigned(slot=1, created=20)
    assert life.step({"shard-a": new}) == [Stop("shard-a"), Start(new, ShardRole.STANDBY)]
    assert life.replicas["shard-a"].create_revision == 20


# --- From PRIMARY --------------------------------------------------------------------------------


def test_a_value_update_of_the_same_assignment_is_nothing() -> None:
    life = started(Lifecycle(), assigned(slot=0, created=10))
    assert life.step({"shard-a": assigned(slot=0, created=10)}) == []


def test_a_spec_change_is_passed_on() -> None:
    life = started(Lifecycle(), assigned(slot=0))
    new = assigned(slot=0, spec_revision=8, hot_standbys=2)
    assert life.step({"shard-a": new}) == [UpdateSpec("shard-a", new.spec)]
    assert life.step({"shard-a": new}) == []  # Once.


def test_a_primary_never_goes_back_to_standby() -> None:
    life = started(Lifecycle(), assigned(slot=0, created=10))
    new = assigned(slot=1, created=30)
    assert life.step({"shard-a": new}) == [Stop("shard-a"), Start(new, ShardRole.STANDBY)]
    assert life.replicas["shard-a"].state is ReplicaState.STANDBY


def test_a_primary_whose_assignment_was_replaced_restarts() -> None:
    life = started(Lifecycle(), assigned(slot=0, created=10))
    new = assigned(slot=0, created=30)
    assert life.step({"shard-a": new}) == [Stop("shard-a"), Start(new, ShardRole.PRIMARY)]


# --- To absent -----------------------------------------------------------------------------------


def test_gone_assignments_stop_first_in_shard_order() -> None:
    life = Lifecycle()
    life.step({s: assigned(s, slot=0) for s in ("shard-b", "shard-a", "shard-c")})
    new = assigned("shard-d", slot=1)
    assert life.step({"shard-d": new}) == [
        Stop("shard-a"),
        Stop("shard-b"),
        Stop("shard-c"),
        Start(new, ShardRole.STANDBY),
    ]
    assert life.stop_all() == [Stop("shard-d")]
    assert life.replicas == {}


# --- Status writes -------------------------------------------------------------------------------


def test_status_update_writes_only_forward_changes() -> None:
    assert status_update(status(IDLE), status(IDLE)) is None  # Nothing to say yet.
    assert status_update(status(IDLE), status(BACKFILL)) == status(BACKFILL)
    assert status_update(status(BACKFILL), status(STANDBY)) == status(STANDBY)
    assert status_update(status(STANDBY), status(STANDBY)) is None
    assert status_update(status(STANDBY), status(PRIMARY)) == status(PRIMARY)
    assert status_update(status(PRIMARY), status(STANDBY)) is None  # Never backwards.
    assert status_update(status(PRIMARY), status(FAILED, "boom")) == status(FAILED, "boom")
    assert status_update(status(FAILED, "boom"), status(FAILED, "boom")) is None
    assert status_update(status(FAILED, "boom"), status(PRIMARY)) is None  # Failed stays failed.


def test_errors_are_bounded_before_they_reach_etcd() -> None:
    huge = "x" * (status_error_chars_max * 3)
    bounded = bounded_status(status(FAILED, huge, *(f"e{i}" for i in range(20))))
    assert len(bounded.errors[0]) == status_error_chars_max and bounded.errors[0].endswith("…")
    assert len(bounded.errors) == 8
