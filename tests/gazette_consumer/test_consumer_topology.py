"""The consumer keyspace: decoding (strict, as Gazette's), routes with statuses, the allocator's
rules for shards (replication, limits, consistency) and the lookups the member makes."""

from __future__ import annotations

import pytest
from google.protobuf.duration_pb2 import Duration

from broker.allocator.state import Assignment as AllocatorAssignment
from broker.allocator.state import Item as AllocatorItem
from broker.allocator.state import MemberId
from broker.keyspace.backend import KeyValue
from broker.keyspace.embedded import EmbeddedBackend
from broker.keyspace.keyspace import Entry
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import protocol_pb2 as pb
from gazette_consumer.topology import (
    FAILED,
    PRIMARY,
    STANDBY,
    ConsumerMember,
    ShardAssignment,
    ShardItem,
    TopologyDecodeError,
    consumer_item_limit,
    local_assignments,
    make_decoder,
    new_keyspace,
    reduce_status,
    route_of,
    shard_is_consistent,
    shard_replication,
    shards_with_source,
    status_errors_max,
)

ROOT = "/gazette/consumers/app"
decode = make_decoder(ROOT)


def kv(key: str, value: bytes = b"", revision: int = 1) -> KeyValue:
    return KeyValue(key.encode(), value, revision, revision, 1)


def spec(shard: str, *sources: str, hot_standbys: int = 0, disable: bool = False) -> cpb.ShardSpec:
    return cpb.ShardSpec(
        id=shard,
        sources=[cpb.ShardSpec.Source(journal=j) for j in sources],
        max_txn_duration=Duration(seconds=1),
        hot_standbys=hot_standbys,
        disable=disable,
    )


def consumer(zone: str, suffix: str, limit: int = 10) -> cpb.ConsumerSpec:
    return cpb.ConsumerSpec(
        process_spec=pb.ProcessSpec(
            id=pb.ProcessSpec.ID(zone=zone, suffix=suffix), endpoint="http://127.0.0.1:9000"
        ),
        shard_limit=limit,
    )


def status(code: int, *errors: str) -> cpb.ReplicaStatus:
    return cpb.ReplicaStatus(code=code, errors=list(errors))  # type: ignore[arg-type]


# --- Decoding ---------------------------------------------------------------------------------


def test_decodes_each_kind_of_key() -> None:
    item = decode(kv(f"{ROOT}/items/shard-a", spec("shard-a").SerializeToString()))
    assert item == ShardItem("shard-a", spec("shard-a"))
    member = decode(
        kv(
            f"{ROOT}/members/zone-a#consumer-a",
            consumer("zone-a", "consumer-a").SerializeToString(),
        )
    )
    assert isinstance(member, ConsumerMember) and member.spec.shard_limit == 10
    # A fresh assignment (empty value) is IDLE; the key's fields come out typed.
    fresh = decode(kv(f"{ROOT}/assign/shard-a#zone-a#consumer-a#1"))
    assert fresh == ShardAssignment("shard-a", "zone-a", "consumer-a", 1, cpb.ReplicaStatus())
    failed = decode(
        kv(f"{ROOT}/assign/shard-a#zone-a#consumer-a#0", status(FAILED, "boom").SerializeToString())
    )
    assert isinstance(failed, ShardAssignment) and list(failed.status.errors) == ["boom"]


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (f"{ROOT}/items/shard-b", spec("shard-a").SerializeToString(), "does not match its key"),
        (
            f"{ROOT}/items/shard-a",
            cpb.ShardSpec(id="shard-a").SerializeToString(),
            "max_txn_duration",
        ),
        (f"{ROOT}/items/shard-a", b"\xff\xff", "shard-a"),
        (
            f"{ROOT}/members/zone-a#consumer-b",
            consumer("zone-a", "consumer-a").SerializeToString(),
            "does not match its key",
        ),
        (f"{ROOT}/members/zone-a", b"", "expected <zone>#<suffix>"),
        (f"{ROOT}/assign/shard-a#zone-a#consumer-a#01", b"", "slot must be a decimal"),
        (f"{ROOT}/assign/shard-a#zone-a#0", b"", "expected <shard>#<zone>#<suffix>#<slot>"),
        (
            f"{ROOT}/assign/shard-a#zone-a#consumer-a#0",
            status(FAILED).SerializeToString(),
            "status.errors: must not be empty when code is FAILED",
        ),
        (
            f"{ROOT}/assign/shard-a#zone-a#consumer-a#0",
            status(PRIMARY, "x").SerializeToString(),
            "status.errors: must be empty unless code is FAILED",
        ),
        (
            f"{ROOT}/assign/shard-a#zone-a#consumer-a#0",
            cpb.ReplicaStatus(code=150).SerializeToString(),  # type: ignore[arg-type]
            "status.code: must be a ReplicaStatus.Code",
        ),
        (f"{ROOT}/other/thing", b"", "is not a shard, member or assignment key"),
    ],
)
def test_rejects_what_gazette_rejects(key: str, value: bytes, message: str) -> None:
    with pytest.raises(TopologyDecodeError, match=message):
        decode(kv(key, value))


def test_non_utf8_keys_are_rejected() -> None:
    with pytest.raises(TopologyDecodeError, match="not UTF-8"):
        decode(KeyValue(ROOT.encode() + b"/items/\xff", b"", 1, 1, 1))


# --- Statuses and routes ----------------------------------------------------------------------


def test_reduce_keeps_the_larger_code_and_bounded_errors() -> None:
    assert reduce_status(status(STANDBY), status(PRIMARY)) == status(PRIMARY)
    assert reduce_status(status(PRIMARY), status(STANDBY)) == status(PRIMARY)
    assert reduce_status(status(FAILED, "a"), status(PRIMARY)) == status(FAILED, "a")
    assert reduce_status(status(FAILED, "a", "b"), status(FAILED, "b", "c")) == status(
        FAILED, "a", "b", "c"
    )
    many = status(FAILED, *(f"e{i}" for i in range(20)))
    assert len(reduce_status(many, many).errors) == status_errors_max


def test_route_of_orders_members_and_marks_the_primary() -> None:
    route, statuses = route_of(
        [
            ShardAssignment("s", "zone-b", "c-0001", 0, status(PRIMARY)),
            ShardAssignment("s", "zone-a", "c-0002", 1, status(STANDBY)),
            # A hand-written duplicate of one member counts once, statuses reduced.
            ShardAssignment("s", "zone-a", "c-0002", 2, status(FAILED, "x")),
        ]
    )
    assert [(m.zone, m.suffix) for m in route.members] == [
        ("zone-a", "c-0002"),
        ("zone-b", "c-0001"),
    ]
    assert route.primary == 1
    assert statuses == [status(FAILED, "x"), status(PRIMARY)]
    empty, none = route_of([])
    assert empty.primary == -1 and none == []


# --- Allocator rules --------------------------------------------------------------------------


def test_replication_and_item_limits() -> None:
    def item_entry(s: cpb.ShardSpec) -> Entry[object]:
        return Entry(kv("k"), ShardItem(s.id, s))

    assert shard_replication(item_entry(spec("s-01"))) == 1
    assert shard_replication(item_entry(spec("s-01", hot_standbys=2))) == 3
    assert shard_replication(item_entry(spec("s-01", hot_standbys=2, disable=True))) == 0
    member = ConsumerMember("z", "c-01", consumer("z", "c-01", limit=7))
    assert consumer_item_limit(Entry(kv("k"), member)) == 7
    with pytest.raises(TypeError):
        shard_replication(Entry(kv("k"), member))
    with pytest.raises(TypeError):
        consumer_item_limit(item_entry(spec("s-01")))


def allocator_assignment(slot: int, value: bytes) -> AllocatorAssignment:
    return AllocatorAssignment("s", MemberId("z", f"c-{slot:04d}"), slot, kv(f"k{slot}", value))


@pytest.mark.parametrize(
    ("codes", "index", "consistent"),
    [
        ([PRIMARY, STANDBY], 1, True),
        ([PRIMARY, STANDBY], 0, True),
        ([PRIMARY, cpb.ReplicaStatus.BACKFILL], 1, False),
        ([PRIMARY, cpb.ReplicaStatus.IDLE], 1, False),
        ([PRIMARY, FAILED], 1, False),  # A failed standby while the primary is fine.
        ([FAILED, FAILED], 1, True),  # Both failed: swapping one for another loses nothing.
        ([FAILED, STANDBY], 0, True),
    ],
)
def test_shard_is_consistent(codes: list[int], index: int, consistent: bool) -> None:
    group = [
        allocator_assignment(
            slot, status(code, *(["e"] if code == FAILED else [])).SerializeToString()
        )
        for slot, code in enumerate(codes)
    ]
    item = AllocatorItem("s", 2, kv("i"))
    assert shard_is_consistent(item, group[index], group) is consistent


def test_an_undecodable_status_is_not_consistent() -> None:
    group = [allocator_assignment(0, b"\xff\xff")]
    assert not shard_is_consistent(AllocatorItem("s", 1, kv("i")), group[0], group)


# --- Lookups ----------------------------------------------------------------------------------


async def test_local_assignments_and_shards_with_source() -> None:
    backend = EmbeddedBackend()
    puts = {
        f"{ROOT}/items/shard-a": spec("shard-a", "in/one").SerializeToString(),
        f"{ROOT}/items/shard-b": spec("shard-b", "in/one", "in/two").SerializeToString(),
        f"{ROOT}/assign/shard-a#zone-a#c-0001#1": b"",
        f"{ROOT}/assign/shard-a#zone-a#c-0001#3": b"",  # Hand-written duplicate: lowest wins.
        f"{ROOT}/assign/shard-b#zone-b#c-0002#0": b"",
        f"{ROOT}/assign/shard-gone#zone-a#c-0001#0": b"",  # Its shard was deleted.
    }
    for key, value in puts.items():
        await backend.put(key.encode(), value)
    ks = new_keyspace(ROOT)
    await ks.load(backend)
    mine = local_assignments(ks, ROOT, "zone-a", "c-0001")
    assert {s: e.kv.key.decode().rsplit("#", 1)[1] for s, e in mine.items()} == {"shard-a": "1"}
    assert [s.id for s in shards_with_source(ks, ROOT, "in/one")] == ["shard-a", "shard-b"]
    assert [s.id for s in shards_with_source(ks, ROOT, "in/two")] == ["shard-b"]
    assert shards_with_source(ks, ROOT, "in/three") == []
    await backend.close()
