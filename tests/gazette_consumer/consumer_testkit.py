"""Consumer members in one process over one keyspace, with fake shards.

``FakeShards`` is a ``StartShard`` whose handles do no work: a standby is STANDBY at once (as a
shard without a recovery log is), a primary PRIMARY at once (or BACKFILL until ``ready()`` when
started with ``hold=True``); tests drive progress and failures by hand. It is a real
implementation of the ShardHandle protocol, not a mock: the member code under test cannot tell
it from a shard runner.

``Group`` runs several ``ConsumerMember``s against one backend factory (embedded by default,
or a real etcd) and watches the keyspace with its own mirror, so that tests can wait for the
cluster to reach a state, event-driven: each check runs after every keyspace update.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from google.protobuf.duration_pb2 import Duration

from broker.keyspace.backend import Backend
from broker.keyspace.embedded import EmbeddedStore
from broker.keyspace.keyspace import KeySpace
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import GazetteError, ShardStatusError
from broker.testing.served_process import ServedProcess
from examples.counter import Counter
from gazette_consumer.member import ConsumerConfig, ConsumerMember
from gazette_consumer.shard_client import ShardClient
from gazette_consumer.shard_handle import ShardProgress, ShardRole, ShardStart, StartShard
from gazette_consumer.topology import (
    Decoded,
    ShardAssignment,
    assign_prefix,
    new_keyspace,
    shard_key,
)

ROOT = "/gazette/consumers/test-app"
# Upper bound of any wait for the cluster to converge; never a synchronisation device.
wait_s = 30.0

Connect = Callable[[], Awaitable[Backend]]


def shard_spec(
    shard: str, *, hot_standbys: int = 0, sources: tuple[str, ...] = (), **labels: str
) -> cpb.ShardSpec:
    spec = cpb.ShardSpec(
        id=shard,
        max_txn_duration=Duration(seconds=1),
        hot_standbys=hot_standbys,
        sources=[cpb.ShardSpec.Source(journal=j) for j in sorted(sources)],
    )
    for name, value in sorted(labels.items()):
        spec.labels.labels.add(name=name.replace("_", "-"), value=value)
    return spec


class FakeShard:
    """A ShardHandle that does nothing but report what the test tells it to."""

    def __init__(self, start: ShardStart, *, hold: bool = False) -> None:
        self.spec = start.spec
        self.role = start.role
        self.fqn = start.fqn
        self._on_change = start.on_change
        self.held = hold
        self.promoted = False
        self.stopped = asyncio.Event()
        self._status = cpb.ReplicaStatus(code=cpb.ReplicaStatus.IDLE)
        self._progress = ShardProgress()
        # Set (and replaced) each time the member reads progress(): lets a test know that a
        # Stat has looked, and is now waiting, without sleeping.
        self.progress_read = asyncio.Event()
        self._settle()

    def _settle(self) -> None:
        if self._status.code == cpb.ReplicaStatus.FAILED:
            return
        if self.held:
            code = cpb.ReplicaStatus.BACKFILL
        elif self.role is ShardRole.PRIMARY:
            code = cpb.ReplicaStatus.PRIMARY
        else:
            code = cpb.ReplicaStatus.STANDBY
        self._status = cpb.ReplicaStatus(code=code)

    # -- The ShardHandle protocol --

    def status(self) -> cpb.ReplicaStatus:
        return self._status

    def progress(self) -> ShardProgress:
        read, self.progress_read = self.progress_read, asyncio.Event()
        read.set()
        return ShardProgress(dict(self._progress.read_through), dict(self._progress.publish_at))

    def promote(self) -> None:
        assert self.role is ShardRole.STANDBY, "promoted twice"
        self.role = ShardRole.PRIMARY
        self.promoted = True
        self._settle()
        self._on_change()

    def update_spec(self, spec: cpb.ShardSpec) -> None:
        self.spec = spec

    async def stop(self) -> None:
        self.stopped.set()

    # -- Driven by tests --

    def ready(self) -> None:
        """Finish a held start (BACKFILL → STANDBY or PRIMARY)."""
        self.held = False
        self._settle()
        self._on_change()

    def fail(self, error: str) -> None:
        self._status = cpb.ReplicaStatus(code=cpb.ReplicaStatus.FAILED, errors=[error])
        self._on_change()

    def advance(self, read_through: Mapping[str, int], publish_at: Mapping[str, int] = {}) -> None:
        self._progress = ShardProgress(dict(read_through), dict(publish_at))
        self._on_change()


@dataclass
class FakeShards:
    """A StartShard of FakeShards, remembering every one it started (in order)."""

    hold: bool = False
    started: list[FakeShard] = field(default_factory=list)

    def __call__(self, start: ShardStart) -> FakeShard:
        shard = FakeShard(start, hold=self.hold)
        self.started.append(shard)
        return shard

    def running(self, shard: str) -> FakeShard:
        """The latest replica of ``shard`` this member started that has not stopped."""
        for fake in reversed(self.started):
            if fake.spec.id == shard and not fake.stopped.is_set():
                return fake
        raise AssertionError(f"no running replica of {shard}")


@dataclass
class Node:
    member: ConsumerMember
    shards: FakeShards


@dataclass
class Group:
    connect: Connect
    admin: Backend
    ks: KeySpace[Decoded]
    watch: asyncio.Task[None]
    nodes: list[Node] = field(default_factory=list)

    @classmethod
    async def open(cls, connect: Connect | None = None) -> Group:
        if connect is None:
            store = EmbeddedStore()

            async def embedded() -> Backend:
                return store.connect()

            connect = embedded
        admin = await connect()
        ks = new_keyspace(ROOT)
        await ks.load(admin)
        return cls(connect, admin, ks, asyncio.create_task(ks.watch(admin)))

    async def join(
        self,
        zone: str,
        suffix: str,
        *,
        hold: bool = False,
        start_shard: StartShard | None = None,
        **config: Any,
    ) -> Node:
        """Start a member. Its replicas are FakeShards (held in BACKFILL with ``hold``),
        unless ``start_shard`` is given."""
        shards = FakeShards(hold=hold)
        base = ConsumerConfig(
            zone=zone, suffix=suffix, root=ROOT, stop_grace_s=0.0, allocator_idle_wake_s=1.0
        )
        member = ConsumerMember(
            await self.connect(), replace(base, **config), start_shard or shards
        )
        await member.start()
        node = Node(member, shards)
        self.nodes.append(node)
        return node

    async def put_shard(self, spec: cpb.ShardSpec) -> int:
        header = await self.admin.put(shard_key(ROOT, spec.id).encode(), spec.SerializeToString())
        return header.revision

    def assignments(self) -> dict[str, list[ShardAssignment]]:
        out: dict[str, list[ShardAssignment]] = {}
        for entry in self.ks.search(assign_prefix(ROOT)):
            a = entry.decoded
            assert isinstance(a, ShardAssignment)
            out.setdefault(a.shard, []).append(a)
        return out

    async def until(self, check: Callable[[], str | None], timeout_s: float = wait_s) -> None:
        """Wait until ``check()`` finds nothing wrong (returns None), re-checking after every
        keyspace update; fail with what was still wrong after ``timeout_s``."""
        problem = check()
        try:
            async with asyncio.timeout(timeout_s):
                while problem is not None:
                    self._raise_failures()
                    await self.ks.wait_for_revision(self.ks.header.revision + 1, timeout_s)
                    problem = check()
        except TimeoutError:
            raise AssertionError(f"after {timeout_s}s: {problem}") from None

    def _raise_failures(self) -> None:
        for node in self.nodes:
            if node.member.failure is not None:
                raise node.member.failure

    async def close(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                await node.member.stop(graceful=False)
            await node.member.backend.close()
        self.watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.watch
        await self.admin.close()


def codes(assignments: list[ShardAssignment]) -> dict[str, str]:
    """``{"zone#suffix/slot": CODE}`` of one shard's assignments, for readable failures."""
    return {
        f"{a.zone}#{a.suffix}/{a.slot}": cpb.ReplicaStatus.Code.Name(a.status.code)
        for a in assignments
    }


def primary_and_standbys(
    group: Group, shards: list[str], standbys: int
) -> Callable[[], str | None]:
    """Check: every shard has one PRIMARY at slot 0 and ``standbys`` STANDBYs, on distinct
    members."""

    def check() -> str | None:
        by_shard = group.assignments()
        for shard in shards:
            got = by_shard.get(shard, [])
            want = {
                0: cpb.ReplicaStatus.PRIMARY,
                **{slot: cpb.ReplicaStatus.STANDBY for slot in range(1, standbys + 1)},
            }
            have = {a.slot: a.status.code for a in got}
            members = {(a.zone, a.suffix) for a in got}
            if have != want or len(members) != len(got):
                return f"{shard}: {codes(got)}"
        return None

    return check


def process_id(node: Node) -> pb.ProcessSpec.ID:
    return node.member.id


class CounterApp(Counter):
    """The application tests run with ``gazette-consumer serve --app``: the counting example,
    keeping its SQLite files in a temporary directory of the process (removed at exit)."""

    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="counter-app-")
        super().__init__(data_dir=self._tmp.name)


# --- Consumer processes ---------------------------------------------------------------------------

# A consumer process that has not printed its endpoint this long after starting failed to start.
process_ready_s = 60.0


class ConsumerProcess(ServedProcess):
    """``gazette-consumer serve <args>`` as a subprocess (restartable: a start is a new process
    with the same arguments). Ready once it printed ``serving on`` (and, without ``--etcd``,
    the embedded broker's address); what it printed is in ``printed``. Its log goes to
    ``log_path``, appended across restarts (broker/testing/served_process.py)."""

    def __init__(
        self, args: list[str], log_path: Path, env: Mapping[str, str] | None = None
    ) -> None:
        super().__init__("consumer process", log_path)
        self.args = args
        self.env = dict(env or {})
        self.endpoint = ""

    async def start(self) -> None:
        expect = {"serving"} | ({"embedded broker"} if "--etcd" not in self.args else set())
        printed = await self.spawn(
            ["-m", "gazette_consumer.runner", "serve", *self.args],
            expect=expect,
            ready_timeout_s=process_ready_s,
            env=self.env,
        )
        self.endpoint = printed["serving"]


async def stat_through(
    consumer: ConsumerProcess, shard: str, read_through: Mapping[str, int] | None = None
) -> cpb.StatResponse:
    """Stat of ``shard`` through ``consumer``'s Shard service, once the shard has read through
    ``read_through`` (the service waits for that: an event). Retried, bounded, while the shard
    has no primary yet or the process is not reachable (no event to wait on across processes
    for those)."""
    deadline = time.monotonic() + process_ready_s
    while True:
        try:
            async with ShardClient(consumer.endpoint) as client:
                return await client.stat(shard, read_through)
        except (GazetteError, ShardStatusError, grpc.aio.AioRpcError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)
