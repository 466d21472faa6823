"""A commit applier whose dependency fails unexpectedly keeps running (issue #16): the failure is
kept on the applier, counted in `gazette_quorum_apply_errors_total`, logged once with its
traceback (not once per try), and tried again with backoff, so that the committed content
reaches the spool once the dependency recovers, and a Read of this member returns it.

Three quorum nodes of one journal on loopback gRPC (quorum_nodes_testkit); the leader's applier
is built through its public constructor over a real Replica (memory spool), with a `replica_of`
that raises RuntimeError until the test lets it recover. The Read is the real ReadAPI over
that replica's fragment index. Before the fix the first RuntimeError ended the applier's task:
nothing was recorded, and the content never arrived (the bounded waits below failed).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import structlog

from broker import metrics
from broker.client.route_cache import ChannelPool
from broker.fragment.spool_dir import SpoolDir
from broker.fragment.spool_file import MemorySpoolFile
from broker.fragment.stores.registry import new_registry
from broker.protocol import protocol_pb2 as pb
from broker.quorum_shell.apply import CommitApplier
from broker.read_api import ReadAPI
from broker.replica import Replica, ReplicaEnv
from tests.broker.quorum.quorum_nodes_testkit import NAMES, Cluster, J, wait_s
from tests.broker.read_testkit import FakeResolver, Servicer, route_header, serving
from tests.broker.read_testkit import Replica as ReadReplica

# Failed tries seen before the dependency recovers: more than one, to see the backoff retry.
FAILURES_MIN = 3


class FlakyReplicas:
    """`replica_of` of a broker whose replica lookup raises until `recover()`."""

    def __init__(self, replica: Replica) -> None:
        self.replica = replica
        self.failures = 0
        self.failed = asyncio.Event()  # set on each raise
        self.answered = asyncio.Event()  # set on each lookup that does not raise
        self.healthy = False

    def __call__(self, journal: str) -> Replica | None:
        assert journal == J
        if not self.healthy:
            self.failures += 1
            self.failed.set()
            raise RuntimeError("replica lookup broke")
        self.answered.set()
        return self.replica


def _memory_replica() -> Replica:
    return Replica(
        J,
        ReplicaEnv(
            lookup_spec=lambda _: None,
            new_spool_file=MemorySpoolFile,
            stores=None,
            persister=None,
            pulse=None,
            clock=time.time,
        ),
    )


async def _until_failures(flaky: FlakyReplicas, count: int) -> None:
    async with asyncio.timeout(wait_s):
        while flaky.failures < count:
            flaky.failed.clear()
            await flaky.failed.wait()


def _logged(logs: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    """The error lines of the applier's `event` (other components may log meanwhile)."""
    return [e for e in logs if e["log_level"] == "error" and e["event"].startswith(event)]


def _errors(member: str) -> float:
    return metrics.value_of("gazette_quorum_apply_errors_total", {"journal": J, "member": member})


async def _read(replica: Replica, end: int) -> bytes:
    """Content [0, end) by a non-blocking Read RPC served from `replica`'s fragment index."""
    resolver = FakeResolver(ReadReplica(replica.index))
    channels = ChannelPool()
    try:
        async with serving(Servicer(ReadAPI(resolver, new_registry(), channels))) as endpoint:
            resolver.header = route_header(endpoint)
            stub: Any = channels.stub(endpoint)
            out = bytearray()
            async for resp in stub.Read(pb.ReadRequest(journal=J, offset=0, block=False)):
                if resp.status != pb.OK:
                    break
                out += resp.content
            return bytes(out[:end])
    finally:
        await channels.close()


async def test_an_applier_that_fails_unexpectedly_retries_until_committed_content_arrives(
    quorum_nodes: Cluster,
) -> None:
    for name in NAMES:
        await quorum_nodes.start(name)
    begin, end = await quorum_nodes.append(b"committed;")
    assert begin == 0
    leader = quorum_nodes.leader()
    assert leader is not None and leader.commit_offset >= end

    replica = _memory_replica()
    flaky = FlakyReplicas(replica)
    before = _errors(leader.name)
    applier = CommitApplier(leader, flaky, lambda _: None, time.time)
    with structlog.testing.capture_logs() as logs:
        task = asyncio.create_task(applier.run())
        try:
            leader.commit_changed.set()
            # It fails, is recorded and counted, and keeps trying (backoff, not one try).
            await _until_failures(flaky, FAILURES_MIN)
            assert not task.done()
            assert isinstance(applier.error, RuntimeError)
            assert _errors(leader.name) - before >= FAILURES_MIN
            failed = _logged(logs, "quorum: committed content not applied")
            assert len(failed) == 1, failed  # once per distinct error, not once per try
            assert "replica lookup broke" in failed[0]["error"]
            assert failed[0]["exc_info"] is not None  # with its traceback
            assert applier.applied == 0

            # The dependency recovers: the committed content reaches the spool.
            flaky.healthy = True
            async with asyncio.timeout(wait_s):
                while applier.applied < end:
                    applier.changed.clear()
                    await applier.changed.wait()
            assert applier.error is None
            assert await _read(replica, end) == b"committed;"
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_store_progress_reporting_survives_a_failing_dependency(
    quorum_nodes: Cluster,
) -> None:
    """`report_stored` (what lets the leader's log compact) fails the same way: it keeps
    polling, the failure is kept and counted, and cleared once a report succeeds."""
    for name in NAMES:
        await quorum_nodes.start(name)
    await quorum_nodes.append(b"committed;")
    leader = quorum_nodes.leader()
    assert leader is not None
    flaky = FlakyReplicas(_memory_replica())
    before = _errors(leader.name)
    applier = CommitApplier(leader, flaky, lambda _: None, time.time)
    with structlog.testing.capture_logs() as logs:
        task = asyncio.create_task(applier.report_stored())
        try:
            await _until_failures(flaky, 2)
            assert not task.done()
            assert isinstance(applier.stored_error, RuntimeError)
            assert applier.error is None  # applying is a separate matter
            assert _errors(leader.name) - before == 2
            assert len(_logged(logs, "quorum: store progress not reported")) == 1

            flaky.healthy = True
            async with asyncio.timeout(wait_s):
                await flaky.answered.wait()
            # The report ran to its next poll without an await after the lookup: settled.
            assert applier.stored_error is None and not task.done()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_content_a_failed_try_left_uncommitted_is_not_committed_with_the_next(
    quorum_nodes: Cluster,
) -> None:
    """A try that failed between appending a batch to the spool and committing it leaves that
    content pending; the next try rolls it back and applies the batch again, so every offset
    holds the journal's byte (never the batch twice, shifted)."""
    for name in NAMES:
        await quorum_nodes.start(name)
    _, end = await quorum_nodes.append(b"committed;")
    leader = quorum_nodes.leader()
    assert leader is not None
    replica = _memory_replica()
    spool = await replica.spool_slot.take(asyncio.Event())
    spool.apply_content(b"committed;", 0)  # what a failed try appended, never committed
    replica.spool_slot.put(spool)

    applier = CommitApplier(leader, lambda _: replica, lambda _: None, time.time)
    task = asyncio.create_task(applier.run())
    try:
        leader.commit_changed.set()
        async with asyncio.timeout(wait_s):
            while applier.applied < end:
                applier.changed.clear()
                await applier.changed.wait()
        assert applier.error is None
        spool = await replica.spool_slot.take(asyncio.Event())
        try:
            assert (spool.fragment.end, spool.delta) == (end, 0)
        finally:
            replica.spool_slot.put(spool)
        assert await _read(replica, 2 * end) == b"committed;"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class LateReplica:
    """`replica_of` of a broker whose journal is assigned only later: None until `assign()`
    (a node the term register names starts as its broker starts, before the allocator's
    assignment gives it a replica)."""

    def __init__(self, replica: Replica) -> None:
        self.replica = replica
        self.assigned = False
        self.asked = asyncio.Event()  # set on each lookup

    def __call__(self, journal: str) -> Replica | None:
        assert journal == J
        self.asked.set()
        return self.replica if self.assigned else None

    def assign(self, applier: CommitApplier) -> None:
        """The replica exists now, and the applier is told so, as a broker's resolver tells
        it (`replica_started`, wired in server.py)."""
        self.assigned = True
        applier.replica_changed()


async def test_content_committed_before_the_replica_exists_is_applied_once_it_does(
    quorum_nodes: Cluster,
) -> None:
    """No commit after the assignment: the applier still applies what was committed before it
    (before the fix it waited for the next commit, and Reads here failed meanwhile)."""
    for name in NAMES:
        await quorum_nodes.start(name)
    _, end = await quorum_nodes.append(b"before the assignment;")
    leader = quorum_nodes.leader()
    assert leader is not None and leader.commit_offset >= end

    replica = _memory_replica()
    late = LateReplica(replica)
    applier = CommitApplier(leader, late, lambda _: None, time.time)
    task = asyncio.create_task(applier.run())
    try:
        leader.commit_changed.set()
        async with asyncio.timeout(wait_s):  # it looked for the replica, and found none
            await late.asked.wait()
        assert applier.applied == 0
        late.assign(applier)  # and no commit follows
        async with asyncio.timeout(wait_s):
            while applier.applied < end:
                applier.changed.clear()
                await applier.changed.wait()
        assert applier.error is None
        assert await _read(replica, end) == b"before the assignment;"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class SwappedReplicas:
    """`replica_of` of a broker whose replica of the journal is replaced: `current` (None: no
    replica), with `asked` set on each lookup."""

    def __init__(self, current: Replica | None) -> None:
        self.current = current
        self.asked = asyncio.Event()

    def __call__(self, journal: str) -> Replica | None:
        assert journal == J
        self.asked.set()
        return self.current


async def test_a_replica_stopped_before_its_spool_is_handed_over_does_not_hold_the_applier(
    quorum_nodes: Cluster, tmp_path: Path
) -> None:
    """A durable replica's spool is handed over only once the previous replica of the journal
    in this process lets its files go; stopped before that, it never is. The applier waiting
    for that spool is released by the stop and applies to the next replica. Before, it waited
    on the stopped replica's empty slot for good: nothing more was applied on this broker, and
    its non-blocking Reads failed at the read barrier."""
    for name in NAMES:
        await quorum_nodes.start(name)
    _, end = await quorum_nodes.append(b"committed;")
    leader = quorum_nodes.leader()
    assert leader is not None and leader.commit_offset >= end

    spool_dir = SpoolDir(tmp_path / "data", fsync=False)
    never = asyncio.Event()
    assert await spool_dir.claim(J, never)  # a previous replica of J still holds its files
    durable = Replica(
        J,
        ReplicaEnv(
            lookup_spec=lambda _: None,
            new_spool_file=MemorySpoolFile,
            stores=None,
            persister=None,
            pulse=None,
            clock=time.time,
            spool_dir=spool_dir,
        ),
    )
    serving_task = asyncio.create_task(durable.serve())
    replicas = SwappedReplicas(durable)
    applier = CommitApplier(leader, replicas, lambda _: None, time.time)
    task = asyncio.create_task(applier.run())
    try:
        leader.commit_changed.set()
        async with asyncio.timeout(wait_s):  # it found the replica, and waits for its spool
            await replicas.asked.wait()
        assert not durable.spool_slot.available()
        durable.stop()  # before its spool was handed over
        async with asyncio.timeout(wait_s):
            await serving_task
        fresh = _memory_replica()
        replicas.current = fresh
        applier.replica_changed()  # as the resolver's replica_started does
        async with asyncio.timeout(wait_s):
            while applier.applied_to(fresh) < end:
                applier.changed.clear()
                await applier.changed.wait()
        assert applier.error is None
        assert await _read(fresh, end) == b"committed;"
    finally:
        task.cancel()
        serving_task.cancel()
        await asyncio.gather(task, serving_task, return_exceptions=True)
        spool_dir.release(J)
