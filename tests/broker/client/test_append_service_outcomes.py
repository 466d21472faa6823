"""Every append an AppendService accepted either commits or reaches someone as a typed error:
fire-and-forget publishers learn of failures when they leave the service (or flush), retries
stop after `retry_s_max` with a typed error while showing what is stuck, a failed batch stays in
the barrier of `pending_except`, and a stop cancels what is pending with AppendCancelledError,
quietly (it is the owner's choice, not a failure). Real in-process brokers throughout."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import msgspec
import pytest
from structlog.testing import capture_logs

from broker.client.append_errors import (
    AppendCancelledError,
    AppendRetriesExhaustedError,
    AppendsFailedError,
    DependencyCancelledError,
    DependencyFailedError,
    JournalFailedError,
    is_transient,
)
from broker.client.append_service import AppendService
from broker.client.route_cache import JournalClient
from broker.fragment.naming import sum_from_digest
from broker.fragment.stores.registry import new_registry
from broker.protocol import labels
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import (
    FragmentStoreUnhealthyError,
    IndexHasGreaterOffsetError,
    InsufficientJournalBrokersError,
    JournalNotFoundError,
    NoJournalPrimaryBrokerError,
    NotAllowedError,
    NotJournalPrimaryBrokerError,
    ProposalMismatchError,
    RegisterMismatchError,
    WrongAppendOffsetError,
)
from gazette_consumer.message import CONTENT_TYPE_JSON_LINES, JSONMessage
from gazette_consumer.message.mapping import Partition
from gazette_consumer.message.publisher import Publisher
from tests.broker.broker_testkit import Cluster, journal_spec, local_content, replica_of

GOOD = "outcomes/good"
BAD = "outcomes/bad"
STORE = "file:///frags/"
WAIT_S = 30.0


class Note(JSONMessage, kw_only=True):
    text: str = ""


def to(journal: str) -> Any:
    return lambda _message: Partition(journal, CONTENT_TYPE_JSON_LINES)


def json_spec(name: str, **kwargs: Any) -> pb.JournalSpec:
    spec = journal_spec(name, **kwargs)
    spec.labels.CopyFrom(labels.label_set([(labels.CONTENT_TYPE, CONTENT_TYPE_JSON_LINES)]))
    return spec


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    (tmp_path / "frags").mkdir()
    c = Cluster(stores=new_registry(file_root=tmp_path))
    try:
        yield c
    finally:
        await c.close()


async def refusing_journal(cluster: Cluster, name: str) -> None:
    """A journal whose store holds a fragment its broker never took part in (written by a broker
    that is gone, as after a restart without its spool): it answers every append with
    INDEX_HAS_GREATER_OFFSET until an operator resets its head."""
    assert cluster.stores is not None
    content = b'{"text": "from a broker that is gone"}\n'
    fragment = pb.Fragment(
        journal=name,
        begin=0,
        end=len(content),
        sum=sum_from_digest(hashlib.sha1(content).digest()),
        compression_codec=pb.NONE,
    )
    await cluster.stores.get(STORE).put(fragment, content)
    await cluster.create(json_spec(name, stores=[STORE]), cluster.brokers)
    await replica_of(cluster.brokers[0], name).index.wait_first_refresh(5.0)


async def test_fire_and_forget_publishes_that_fail_raise_when_leaving_the_service(
    cluster: Cluster, client: JournalClient
) -> None:
    await cluster.create(json_spec(GOOD), cluster.brokers)
    await refusing_journal(cluster, BAD)
    service = AppendService(client)
    handles = []
    with pytest.raises(AppendsFailedError) as failure:
        async with service:
            publisher = Publisher(service)
            for n in range(3):
                # As the README's publisher does: no handle awaited.
                handles.append(await publisher.publish_committed(to(BAD), Note(text=f"b{n}")))
                await publisher.publish_committed(to(GOOD), Note(text=f"g{n}"))
    # The exception names the journal and how many batches of it failed; the first error is
    # the cause, typed.
    error = failure.value
    assert set(error.failed) == {BAD} and error.failed[BAD] >= 1
    assert BAD in str(error) and "INDEX_HAS_GREATER_OFFSET" in str(error)
    assert isinstance(error.__cause__, IndexHasGreaterOffsetError)
    for handle in handles:
        # The first batch's own error, or (a later batch of the journal) the sticky failure
        # that names it.
        with pytest.raises((IndexHasGreaterOffsetError, JournalFailedError)) as refused:
            await handle
        if isinstance(refused.value, JournalFailedError):
            assert isinstance(refused.value.__cause__, IndexHasGreaterOffsetError)
    assert service.failures == error.failed
    # The healthy journal got everything.
    lines = local_content(cluster.brokers[0], GOOD)[1].splitlines()
    assert [msgspec.json.decode(line, type=Note).text for line in lines] == ["g0", "g1", "g2"]


async def test_flush_raises_for_the_batches_it_waited_on_that_failed(
    cluster: Cluster, client: JournalClient
) -> None:
    await cluster.create(json_spec(GOOD), cluster.brokers)
    service = AppendService(client)
    async with service:
        missing = await service.start_append("outcomes/missing")
        missing.write(b"lost\n")
        missing.release()
        with pytest.raises(AppendsFailedError) as flushed:
            await service.flush()
        assert flushed.value.failed == {"outcomes/missing": 1}
        assert isinstance(flushed.value.__cause__, JournalNotFoundError)
        # A flush over batches that all committed raises nothing.
        fine = await service.start_append(GOOD)
        fine.write(b"fine\n")
        fine.release()
        await service.flush()
        assert fine.done() and fine.exception() is None
    # Reported by the flush: not raised again at the exit.
    assert service.failures == {"outcomes/missing": 1}
    assert local_content(cluster.brokers[0], GOOD)[1] == b"fine\n"


async def test_a_journals_failure_is_sticky_so_nothing_commits_after_a_hole(
    cluster: Cluster, client: JournalClient
) -> None:
    # A reader must never see later messages of a journal without earlier ones that failed:
    # once a batch of a journal failed, the service sends no later batch of it (as Gazette's).
    other = "outcomes/other"
    await cluster.create(json_spec(GOOD), cluster.brokers)
    await cluster.create(json_spec(other), cluster.brokers)
    async with AppendService(client) as service:
        refused = await service.start_append(pb.AppendRequest(journal=GOOD, offset=999))
        refused.write(b"at a wrong offset\n")
        refused.release()
        later = await service.start_append(GOOD)
        later.write(b"after the hole\n")
        later.release()
        elsewhere = await service.start_append(other)
        elsewhere.write(b"unaffected\n")
        elsewhere.release()
        with pytest.raises(WrongAppendOffsetError):
            await refused
        with pytest.raises(JournalFailedError, match="earlier append to it failed") as held:
            await later
        assert isinstance(held.value.__cause__, WrongAppendOffsetError)
        assert isinstance(held.value, DependencyFailedError)
        await elsewhere
        # Still sticky for batches started after the failure was known.
        again = await service.start_append(GOOD)
        again.write(b"still after the hole\n")
        again.release()
        with pytest.raises(JournalFailedError):
            await again
    assert service.failures == {GOOD: 3}
    assert local_content(cluster.brokers[0], GOOD)[1] == b""
    assert local_content(cluster.brokers[0], other)[1] == b"unaffected\n"


async def test_a_failed_batch_stays_in_the_pending_barrier(
    cluster: Cluster, client: JournalClient
) -> None:
    # What a consumer's commit waits on: every pending append of other journals. A batch that
    # failed before the barrier was taken must still fail it, or the commit would pass it by.
    await cluster.create(json_spec(GOOD), cluster.brokers)
    async with AppendService(client) as service:
        missing = await service.start_append("outcomes/missing")
        missing.write(b"lost\n")
        missing.release()
        with pytest.raises(JournalNotFoundError):
            await missing
        barrier = service.pending_except(GOOD)
        assert barrier == [missing]
        checkpoint = await service.start_append(GOOD, [b.future for b in barrier])
        checkpoint.write(b"checkpoint\n")
        checkpoint.release()
        with pytest.raises(DependencyFailedError):
            await checkpoint
        assert service.pending_except("outcomes/missing") == [checkpoint]
    assert service.failures == {"outcomes/missing": 1, GOOD: 1}
    assert local_content(cluster.brokers[0], GOOD)[1] == b""


class SteppedClock:
    """A clock and a back-off sleep for the service: each sleep moves the clock by its delay
    at once, and tells the test a retry is pending."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []
        self.retrying = asyncio.Event()

    def clock(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.slept.append(delay)
        self.now += delay
        self.retrying.set()
        await asyncio.sleep(0)


async def test_retries_stop_after_retry_s_max_with_a_typed_error_and_show_meanwhile(
    cluster: Cluster, client: JournalClient
) -> None:
    await cluster.put_spec(json_spec(GOOD))  # A spec, but no broker assigned: no primary.
    time = SteppedClock()
    service = AppendService(
        client,
        retry_s_max=3.0,
        backoff_initial_s=0.5,
        backoff_max_s=1.0,
        sleep=time.sleep,
        clock=time.clock,
    )
    async with service:
        stuck = await service.start_append(GOOD)
        stuck.write(b"no primary\n")
        stuck.release()
        await asyncio.wait_for(time.retrying.wait(), WAIT_S)
        # While it is retried, the handle and the service say so, and why.
        assert service.retrying() == [stuck]
        assert stuck.attempts >= 1
        assert isinstance(stuck.last_error, NoJournalPrimaryBrokerError)
        with pytest.raises(AppendRetriesExhaustedError) as exhausted:
            await asyncio.wait_for(stuck, WAIT_S)
        assert service.retrying() == []
    # Back-offs 0.5, 1.0, 1.0 fit in 3 s; the next would pass it.
    assert time.slept == [0.5, 1.0, 1.0]
    assert exhausted.value.attempts == 4 == stuck.attempts
    assert isinstance(exhausted.value.__cause__, NoJournalPrimaryBrokerError)
    assert "gave up after 4 attempts" in str(exhausted.value)
    assert service.failures == {GOOD: 1}


async def test_leaving_by_an_error_cancels_pending_appends_quietly(
    cluster: Cluster, client: JournalClient
) -> None:
    await cluster.put_spec(json_spec(GOOD))  # No primary: its batch is retried, in flight.
    await cluster.create(json_spec(BAD), cluster.brokers)
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    time = SteppedClock()
    service = AppendService(client, sleep=time.sleep, clock=time.clock)
    with capture_logs() as logs, pytest.raises(RuntimeError, match="owner stops"):
        async with service:
            retried = await service.start_append(GOOD)
            retried.write(b"being retried\n")
            retried.release()
            waiting = await service.start_append(BAD, [never])
            waiting.write(b"never sent\n")
            waiting.release()
            await asyncio.wait_for(time.retrying.wait(), WAIT_S)
            raise RuntimeError("the owner stops")
    with pytest.raises(AppendCancelledError) as sent:
        await retried
    assert sent.value.maybe_committed  # An attempt was made: it may have landed.
    with pytest.raises(AppendCancelledError) as unsent:
        await waiting
    assert not unsent.value.maybe_committed
    assert service.stats.cancelled == 2 and service.stats.failed == 0
    assert service.failures == {}
    # A stop is not a failure of the appends: nothing says "append failed".
    assert [e for e in logs if e["event"] == "append failed"] == []
    assert local_content(cluster.brokers[0], BAD)[1] == b""


async def test_cancelling_the_owner_cancels_pending_appends_quietly(
    cluster: Cluster, client: JournalClient
) -> None:
    # What stopping a consumer shard does: its task, inside `async with`, is cancelled.
    await cluster.create(json_spec(GOOD), cluster.brokers)
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    held: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    async def owner() -> None:
        async with AppendService(client) as service:
            waiting = await service.start_append(GOOD, [never])
            waiting.write(b"never sent\n")
            waiting.release()
            held.set_result(waiting)
            await asyncio.Event().wait()

    with capture_logs() as logs:
        task = asyncio.create_task(owner())
        waiting = await asyncio.wait_for(held, WAIT_S)
        task.cancel()
        await asyncio.wait([task])
    assert task.cancelled()
    with pytest.raises(AppendCancelledError):
        await waiting
    assert [e for e in logs if e["log_level"] in ("warning", "error")] == []


async def test_a_dependency_its_owner_cancels_while_stopping_cancels_quietly(
    cluster: Cluster, client: JournalClient
) -> None:
    # A stopping shard destroys its store (abandoning the commit its ACK intents depend on)
    # before it leaves its AppendService: the ACK batch is cancelled, not a failure.
    await cluster.create(json_spec(GOOD), cluster.brokers)
    commit: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    with capture_logs() as logs, pytest.raises(RuntimeError, match="stopping"):
        async with AppendService(client) as service:
            ack = await service.start_append(GOOD, [commit])
            ack.write(b"ack\n")
            ack.release()
            commit.cancel()
            with pytest.raises(DependencyCancelledError):
                await asyncio.wait_for(ack, WAIT_S)
            raise RuntimeError("stopping")
    assert not ack.exception().maybe_committed  # type: ignore[union-attr]
    assert service.stats.cancelled == 1 and service.failures == {}
    assert [e for e in logs if e["log_level"] in ("warning", "error")] == []


def test_transient_and_terminal_failures_are_classified_as_gazette_does() -> None:
    for terminal in (
        IndexHasGreaterOffsetError(),
        JournalNotFoundError(),
        NotAllowedError(),
        RegisterMismatchError(),
        WrongAppendOffsetError(),
        FragmentStoreUnhealthyError(),
        ValueError("a bug"),
    ):
        assert not is_transient(terminal), terminal
    for transient in (
        NoJournalPrimaryBrokerError(),
        NotJournalPrimaryBrokerError(),
        InsufficientJournalBrokersError(),
        ProposalMismatchError(),
        TimeoutError(),
        ConnectionResetError(),
    ):
        assert is_transient(transient), transient
    unavailable = grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata()
    )
    refused = grpc.aio.AioRpcError(
        grpc.StatusCode.PERMISSION_DENIED, grpc.aio.Metadata(), grpc.aio.Metadata()
    )
    assert is_transient(unavailable) and not is_transient(refused)
