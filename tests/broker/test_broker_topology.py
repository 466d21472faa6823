"""Pure pieces of the write path: keyspace decoding, routes, headers, register arithmetic, the
one-slot hand-off, cancellation-safe completion, and flow-control accounting."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from broker.append_receive import ChunkReceiver, FlowControlUnderflowError
from broker.append_rules import (
    apply_register_updates,
    complete_despite_cancellation,
    desired_replication,
    may_write,
    subtract_registers,
)
from broker.keyspace.backend import KeyValue
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set
from broker.protocol.validate import ValidationError, validate_journal_spec
from broker.replica import Slot, SlotInvalidatedError, SlotStateError, wait_first
from broker.slot import Signal
from broker.topology import (
    Assignment,
    JournalItem,
    Member,
    TopologyDecodeError,
    advertised_value,
    assignment_key,
    item_key,
    make_decoder,
    member_key,
    route_from_assignments,
    routes_equivalent,
    validate_header,
    validate_route,
)

ROOT = "/gazette/cluster"
decode = make_decoder(ROOT)


def kv(key: str, value: bytes = b"") -> KeyValue:
    return KeyValue(key.encode(), value, 1, 1, 1)


def spec(name: str = "a/journal") -> pb.JournalSpec:
    return pb.JournalSpec(
        name=name,
        replication=2,
        fragment=pb.JournalSpec.Fragment(
            length=1 << 20, compression_codec=pb.NONE, refresh_interval={"seconds": 1}
        ),
    )


def broker_spec(zone: str, suffix: str) -> pb.BrokerSpec:
    return pb.BrokerSpec(
        process_spec=pb.ProcessSpec(
            id=pb.ProcessSpec.ID(zone=zone, suffix=suffix), endpoint="http://host:8080"
        )
    )


# --- Decoding -----------------------------------------------------------------------------------


def test_decodes_items_members_and_assignments() -> None:
    item = decode(kv(item_key(ROOT, "a/journal"), spec().SerializeToString()))
    assert isinstance(item, JournalItem) and item.name == "a/journal"

    member = decode(
        kv(
            member_key(ROOT, "us-east", "b1234"),
            broker_spec("us-east", "b1234").SerializeToString(),
        )
    )
    assert isinstance(member, Member) and (member.zone, member.suffix) == ("us-east", "b1234")

    empty = decode(kv(assignment_key(ROOT, "a/journal", "us-east", "b1234", 0)))
    assert empty == Assignment("a/journal", "us-east", "b1234", 0, None)

    route = pb.Route(members=[pb.ProcessSpec.ID(zone="us-east", suffix="b1234")], primary=0)
    advertised = decode(
        kv(assignment_key(ROOT, "a/journal", "us-east", "b1234", 1), advertised_value(route))
    )
    assert isinstance(advertised, Assignment) and advertised.slot == 1
    assert advertised.route is not None and routes_equivalent(advertised.route, route)


def test_decodes_a_go_written_spec_whose_postfix_template_we_cannot_evaluate() -> None:
    # Apply refuses such a template, but a journal Go's gazctl created must still be served.
    go_spec = spec()
    go_spec.fragment.path_postfix_template = '{{ printf "%05d" .Spool.Begin }}'
    with pytest.raises(ValidationError, match="path_postfix_template"):
        validate_journal_spec(go_spec)
    item = decode(kv(item_key(ROOT, "a/journal"), go_spec.SerializeToString()))
    assert isinstance(item, JournalItem) and item.spec == go_spec


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (f"{ROOT}/other/thing", b""),
        (item_key(ROOT, "a/journal"), spec("another/journal").SerializeToString()),
        (item_key(ROOT, "a/journal"), b"\xff\xff not a protobuf"),
        (item_key(ROOT, "a/journal"), pb.JournalSpec(name="a/journal").SerializeToString()),
        (f"{ROOT}/members/no-separator", broker_spec("z", "abcd").SerializeToString()),
        (member_key(ROOT, "z", "abcd"), broker_spec("z", "other").SerializeToString()),
        (f"{ROOT}/assign/a/journal#zone#suffix", b""),
        (f"{ROOT}/assign/a/journal#zone#suffix#x", b""),
        (f"{ROOT}/assign/a/journal#zone#suffix#01", b""),
        (f"{ROOT}/assign/a/journal#zone#s#0", b""),  # Suffix too short.
    ],
)
def test_refuses_malformed_keys_and_values(key: str, value: bytes) -> None:
    with pytest.raises((TopologyDecodeError, ValidationError)):
        decode(kv(key, value))


# --- Routes and headers -------------------------------------------------------------------------


def test_route_from_assignments_sorts_members_and_finds_the_primary() -> None:
    route = route_from_assignments(
        [
            Assignment("j/1", "zone-b", "bbbb", 0, None),
            Assignment("j/1", "zone-a", "zzzz", 2, None),
            Assignment("j/1", "zone-a", "aaaa", 1, None),
        ]
    )
    assert [(m.zone, m.suffix) for m in route.members] == [
        ("zone-a", "aaaa"),
        ("zone-a", "zzzz"),
        ("zone-b", "bbbb"),
    ]
    assert route.primary == 2
    assert route_from_assignments([Assignment("j/1", "z", "abcd", 1, None)]).primary == -1
    validate_route(route)


def test_routes_are_equivalent_regardless_of_endpoints() -> None:
    a = pb.Route(members=[pb.ProcessSpec.ID(zone="z", suffix="abcd")], primary=0)
    b = pb.Route(members=a.members, primary=0, endpoints=["http://elsewhere:1"])
    assert routes_equivalent(a, b)
    assert not routes_equivalent(a, pb.Route(members=a.members, primary=-1))
    assert not routes_equivalent(a, pb.Route(primary=0))


@pytest.mark.parametrize(
    ("route", "path"),
    [
        (
            pb.Route(members=[{"zone": "b", "suffix": "abcd"}, {"zone": "a", "suffix": "abcd"}]),
            "members",
        ),
        (pb.Route(members=[{"zone": "a", "suffix": "abcd"}], primary=1), "primary"),
        (pb.Route(members=[{"zone": "a", "suffix": "abcd"}], endpoints=["x", "y"]), "endpoints"),
    ],
)
def test_validate_route(route: pb.Route, path: str) -> None:
    with pytest.raises(ValidationError) as info:
        validate_route(route)
    assert info.value.path == path


def test_validate_header_needs_a_revision() -> None:
    with pytest.raises(ValidationError) as info:
        validate_header(pb.Header(route=pb.Route(primary=-1)))
    assert info.value.path == "etcd.revision"


# --- Registers and flags ------------------------------------------------------------------------


def test_subtract_removes_a_name_only_with_its_exact_values() -> None:
    registers = label_set([("epoch", "7"), ("owner", "a"), ("tag", "x"), ("tag", "y")])
    assert subtract_registers(registers, label_set([("owner", "a")])) == label_set(
        [("epoch", "7"), ("tag", "x"), ("tag", "y")]
    )
    assert subtract_registers(registers, label_set([("owner", "b"), ("tag", "x")])) == registers
    assert subtract_registers(registers, label_set([("tag", "x"), ("tag", "y")])) == label_set(
        [("epoch", "7"), ("owner", "a")]
    )


def test_register_updates_subtract_then_union_with_request_values_winning() -> None:
    registers = label_set([("owner", "a"), ("epoch", "1")])
    req = pb.AppendRequest(
        union_registers=label_set([("owner", "b")]),
        subtract_registers=label_set([("epoch", "1")]),
    )
    assert apply_register_updates(registers, req) == label_set([("owner", "b")])


def test_may_write_and_desired_replication() -> None:
    assert may_write(pb.JournalSpec(flags=0))
    assert may_write(pb.JournalSpec(flags=pb.JournalSpec.O_RDWR))
    assert may_write(pb.JournalSpec(flags=pb.JournalSpec.O_WRONLY))
    assert not may_write(pb.JournalSpec(flags=pb.JournalSpec.O_RDONLY))
    s = pb.JournalSpec(replication=3)
    assert desired_replication(s) == 3
    s.suspend.level = pb.JournalSpec.Suspend.PARTIAL
    assert desired_replication(s) == 1
    s.suspend.level = pb.JournalSpec.Suspend.FULL
    assert desired_replication(s) == 0


# --- The one-slot hand-off ----------------------------------------------------------------------


# A resolution's invalidation is a Signal (no task per waiter); any other event works too.
EVENTS = [asyncio.Event, Signal]


@pytest.mark.parametrize("event", EVENTS)
async def test_slot_hands_its_value_to_one_owner_at_a_time(event: type[asyncio.Event]) -> None:
    slot = Slot("test", "value")
    never = event()
    assert await slot.take(never) == "value"
    waiter = asyncio.ensure_future(slot.take(never))
    await asyncio.sleep(0)
    assert not waiter.done()
    slot.put("value")
    assert await waiter == "value"
    slot.put("value")
    with pytest.raises(SlotStateError):
        slot.put("second owner")


@pytest.mark.parametrize("event", EVENTS)
async def test_slot_take_is_abandoned_on_invalidation_without_losing_the_value(
    event: type[asyncio.Event],
) -> None:
    slot: Slot[str] = Slot("test", "value")
    assert slot.take_nowait() == "value"
    invalidated = event()
    waiter = asyncio.ensure_future(slot.take(invalidated))
    await asyncio.sleep(0)
    # Both happen in the same instant: the invalidation wins, the value stays in the slot.
    slot.put("value")
    invalidated.set()
    with pytest.raises(SlotInvalidatedError):
        await waiter
    assert slot.take_nowait() == "value"


@pytest.mark.parametrize("event", EVENTS)
async def test_slot_take_cancelled_puts_a_received_value_back(event: type[asyncio.Event]) -> None:
    slot: Slot[str] = Slot("test", "value")
    assert slot.take_nowait() == "value"
    waiter = asyncio.ensure_future(slot.take(event()))
    await asyncio.sleep(0)
    slot.put("value")
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert slot.take_nowait() == "value"


@pytest.mark.parametrize("event", EVENTS)
@pytest.mark.parametrize("steps", range(8))
async def test_slot_value_is_never_lost_whenever_the_taker_is_cancelled(
    steps: int, event: type[asyncio.Event]
) -> None:
    # The value arrives, then the taker is cancelled after `steps` turns of the event loop:
    # wherever the cancellation lands, the taker either got the value or it is back in the
    # slot. (A take that awaited again after getting it lost it to a cancellation there: the
    # journal's pipeline was then gone for good, and every later append waited forever.)
    slot: Slot[str] = Slot("test", "value")
    assert slot.take_nowait() == "value"
    taker = asyncio.ensure_future(slot.take(event()))
    await asyncio.sleep(0)
    slot.put("value")
    for _ in range(steps):
        await asyncio.sleep(0)
    taker.cancel()
    try:
        got: str | None = await taker
    except asyncio.CancelledError:
        got = None
    in_slot = slot.take_nowait()
    assert (got, in_slot) in {("value", None), (None, "value")}


@pytest.mark.parametrize("event", EVENTS)
async def test_slot_hands_the_value_to_its_waiters_in_turn(event: type[asyncio.Event]) -> None:
    # What `put` gives back goes straight to the longest waiter: no one barges in between.
    slot: Slot[str] = Slot("test", "value")
    assert slot.take_nowait() == "value"
    never = event()
    first = asyncio.ensure_future(slot.take(never))
    second = asyncio.ensure_future(slot.take(never))
    await asyncio.sleep(0)
    slot.put("value")
    assert slot.take_nowait() is None  # Handed to `first` already.
    assert await first == "value"
    assert not second.done()
    slot.put("value")
    assert await second == "value"


async def test_a_second_put_is_refused_while_the_value_is_on_its_way_to_a_waiter() -> None:
    slot: Slot[str] = Slot("test", "value")
    assert slot.take_nowait() == "value"
    waiter = asyncio.ensure_future(slot.take(Signal()))
    await asyncio.sleep(0)
    slot.put("value")  # Handed to the waiter, which has not run yet.
    with pytest.raises(SlotStateError):
        slot.put("second owner")
    assert await waiter == "value"
    empty: Slot[str] = Slot.empty("handed over later")
    empty.put("value")
    with pytest.raises(SlotStateError):
        empty.put("second owner")


async def test_an_invalidated_waiter_leaves_the_others_their_turn() -> None:
    slot: Slot[str] = Slot("test", "value")
    assert slot.take_nowait() == "value"
    old, new = Signal(), Signal()
    under_old = asyncio.ensure_future(slot.take(old))
    under_new = asyncio.ensure_future(slot.take(new))
    await asyncio.sleep(0)
    old.set()
    with pytest.raises(SlotInvalidatedError):
        await under_old
    slot.put("value")
    assert await under_new == "value"


async def test_a_take_under_a_signal_waits_without_a_task_of_its_own() -> None:
    slot: Slot[str] = Slot("test", "value")
    assert slot.take_nowait() == "value"
    before = len(asyncio.all_tasks())
    taker = asyncio.ensure_future(slot.take(Signal()))
    await asyncio.sleep(0)
    assert not taker.done()
    assert len(asyncio.all_tasks()) == before + 1  # The taker alone.
    slot.put("value")
    assert await taker == "value"


async def test_wait_first() -> None:
    a, b = asyncio.Event(), asyncio.Event()
    assert not await wait_first([a, b], 0.01)
    b.set()
    assert await wait_first([a, b], None)


async def test_complete_despite_cancellation_finishes_then_re_raises() -> None:
    release, finished = asyncio.Event(), asyncio.Event()

    async def step() -> None:
        await release.wait()
        finished.set()

    outer = asyncio.ensure_future(complete_despite_cancellation(step()))
    await asyncio.sleep(0)
    outer.cancel()
    await asyncio.sleep(0)
    assert not outer.done()  # Still completing the step.
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await outer
    assert finished.is_set()


# --- Flow control -------------------------------------------------------------------------------


async def _chunks(sizes: list[int]) -> AsyncIterator[pb.AppendRequest]:
    for size in sizes:
        yield pb.AppendRequest(content=b"x" * size)


async def test_flow_control_credit_drains_at_the_minimum_rate() -> None:
    now = [0.0]
    receiver = ChunkReceiver(
        _chunks([100, 100, 100, 100]),
        min_rate_bytes_per_s=1000,
        burst_s=0.2,
        clock=lambda: now[0],
    )
    # Credit starts at 200 bytes (0.2 s at 1000 B/s); each chunk tops it up, capped at 200.
    assert (await receiver.recv())[1] is None  # 200 (capped).
    now[0] += 0.15
    assert (await receiver.recv())[1] is None  # 200 - 150 + 100 = 150.
    now[0] += 0.1
    assert (await receiver.recv())[1] is None  # 150 - 100 + 100 = 150.
    now[0] += 0.16  # 160 bytes' worth of time: the credit is gone before the next chunk.
    req, err = await receiver.recv()
    assert req is None and isinstance(err, FlowControlUnderflowError)
    assert receiver.total_chunks == 3


async def test_flow_control_end_of_stream() -> None:
    receiver = ChunkReceiver(_chunks([]), min_rate_bytes_per_s=1000, burst_s=1.0)
    assert await receiver.recv() == (None, None)
