"""The shards running in this process: started, promoted and stopped as assignments change,
with their statuses written back into the assignments.

``LocalShards`` observes the member's KeySpace. After every update (synchronously, in the same
step as the mirror changes, so a resolver never sees an assignment without its replica) it
reads this member's assignments, asks the ``Lifecycle`` what to do, and does it: ``start_shard``
for new assignments, ``promote`` / ``update_spec`` on running handles, and ``stop`` (awaited in
its TaskGroup) for assignments that went away.

Its ``run`` loop advertises each replica's status: whenever a handle reports a change (its
``on_change``) or the keyspace moves, it compares each local assignment's stored ReplicaStatus
with what its handle reports and writes the difference, in a transaction guarded by the
assignment's mod revision and under the assignment's own lease (Gazette's updateStatus). The
allocator's consistency rule reads these values, so a hand-off waits until a standby says
STANDBY. A write that loses its compare is not retried as it stood: the assignment changed, and
the keyspace update that follows brings a fresh decision.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable

from broker.keyspace.backend import (
    Backend,
    Compare,
    CompareResult,
    CompareTarget,
    KeySpaceError,
    NoSpaceError,
    OpPut,
    UnavailableError,
    prefix_end,
)
from broker.keyspace.keyspace import KeySpace
from broker.logging import get_logger
from broker.protocol import consumer_pb2 as cpb
from broker.topology import SEP
from gazette_consumer.lifecycle import Assigned, Lifecycle, Promote, Start, Stop, UpdateSpec
from gazette_consumer.lifecycle import status_update as next_status
from gazette_consumer.shard_handle import ShardHandle, ShardProgress, ShardStart, StartShard
from gazette_consumer.topology import (
    FAILED,
    Decoded,
    ShardItem,
    assignment_of,
    local_assignments,
    lookup_shard,
    shard_assignments_prefix,
    shard_key,
    status_text,
)

log = get_logger(__name__)

# Consecutive status writes that fail because etcd is unreachable before the loop gives up
# (and the member with it): past this, our view of the cluster cannot be trusted.
status_write_attempts_max = 30
# Back-off between such attempts (doubling from the first to the last).
status_write_backoff_initial_s = 0.05
status_write_backoff_max_s = 2.0
# How long a replica may take to stop before the process gives up waiting for it (and logs).
stop_wait_s_default = 60.0
# How long a status write waits for the mirror to show it before deciding afresh.
status_revision_wait_s = 10.0


class LocalShardsStoppedError(RuntimeError):
    """The process no longer serves local shards (it is exiting, or lost its lease)."""


class _Local:
    """A running replica: its handle, and an event replaced on each change (for waiters)."""

    def __init__(self, handle: ShardHandle, token: object) -> None:
        self.handle = handle
        # Identifies this replica to its on_change callback, which may outlive it.
        self.token = token
        self.changed = asyncio.Event()

    def notify(self) -> None:
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()


class _FailedHandle:
    """Stands in for a replica whose handle raised (a bug in the shard runner or the
    Application): it reports FAILED with the error, so that the failure is visible in List and
    Stat and the operator can Unassign it, while every other shard keeps running."""

    def __init__(self, error: BaseException, inner: ShardHandle | None) -> None:
        self._status = cpb.ReplicaStatus(code=FAILED, errors=[f"{type(error).__name__}: {error}"])
        self._inner = inner

    def status(self) -> cpb.ReplicaStatus:
        return self._status

    def progress(self) -> ShardProgress:
        return self._inner.progress() if self._inner is not None else ShardProgress()

    def promote(self) -> None:
        pass  # A failed replica stays failed until its assignment is removed.

    def update_spec(self, spec: cpb.ShardSpec) -> None:
        pass

    async def stop(self) -> None:
        if self._inner is not None:
            await self._inner.stop()


class LocalShards:
    """See the module docstring. Create, then ``await run()`` in the member's TaskGroup; call
    ``stop_serving()`` to stop every replica (``run`` returns once they have stopped)."""

    def __init__(
        self,
        ks: KeySpace[Decoded],
        backend: Backend,
        root: str,
        zone: str,
        suffix: str,
        start_shard: StartShard,
        *,
        stop_wait_s: float = stop_wait_s_default,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._ks = ks
        self._backend = backend
        self._root = root
        self._member = (zone, suffix)
        self._start_shard = start_shard
        self._stop_wait_s = stop_wait_s
        self._sleep = sleep
        self._lifecycle = Lifecycle()
        # None once run() finished stopping them.
        self._local: dict[str, _Local] | None = {}
        self._dirty = asyncio.Event()
        self._stopping = asyncio.Event()
        self._tg: asyncio.TaskGroup | None = None

    # -- Queries (resolver, Stat) --------------------------------------------------------------

    def handle(self, shard: str) -> ShardHandle | None:
        """The running replica of ``shard``, if there is one. Raises LocalShardsStoppedError
        once the process stopped serving."""
        if self._local is None or self._stopping.is_set():
            raise LocalShardsStoppedError("this consumer no longer serves local shards")
        local = self._local.get(shard)
        return local.handle if local is not None else None

    def changed(self, shard: str) -> asyncio.Event | None:
        """An event set at the replica's next change (status, progress, or its stop)."""
        local = (self._local or {}).get(shard)
        return local.changed if local is not None else None

    @property
    def shards(self) -> list[str]:
        return sorted(self._local or {})

    # -- Lifecycle -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve local replicas and advertise their statuses until ``stop_serving()``."""
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            self._ks.observers.append(self._on_keyspace)
            try:
                self._on_keyspace()
                await self._advertise_until_stopped()
            finally:
                self._ks.observers.remove(self._on_keyspace)
                await self._stop_all()
        self._tg = None

    async def _stop_all(self) -> None:
        """Stop every replica and wait for them. Awaited here rather than left to the TaskGroup,
        so that replicas finish stopping even when ``run`` is being cancelled (the member
        failed), which would cancel the group's tasks."""
        local, self._local = self._local or {}, None
        self._lifecycle.stop_all()
        for entry in local.values():
            entry.notify()
        await asyncio.gather(*(self._stop(shard, e.handle) for shard, e in sorted(local.items())))

    def stop_serving(self) -> None:
        """Stop every local replica; later lookups raise LocalShardsStoppedError."""
        self._stopping.set()
        self._dirty.set()

    # -- Keyspace observer ---------------------------------------------------------------------

    def _assigned(self) -> dict[str, Assigned]:
        out: dict[str, Assigned] = {}
        zone, suffix = self._member
        for shard, entry in local_assignments(self._ks, self._root, zone, suffix).items():
            item = lookup_shard(self._ks, self._root, shard)
            assert item is not None and isinstance(item.decoded, ShardItem)
            out[shard] = Assigned(
                shard=shard,
                slot=assignment_of(entry).slot,
                create_revision=entry.kv.create_revision,
                spec=item.decoded.spec,
                spec_revision=item.kv.mod_revision,
                fqn=shard_key(self._root, shard),
            )
        return out

    def _on_keyspace(self) -> None:
        if self._local is None or self._stopping.is_set():
            return
        self._apply(self._lifecycle.step(self._assigned()))
        self._dirty.set()

    def _apply(self, actions: list[Start | Promote | UpdateSpec | Stop]) -> None:
        local = self._local
        assert local is not None and self._tg is not None
        for action in actions:
            if isinstance(action, Stop):
                gone = local.pop(action.shard)
                gone.notify()
                log.info("stopping local shard", shard=action.shard)
                self._tg.create_task(self._stop(action.shard, gone.handle))
            elif isinstance(action, Start):
                local[action.assigned.shard] = self._start(action)
            else:
                self._call(local[action.shard], action)

    def _start(self, action: Start) -> _Local:
        a = action.assigned
        log.info("starting local shard", shard=a.shard, role=action.role.value)
        token = object()
        try:
            handle = self._start_shard(
                ShardStart(
                    a.spec,
                    action.role,
                    a.fqn,
                    self._on_change_of(a.shard, token),
                    functools.partial(self._still_assigned, a.shard),
                )
            )
        except Exception as exc:
            log.exception("starting local shard failed", shard=a.shard)
            return _Local(_FailedHandle(exc, None), token)
        return _Local(handle, token)

    def _call(self, entry: _Local, action: Promote | UpdateSpec) -> None:
        try:
            if isinstance(action, Promote):
                log.info("promoting local shard to primary", shard=action.shard)
                entry.handle.promote()
            else:
                entry.handle.update_spec(action.spec)
        except Exception as exc:
            log.exception("local shard failed a transition", shard=action.shard)
            entry.handle = _FailedHandle(exc, entry.handle)
            entry.notify()

    async def _still_assigned(self, shard: str) -> bool:
        """Whether etcd itself (a linearizable read, not the mirror) still assigns `shard` to
        this member under the lease of the assignment the mirror shows: in any slot (a
        promotion or a packing moves the assignment to another key, keeping its lease), and not
        under another lease (this member's successor under the same name, after this process's
        lease expired). Raises what reading etcd raises."""
        zone, suffix = self._member
        entry = local_assignments(self._ks, self._root, zone, suffix).get(shard)
        if entry is None or self._stopping.is_set():
            return False
        prefix = (shard_assignments_prefix(self._root, shard) + zone + SEP + suffix + SEP).encode()
        found = await self._backend.range(prefix, prefix_end(prefix))
        return any(kv.lease == entry.kv.lease for kv in found.kvs)

    async def _stop(self, shard: str, handle: ShardHandle) -> None:
        """Stop a replica that left this process. Its metric series go with the last use of
        them in the process (metrics.py), not with this stop: a replica of the shard started
        again meanwhile, or another member's in this process, may still record into them."""
        try:
            async with asyncio.timeout(self._stop_wait_s):
                await handle.stop()
        except TimeoutError:
            log.error("local shard did not stop in time", shard=shard, wait_s=self._stop_wait_s)
        except Exception:
            # Its stop broke, not the process: the other shards keep running.
            log.exception("stopping local shard failed", shard=shard)

    def _on_change_of(self, shard: str, token: object) -> Callable[[], None]:
        def on_change() -> None:
            entry = (self._local or {}).get(shard)
            if entry is not None and entry.token is token:
                entry.notify()
                self._dirty.set()

        return on_change

    # -- Status advertising --------------------------------------------------------------------

    async def _advertise_until_stopped(self) -> None:
        failures = 0
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            if self._stopping.is_set():
                return
            try:
                await self._advertise()
                failures = 0
            except NoSpaceError as exc:
                # etcd refuses every write until an operator makes room (the error says how):
                # tried again at the longest back-off for as long as that lasts, not counted.
                # Giving up would stop this process's shards, and a process started again could
                # not even take a lease; the shards go on processing meanwhile.
                log.error("shard status write refused (will retry)", error=str(exc))
                await self._sleep(status_write_backoff_max_s)
                self._dirty.set()
            except UnavailableError as exc:
                failures += 1
                if failures >= status_write_attempts_max:
                    raise
                delay_s = min(
                    status_write_backoff_max_s,
                    status_write_backoff_initial_s * 2 ** (failures - 1),
                )
                log.warning("shard status write failed (will retry)", error=str(exc))
                await self._sleep(delay_s)
                self._dirty.set()

    async def _advertise(self) -> None:
        """Write each local assignment's status where etcd does not say it yet."""
        zone, suffix = self._member
        for shard, entry in local_assignments(self._ks, self._root, zone, suffix).items():
            local = (self._local or {}).get(shard)
            if local is None:
                continue
            wanted = next_status(assignment_of(entry).status, local.handle.status())
            if wanted is None:
                continue
            kv = entry.kv
            resp = await self._backend.txn(
                [Compare(kv.key, CompareTarget.MOD, CompareResult.EQUAL, kv.mod_revision)],
                [OpPut(kv.key, wanted.SerializeToString(), lease=kv.lease)],
            )
            if not resp.succeeded:
                continue  # The assignment changed; its keyspace update re-triggers us.
            log.info("advertised shard status", shard=shard, status=status_text(wanted))
            try:
                await self._ks.wait_for_revision(resp.header.revision, status_revision_wait_s)
            except (TimeoutError, KeySpaceError) as exc:
                raise UnavailableError(f"keyspace did not reflect a status write: {exc}") from exc
