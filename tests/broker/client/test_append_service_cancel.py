"""AppendService: a writer that cancels the shared future of a batch (``asyncio.gather`` over
AsyncAppends being cancelled, or a store cancelling a task that wraps one) must not crash the
journal's worker: the append still lands, later batches still go out, and leaving the service
raises only for batches that failed (AppendsFailedError). A cancelled *dependency* cancels the
dependent batch with DependencyCancelledError rather than ending the worker."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from broker.client.append_errors import (
    AppendsFailedError,
    DependencyCancelledError,
    DependencyFailedError,
    JournalFailedError,
)
from broker.client.append_service import AppendService
from broker.client.route_cache import JournalClient
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import JournalNotFoundError
from tests.broker.broker_testkit import (
    Cluster,
    journal_spec,
    local_content,
    one_broker_with,
)

J = "test/cancel"
WAIT_S = 30.0


@pytest.fixture
async def env() -> AsyncIterator[tuple[Cluster, JournalClient]]:
    async with one_broker_with((J,)) as pair:
        yield pair


def content(cluster: Cluster) -> bytes:
    return local_content(cluster.brokers[0], J)[1]


async def test_cancelled_gather_over_appends_leaves_the_worker_running(
    env: tuple[Cluster, JournalClient],
) -> None:
    cluster, client = env
    async with AppendService(client) as service:
        # The gather is cancelled before the batch is even released, so that the cancel
        # surely happens before its response arrives.
        first = await service.start_append(J)
        first.write(b"one\n")
        gathered = asyncio.gather(first.future)
        gathered.cancel()
        first.release()
        with pytest.raises(asyncio.CancelledError):
            await gathered
        assert first.future.cancelled()  # gather cancelled the AppendService's own future.

        second = await service.start_append(J)
        second.write(b"two\n")
        second.release()
        async with asyncio.timeout(WAIT_S):
            response = await second
        assert response.commit.end == len(b"one\ntwo\n")
        assert service.stats.committed == 2  # The cancelled batch committed all the same.
    assert content(cluster) == b"one\ntwo\n"


async def test_cancelled_future_of_a_failing_append_leaves_the_worker_running(
    env: tuple[Cluster, JournalClient],
) -> None:
    _cluster, client = env
    service = AppendService(client)
    with pytest.raises(AppendsFailedError) as failure:
        async with service:
            await _fail_twice_then_append(service)
    # The failure whose future a writer cancelled reaches the owner here; the one awaited and
    # handled is not reported twice.
    assert failure.value.failed == {"test/no-such-journal": 1}
    assert service.failures == {"test/no-such-journal": 2}


async def _fail_twice_then_append(service: AppendService) -> None:
    missing = await service.start_append("test/no-such-journal")
    missing.write(b"x\n")

    # What cancelling a task that awaits it does to the shared future.
    missing.future.cancel()
    missing.release()
    # A later batch of the same journal resolves only after the worker handled this one.
    # (Its own batch, not the cancelled one: a batch joins appends of equal dependencies.)
    resolved: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    resolved.set_result(None)
    later = await service.start_append("test/no-such-journal", dependencies=[resolved])
    later.write(b"y\n")
    later.release()
    with pytest.raises(JournalFailedError) as held:  # Sticky: the first failure, named.
        async with asyncio.timeout(WAIT_S):
            await later
    assert isinstance(held.value.__cause__, JournalNotFoundError)
    assert service.stats.failed == 2
    ok = await service.start_append(J)
    ok.write(b"after\n")
    ok.release()
    async with asyncio.timeout(WAIT_S):
        assert (await ok).commit.end == len(b"after\n")


async def test_a_cancelled_dependency_cancels_the_dependent_batch_only(
    env: tuple[Cluster, JournalClient],
) -> None:
    cluster, client = env
    async with AppendService(client) as service:
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        dependent = await service.start_append(J, dependencies=[gate])
        dependent.write(b"never\n")
        dependent.release()
        gate.cancel()  # A store's commit abandoned on destroy, say.
        with pytest.raises(DependencyCancelledError, match="a dependency of it was cancelled"):
            async with asyncio.timeout(WAIT_S):
                await dependent
        # Cancelled, so not sent, and a DependencyFailedError too; not a failure of the
        # service: leaving it raises nothing.
        assert isinstance(dependent.exception(), DependencyFailedError)
        assert service.stats.cancelled == 1 and service.failures == {}
        later = await service.start_append(J)
        later.write(b"later\n")
        later.release()
        async with asyncio.timeout(WAIT_S):
            assert (await later).commit.end == len(b"later\n")
    assert content(cluster) == b"later\n"


async def test_a_writer_that_stops_waiting_leaves_the_batch_to_the_commit_that_needs_it(
    env: tuple[Cluster, JournalClient],
) -> None:
    # Found by review: an application that waited for its derived message's append under a
    # timeout cancelled the batch's own future; the batch then counted as done, a checkpoint's
    # commit (txn_driver: pending_except) went ahead without it, and the message was lost
    # once the shard stopped before the append was sent.
    cluster, client = env
    slow = "test/slow"  # R=2 on one broker: appends are retried until a second one joins.
    first_broker = cluster.brokers[0]
    await cluster.create(journal_spec(slow, replication=2), [first_broker])
    async with AppendService(client) as service:
        batch = await service.start_append(slow)
        batch.write(b"derived\n")
        batch.release()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await batch  # The writer gives up waiting.
        assert not batch.future.cancelled() and not batch.done()
        assert batch in service.pending_except()
        # A future cancelled explicitly still leaves the batch pending for a commit (which then
        # fails on it, loudly, rather than pass it by).
        other = await service.start_append(slow)
        other.write(b"other\n")
        other.release()
        other.future.cancel()
        assert other in service.pending_except()

        second_broker = await cluster.start_broker("zone-b", "broker-b")
        await cluster.assign(slow, [first_broker, second_broker])
        async with asyncio.timeout(WAIT_S):
            response = await batch
        assert response.status == pb.OK and response.commit.begin == 0
        assert batch not in service.pending_except()
