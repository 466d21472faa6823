"""No one request stalls a broker: real in-process brokers, over their gRPC API.

A request over a limit (labels of a spec, registers of an append) is refused with
INVALID_ARGUMENT naming the limit and the field, and changes nothing. Requests within the limits
that carry many labels (a List of journals with a thousand labels each) never hold the broker's
event loop for long: a task ticking on the loop sees no gap longer than a fraction of a second,
and an append to an unrelated journal, sent while the List runs, completes meanwhile. (Before the
label operations were made near-linear, that List held the loop for seconds.)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable

import grpc
import pytest
from broker_testkit import ROOT, Cluster, journal_spec, local_content
from google.protobuf.duration_pb2 import Duration

from broker.keyspace.backend import prefix_end
from broker.list_apply_api import list_response_bytes_max, validate_apply_request_sliced
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set
from broker.protocol.limits import labels_per_set_max
from broker.protocol.validate import LABEL_VALUE_LEN_MAX, ValidationError
from broker.server import Broker
from broker.topology import item_key
from gazette_consumer import shard_specs_api

# The longest the event loop may stall in these tests. Work within the limits takes a few
# milliseconds; this bound leaves room for a loaded test machine, and is far below the seconds
# the same requests took when label operations were quadratic.
loop_gap_s_max = 0.5


class LoopGaps:
    """The longest the event loop went without running a ticking task."""

    def __init__(self, tick_s: float = 0.005) -> None:
        self.tick_s = tick_s
        self.longest_s = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(self.tick_s)
            now = time.monotonic()
            self.longest_s = max(self.longest_s, now - last - self.tick_s)
            last = now

    async def __aenter__(self) -> LoopGaps:
        self._task = asyncio.ensure_future(self._run())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


def labelled_spec(name: str, count: int, value_len: int = 8) -> pb.JournalSpec:
    spec = journal_spec(name)
    spec.labels.CopyFrom(label_set((f"tag-{i:06d}", "v" * value_len) for i in range(count)))
    return spec


@pytest.fixture
async def broker(cluster: Cluster) -> AsyncIterator[Broker]:
    yield await cluster.start_broker("zone-a", "broker-a")


async def test_apply_over_the_label_limit_is_refused_and_changes_nothing(
    cluster: Cluster, broker: Broker
) -> None:
    stub = cluster.stub(broker)
    change = pb.ApplyRequest.Change(upsert=labelled_spec("limits/many", 10_000))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Apply(pb.ApplyRequest(changes=[change]))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        "ApplyRequest.changes[0].upsert.labels: 10000 labels exceed labels_per_set_max"
        f" ({labels_per_set_max})"
    )
    listed = [r async for r in stub.List(pb.ListRequest())]
    assert [j.spec.name for r in listed for j in r.journals] == []

    # At the limit, the same spec applies.
    change = pb.ApplyRequest.Change(upsert=labelled_spec("limits/many", labels_per_set_max))
    assert (await stub.Apply(pb.ApplyRequest(changes=[change]))).status == pb.OK


async def test_append_over_the_register_limit_is_refused_and_changes_nothing(
    cluster: Cluster, broker: Broker
) -> None:
    await cluster.create(journal_spec("limits/registers"), [broker])
    registers = label_set((f"reg-{i:06d}", "1") for i in range(10_000))
    resp_or_error: pb.AppendResponse | grpc.aio.AioRpcError
    try:
        resp_or_error = await cluster.append(
            broker, "limits/registers", [b"data"], union_registers=registers
        )
    except grpc.aio.AioRpcError as err:
        resp_or_error = err
    assert isinstance(resp_or_error, grpc.aio.AioRpcError)
    assert resp_or_error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert resp_or_error.details() == (
        f"append: union_registers: 10000 labels exceed labels_per_set_max ({labels_per_set_max})"
    )
    # Nothing was written and no register was set: the next append starts at 0, unfenced.
    resp = await cluster.append(broker, "limits/registers", [b"ok"])
    assert (resp.status, resp.commit.begin, list(resp.registers.labels)) == (pb.OK, 0, [])
    assert local_content(broker, "limits/registers") == (0, b"ok")


async def test_registers_accumulated_over_appends_stay_within_the_limit(
    cluster: Cluster, broker: Broker
) -> None:
    # Each append's sets are within the limit, but unions accumulate: the journal's registers
    # may not grow past it either.
    await cluster.create(journal_spec("limits/accumulated"), [broker])
    half = labels_per_set_max // 2 + 1
    first = label_set((f"a-{i:06d}", "1") for i in range(half))
    resp = await cluster.append(broker, "limits/accumulated", [b"one"], union_registers=first)
    assert len(resp.registers.labels) == half
    second = label_set((f"b-{i:06d}", "1") for i in range(half))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await cluster.append(broker, "limits/accumulated", [b"two"], union_registers=second)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        "append to limits/accumulated: union_registers: the journal's registers would hold"
        f" {2 * half} labels, over"
        f" labels_per_set_max ({labels_per_set_max}): subtract some first"
    )
    # Nothing was written, the registers are as they were; subtracting first makes room.
    resp = await cluster.append(
        broker, "limits/accumulated", [b"two"], subtract_registers=first, union_registers=second
    )
    assert (resp.commit.begin, len(resp.registers.labels)) == (3, half)
    assert local_content(broker, "limits/accumulated") == (0, b"onetwo")


async def test_list_of_label_heavy_journals_does_not_stall_the_broker(
    cluster: Cluster, broker: Broker
) -> None:
    journals = 20
    for index in range(journals):
        await cluster.put_spec(labelled_spec(f"limits/heavy-{index:03d}", 1000))
    await cluster.create(journal_spec("limits/unrelated"), [broker])
    stub = cluster.stub(broker)

    async def timed_append() -> float:
        started = time.monotonic()
        resp = await cluster.append(broker, "limits/unrelated", [b"x"])
        assert resp.status == pb.OK
        return time.monotonic() - started

    await timed_append()  # Warm: the journal's pipeline exists.
    async with LoopGaps() as gaps:
        selector = pb.LabelSelector(include=label_set([("tag-000999", "")]))
        listing = asyncio.ensure_future(_collect(stub.List(pb.ListRequest(selector=selector))))
        append_s = await timed_append()
        listed = await listing
    assert len(listed) == journals
    assert gaps.longest_s < loop_gap_s_max, f"event loop stalled {gaps.longest_s:.3f}s"
    assert append_s < loop_gap_s_max, f"unrelated append took {append_s:.3f}s"


async def _collect(call: AsyncIterator[pb.ListResponse]) -> list[str]:
    return [j.spec.name async for r in call for j in r.journals]


async def test_list_messages_are_bounded_in_bytes(cluster: Cluster, broker: Broker) -> None:
    """Journals of about 1 MiB each (the most labels, of the longest values): a List splits
    them into messages of at most list_response_bytes_max."""
    count = 6
    for index in range(count):
        await cluster.put_spec(
            labelled_spec(f"limits/big-{index}", labels_per_set_max, LABEL_VALUE_LEN_MAX)
        )
    await cluster.sync(await cluster.put_spec(journal_spec("limits/small")))
    messages = [m async for m in cluster.stub(broker).List(pb.ListRequest())]
    assert sum(len(m.journals) for m in messages) == count + 1
    assert len(messages) > 1
    for message in messages:
        # The bound counts each spec at its etcd size; a message adds a few bytes per journal.
        assert message.ByteSize() <= list_response_bytes_max + 64 * len(message.journals)


async def test_a_list_shows_one_revision_while_journals_change(
    cluster: Cluster, broker: Broker
) -> None:
    """A List that yields the event loop part-way still answers with the journals of exactly
    the revision its header names, though journals are deleted meanwhile."""
    journals = 400
    for index in range(journals):
        await cluster.put_spec(labelled_spec(f"limits/churn-{index:04d}", 100))
    await cluster.sync(await cluster.put_spec(journal_spec("limits/anchor")))
    stub = cluster.stub(broker)
    prefix = f"{ROOT}/items/".encode()

    async def delete_all() -> None:
        for index in reversed(range(journals)):
            await cluster.admin.delete(item_key(ROOT, f"limits/churn-{index:04d}").encode())

    deleting = asyncio.ensure_future(delete_all())
    overlapped = 0
    try:
        while not deleting.done():
            messages = [m async for m in stub.List(pb.ListRequest())]
            revision = messages[0].header.etcd.revision
            listed = sorted(j.spec.name for m in messages for j in m.journals)
            at_revision = await cluster.admin.range(prefix, prefix_end(prefix), revision)
            expected = sorted(kv.key.decode()[len(prefix) :] for kv in at_revision.kvs)
            assert listed == expected, revision
            overlapped += broker.ks.header.revision > revision
    finally:
        await deleting
    assert overlapped, "no List overlapped a deletion: the test proved nothing"


async def _ticks_during(work: Awaitable[object]) -> tuple[int, BaseException | None]:
    """How many times another task ran while `work` was awaited, and what `work` raised."""
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0)
            ticks += 1

    task = asyncio.ensure_future(ticker())
    await asyncio.sleep(0)
    started = ticks
    error: BaseException | None = None
    try:
        await work
    except ValidationError as err:
        error = err
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return ticks - started, error


async def test_an_apply_of_many_large_specs_is_validated_in_slices() -> None:
    """Validating 40 specs at the label limit is tens of milliseconds of work: it yields the
    event loop between changes (other tasks run meanwhile), and still names the bad change."""
    changes = [
        pb.ApplyRequest.Change(
            upsert=labelled_spec(f"limits/apply-{i:03d}", labels_per_set_max, 64)
        )
        for i in range(40)
    ]
    bad = labelled_spec("limits/apply-bad", labels_per_set_max + 1)
    request = pb.ApplyRequest(changes=[*changes, pb.ApplyRequest.Change(upsert=bad)])
    ticks, error = await _ticks_during(validate_apply_request_sliced(request))
    assert ticks > 0
    assert str(error) == f"changes[40].upsert.labels: {labels_per_set_max + 1} labels exceed" + (
        f" labels_per_set_max ({labels_per_set_max})"
    )

    shard_labels = label_set((f"tag-{i:06d}", "v" * 64) for i in range(labels_per_set_max))
    shard_changes = [
        cpb.ApplyRequest.Change(
            upsert=cpb.ShardSpec(
                id=f"shard-{i:03d}", max_txn_duration=Duration(seconds=1), labels=shard_labels
            )
        )
        for i in range(40)
    ]
    ticks, error = await _ticks_during(
        shard_specs_api.validate_apply_request_sliced(cpb.ApplyRequest(changes=shard_changes))
    )
    assert ticks > 0 and error is None
