"""AppendService failures against real in-process brokers: typed errors on the futures of the
batches that failed (a journal's failure is sticky: its later batches fail with
JournalFailedError, other journals go on, and leaving the service raises AppendsFailedError),
transient failures retried until they succeed, exhausted retries, dependencies, closing, and
refused input."""

from __future__ import annotations

import asyncio
import socket

import pytest

from broker.client.append_errors import (
    AppendCancelledError,
    AppendRetriesExhaustedError,
    AppendServiceClosedError,
    DependencyFailedError,
    JournalFailedError,
    backoff_s,
    is_transient,
)
from broker.client.append_service import AppendService
from broker.client.route_cache import JournalClient
from broker.protocol import protocol_pb2 as pb
from broker.protocol import protocol_pb2_grpc as pb_grpc
from broker.protocol.status import (
    IndexHasGreaterOffsetError,
    JournalNotFoundError,
    NoJournalPrimaryBrokerError,
    WrongAppendOffsetError,
)
from broker.protocol.validate import ValidationError
from tests.broker.broker_testkit import Cluster, journal_spec, local_content
from tests.broker.read_testkit import serving

J = "test/errors"


class GatedSleep:
    """A back-off sleep that tells the test a retry is pending, and holds it until the test
    opens the gate (after that, back-offs pass at once)."""

    def __init__(self, *, then_sleep: bool = False) -> None:
        self.calls: list[float] = []
        self.called = asyncio.Event()
        self.gate = asyncio.Event()
        self.then_sleep = then_sleep

    async def __call__(self, delay: float) -> None:
        self.calls.append(delay)
        self.called.set()
        await self.gate.wait()
        if self.then_sleep:
            await asyncio.sleep(delay)


async def append_line(service: AppendService, journal: str | pb.AppendRequest, line: bytes):  # type: ignore[no-untyped-def]
    aa = await service.start_append(journal)
    aa.write(line)
    aa.release()
    return aa


def content(cluster: Cluster, journal: str) -> bytes:
    return local_content(cluster.brokers[0], journal)[1]


async def test_journal_not_found_fails_the_journal_until_a_new_service(
    cluster: Cluster, client: JournalClient
) -> None:
    missing = "test/created-later"
    await cluster.create(journal_spec(J), cluster.brokers)
    service = AppendService(client)
    async with service:
        await _missing_then_created(cluster, service, missing)
    # Both failures were awaited and handled: counted, and not raised again at the exit.
    assert service.failures == {missing: 2}
    assert content(cluster, missing) == b""
    assert content(cluster, J) == b"fine\n"
    assert service.stats.failed == 2 and service.stats.committed == 1
    # A new service appends to it (the failure belonged to the old one).
    async with AppendService(client) as again:
        response: pb.AppendResponse = await (await append_line(again, missing, b"found\n"))
    assert (response.commit.begin, response.commit.end) == (0, 6)
    assert content(cluster, missing) == b"found\n"


async def _missing_then_created(cluster: Cluster, service: AppendService, missing: str) -> None:
    lost = await append_line(service, missing, b"lost\n")
    with pytest.raises(JournalNotFoundError):
        await lost
    assert service.stats.retries == 0  # Not transient: surfaced at once.
    # Other journals are unaffected.
    await (await append_line(service, J, b"fine\n"))
    # Once the journal exists, this service still sends nothing more to it: a later message
    # must never land without the earlier ones.
    await cluster.create(journal_spec(missing), cluster.brokers)
    with pytest.raises(JournalFailedError) as held:
        await (await append_line(service, missing, b"found\n"))
    assert isinstance(held.value.__cause__, JournalNotFoundError)


async def test_wrong_append_offset_fails_its_batch_and_those_after_it(
    cluster: Cluster, client: JournalClient
) -> None:
    await cluster.create(journal_spec(J), cluster.brokers)
    service = AppendService(client)
    async with service:
        await _wrong_offset_among_others(service)
    assert service.failures == {J: 2}
    assert content(cluster, J) == b"first\n"
    assert service.stats.retries == 0
    # A new service: the right offset is accepted.
    async with AppendService(client) as again:
        right = await append_line(again, pb.AppendRequest(journal=J, offset=6), b"right\n")
        assert ((await right).commit.begin, (await right).commit.end) == (6, 12)


async def _wrong_offset_among_others(service: AppendService) -> None:
    first = await append_line(service, J, b"first\n")
    wrong = await append_line(service, pb.AppendRequest(journal=J, offset=1000), b"wrong\n")
    after = await append_line(service, J, b"after\n")
    # Different requests never share a batch.
    assert len({id(first), id(wrong), id(after)}) == 3
    with pytest.raises(WrongAppendOffsetError):
        await wrong
    assert (await first).commit.end == 6
    with pytest.raises(JournalFailedError):
        await after


async def test_no_primary_yet_is_retried_until_the_journal_is_assigned(
    cluster: Cluster, client: JournalClient
) -> None:
    await cluster.put_spec(journal_spec(J))  # A spec, but no broker assigned yet.
    sleep = GatedSleep()
    async with AppendService(client, sleep=sleep) as service:
        aa = await append_line(service, J, b"waits for a primary\n")
        await asyncio.wait_for(sleep.called.wait(), 10)
        assert not aa.done() and service.stats.retries == 1
        await cluster.assign(J, cluster.brokers)
        sleep.gate.set()
        response = await asyncio.wait_for(aa, 10)
    assert response.commit.end == len(b"waits for a primary\n")
    assert content(cluster, J) == b"waits for a primary\n"
    assert service.stats.committed == 1 and service.stats.failed == 0
    assert service.stats.rpcs == service.stats.retries + 1


async def test_a_broker_that_is_down_is_retried_until_it_is_up(cluster: Cluster) -> None:
    # A free loopback port, where the broker will come up once the append is being retried.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = JournalClient(f"http://127.0.0.1:{port}")
    await cluster.put_spec(journal_spec(J))
    sleep = GatedSleep(then_sleep=True)
    try:
        async with AppendService(client, backoff_max_s=0.2, sleep=sleep) as service:
            aa = await append_line(service, J, b"survives the outage\n")
            await asyncio.wait_for(sleep.called.wait(), 10)
            assert not aa.done()
            broker = await cluster.start_broker("zone-a", "broker-late", port=port)
            await cluster.assign(J, [broker])
            sleep.gate.set()
            response = await asyncio.wait_for(aa, 60)
    finally:
        await client.close()
    assert response.header.process_id == broker.id
    assert content(cluster, J) == b"survives the outage\n"
    assert service.stats.retries >= 1 and service.stats.committed == 1


async def test_exhausted_retries_fail_the_batch_and_the_journal(
    cluster: Cluster, client: JournalClient
) -> None:
    await cluster.put_spec(journal_spec(J))
    now = [0.0]

    async def sleep(delay: float) -> None:  # Back-offs pass at once, and move the clock.
        now[0] += delay

    service = AppendService(client, retry_s_max=0.2, sleep=sleep, clock=lambda: now[0])
    async with service:
        failed = await append_line(service, J, b"given up\n")
        with pytest.raises(AppendRetriesExhaustedError) as exhausted:
            await failed
        assert isinstance(exhausted.value.__cause__, NoJournalPrimaryBrokerError)
        # 0.05 + 0.1 fit in 0.2 s; the next back-off (0.2) would pass it.
        assert service.stats.rpcs == 3 and now[0] == backoff_s(1, 0.05, 5.0) + backoff_s(
            2, 0.05, 5.0
        )
        await cluster.assign(J, cluster.brokers)
        # The given-up batch may have committed (a lost response): nothing of this service
        # follows it.
        with pytest.raises(JournalFailedError):
            await (await append_line(service, J, b"not after a give-up\n"))
    assert service.failures == {J: 2}
    async with AppendService(client) as again:
        response = await (await append_line(again, J, b"later\n"))
    assert response.commit.end == 6 and content(cluster, J) == b"later\n"


async def test_dependencies_order_and_fail_batches(cluster: Cluster, client: JournalClient) -> None:
    await cluster.create(journal_spec(J), cluster.brokers)
    service = AppendService(client)
    async with service:
        await _dependencies_order_and_fail(cluster, service)
    assert service.failures == {"test/errors-other": 1}
    assert content(cluster, J) == b"after the gate\nsecond\n"
    assert content(cluster, "test/errors-other") == b""
    assert content(cluster, "test/errors-third") == b"first\n"


async def _dependencies_order_and_fail(cluster: Cluster, service: AppendService) -> None:
    loop = asyncio.get_running_loop()
    gate: asyncio.Future[None] = loop.create_future()
    waiting = await service.start_append(J, [gate])
    waiting.write(b"after the gate\n")
    waiting.release()
    broken: asyncio.Future[None] = loop.create_future()
    broken.set_exception(RuntimeError("checkpoint commit failed"))
    other = "test/errors-other"
    await cluster.create(journal_spec(other), cluster.brokers)
    refused = await service.start_append(other, [broken])
    refused.write(b"must not land\n")
    refused.release()
    with pytest.raises(DependencyFailedError) as failure:
        await refused
    assert isinstance(failure.value.__cause__, RuntimeError)
    assert not waiting.done()
    # The failed batch stays in the barrier of other journals (see pending_except).
    assert service.pending_except(other) == [waiting]
    assert service.pending_except(J) == [refused]
    gate.set_result(None)
    await waiting
    # A batch depending on another journal's batch is sent after it.
    third = "test/errors-third"
    await cluster.create(journal_spec(third), cluster.brokers)
    first = await append_line(service, third, b"first\n")
    dependent = await service.start_append(J, [first])
    dependent.write(b"second\n")
    dependent.release()
    await dependent
    assert first.done()


async def test_leaving_by_an_error_fails_what_is_still_queued(
    cluster: Cluster, client: JournalClient
) -> None:
    await cluster.create(journal_spec(J), cluster.brokers)
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    service = AppendService(client)
    with pytest.raises(RuntimeError, match="application failed"):
        async with service:
            stuck = await service.start_append(J, [never])
            stuck.write(b"never sent\n")
            stuck.release()
            raise RuntimeError("application failed")
    with pytest.raises(AppendCancelledError):
        await stuck
    with pytest.raises(AppendServiceClosedError):
        await service.start_append(J)
    assert content(cluster, J) == b""
    assert service.budget.memory_bytes == 0


async def test_start_append_outside_the_service_block_is_refused(client: JournalClient) -> None:
    service = AppendService(client)
    with pytest.raises(AppendServiceClosedError, match="new"):
        await service.start_append(J)
    async with service:
        pass
    with pytest.raises(AppendServiceClosedError, match="closed"):
        await service.start_append(J)
    with pytest.raises(AppendServiceClosedError):
        async with service:
            pass


async def test_bad_input_is_refused_and_queues_nothing(client: JournalClient) -> None:
    async with AppendService(client) as service:
        with pytest.raises(ValidationError, match="journal"):
            await service.start_append("not a journal name")
        with pytest.raises(ValidationError, match="offset"):
            await service.start_append(pb.AppendRequest(journal=J, offset=-1))
        with pytest.raises(TypeError, match=r"dependencies\[0\]"):
            await service.start_append(J, ["not a future"])
        assert service.pending_except() == [] and service.stats.batches == 0
    for bad in (
        {"batch_bytes_max": 0},
        {"retry_s_max": -1},
        {"backoff_initial_s": 2.0, "backoff_max_s": 1.0},
        {"append_timeout_s": 0},
        {"memory_bytes_max": 0, "spill_bytes_max": 0},
        {"memory_bytes_max": -1},
    ):
        with pytest.raises(ValueError):
            AppendService(client, **bad)  # type: ignore[arg-type]


def test_transient_errors_are_the_retriable_ones() -> None:
    assert is_transient(NoJournalPrimaryBrokerError())
    assert is_transient(TimeoutError())
    assert not is_transient(IndexHasGreaterOffsetError())
    assert not is_transient(JournalNotFoundError())
    assert not is_transient(WrongAppendOffsetError())
    assert not is_transient(ValueError())
    assert [backoff_s(n, 0.05, 1.0) for n in range(1, 7)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0]


async def test_a_writer_is_back_within_a_second_of_its_journal(
    cluster: Cluster, client: JournalClient
) -> None:
    # A journal of replication 2 with one broker refuses appends (INSUFFICIENT_JOURNAL_BROKERS)
    # until a second broker is back, as after a broker kill. The writer's next attempt once it
    # is back comes within a second (simulated time): with Gazette's 5 s cap it came up to 5 s
    # later, and so did every consumer's progress after a broker restart (found by the soak).
    first = cluster.brokers[0]
    await cluster.create(journal_spec(J, replication=2), [first])
    now = [0.0]
    back_at = 7.0  # Seconds of outage: the back-off has reached its cap.
    back = asyncio.Event()

    async def sleep(delay: float) -> None:
        now[0] += delay
        if now[0] >= back_at and not back.is_set():
            second = await cluster.start_broker("zone-b", "broker-b")
            await cluster.assign(J, [first, second])
            back.set()

    async with AppendService(client, sleep=sleep, clock=lambda: now[0]) as service:
        aa = await append_line(service, J, b"after the outage\n")
        response = await asyncio.wait_for(aa, 30)
    assert response.commit.end == len(b"after the outage\n") and back.is_set()
    assert now[0] - back_at <= 1.0
    assert service.stats.retries >= 5


class _Unanswering(pb_grpc.JournalServicer):  # type: ignore[misc]
    """A broker that reads an Append whole and then never answers (a hung process)."""

    def __init__(self) -> None:
        self.appends = 0
        self.read_whole = asyncio.Event()

    async def Append(self, requests, context):  # type: ignore[no-untyped-def]
        self.appends += 1
        async for _ in requests:
            pass
        self.read_whole.set()
        await asyncio.Event().wait()  # Never answers.


async def test_an_append_the_broker_never_answers_is_bounded_and_retried() -> None:
    # append_timeout_s bounds each attempt; the attempts end in AppendRetriesExhaustedError
    # (with the timeout as its cause), not a wait for ever.
    servicer = _Unanswering()
    async with serving(servicer) as endpoint:
        client = JournalClient(endpoint)
        service = AppendService(client, append_timeout_s=0.2, retry_s_max=1.0)
        try:
            async with asyncio.timeout(10), service:
                failed = await append_line(service, J, b"into a black hole\n")
                with pytest.raises(AppendRetriesExhaustedError) as exhausted:
                    await failed
        finally:
            await client.close()
    assert isinstance(exhausted.value.__cause__, TimeoutError)
    assert servicer.read_whole.is_set() and servicer.appends == service.stats.rpcs >= 2
