"""A conformance kit for shard stores: ``await check_store(factory)``.

Every Store (SQL, RocksDB, JSON file, a fault-injecting wrapper) must pass every check here, so
that the transaction loop can rely on the same commit semantics whichever store a shard uses.
Each check is a plain async function named after what it checks; `check_store` runs them all,
in order, and a failure raises ConformanceError (an AssertionError) naming the check and what
differed.

The factory (`StoreFactory`) opens instances of a shard's store over shared durable state (a
second `open` of the same shard is what a new primary does), and stages and reads a piece of
application state through a store, so that the checks can see whether user state commits
atomically with the checkpoint. Each check uses a shard of its own, named under a fresh random
prefix, so the checks can run against a database that holds other data.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from broker.protocol import consumer_pb2
from gazette_consumer.checkpoint import Checkpoint, build_checkpoint, equivalent
from gazette_consumer.sequencer.types import JournalProducer, ProducerState
from gazette_consumer.stores.base import (
    CommitDependencyError,
    FencedError,
    OpFuture,
    PriorCommitFailedError,
    ShardContext,
    Store,
)

commit_timeout_s = 30.0
"""Upper bound on a commit that should resolve promptly (a broken store fails, not hangs)."""


class ConformanceError(AssertionError):
    """A store broke the Store contract; the message names the check and what differed."""


@dataclass(frozen=True)
class SimpleShard:
    """A ShardContext for tests and tools: just a name and a spec."""

    fqn: str
    spec: consumer_pb2.ShardSpec = field(default_factory=consumer_pb2.ShardSpec)


class StoreFactory(Protocol):
    """What check_store needs of the environment around a store implementation."""

    @property
    def stages_while_committing(self) -> bool:
        """True if a transaction may stage changes while the previous one's commit waits on
        its `wait_for` (false for SQLite, whose single writer lock the waiting commit holds)."""
        ...

    async def open(self, shard: ShardContext) -> Store:
        """A new instance of `shard`'s store over the shared durable state, not yet restored.
        The checks destroy it."""
        ...

    async def stage(self, store: Store, key: str, value: bytes) -> None:
        """Set application state `key` to `value` in `store`'s current transaction."""
        ...

    async def read(self, store: Store, key: str) -> bytes | None:
        """The committed value of `key` as `store` (freshly restored) sees it, or None."""
        ...


Check = Callable[[StoreFactory, str], Awaitable[None]]
"""A check: given the factory and a fresh shard-name prefix, raise ConformanceError or return."""


def _fail(check: str, what: str) -> ConformanceError:
    return ConformanceError(f"{check}: {what}")


def _shard(prefix: str, check: str) -> SimpleShard:
    return SimpleShard(fqn=f"{prefix}/items/{check}")


def sample_checkpoint(n: int) -> Checkpoint:
    """A distinct, valid checkpoint per `n` >= 1: a source with a producer, and an ACK intent."""
    journal = "conformance/source"
    producer = JournalProducer(journal, n.to_bytes(6, "big"))
    return build_checkpoint(
        read_through={journal: 100 * n},
        producers={producer: ProducerState(last_ack=n, begin=100 * n - 10)},
        ack_intents={"conformance/acks": f"ack-{n}".encode()},
    )


@contextlib.asynccontextmanager
async def _opened(factory: StoreFactory, shard: ShardContext) -> AsyncIterator[Store]:
    store = await factory.open(shard)
    try:
        yield store
    finally:
        await store.destroy()


async def _restored_state(
    factory: StoreFactory, shard: ShardContext, *keys: str
) -> tuple[Checkpoint, list[bytes | None]]:
    """What a new primary of `shard` recovers: its checkpoint, and the values of `keys`."""
    async with _opened(factory, shard) as store:
        checkpoint = await store.restore_checkpoint(shard)
        return checkpoint, [await factory.read(store, key) for key in keys]


async def _resolve(future: OpFuture, check: str, what: str) -> BaseException | None:
    """Wait (bounded) for `future`; return its exception, or None if it succeeded."""
    try:
        async with asyncio.timeout(commit_timeout_s):
            await asyncio.wait({future})
    except TimeoutError:
        raise _fail(check, f"{what} did not resolve within {commit_timeout_s}s") from None
    if future.cancelled():
        raise _fail(check, f"{what} was cancelled")
    return future.exception()


async def _expect_success(future: OpFuture, check: str, what: str) -> None:
    error = await _resolve(future, check, what)
    if error is not None:
        raise _fail(check, f"{what} failed: {error!r}") from error


async def _expect_failure(
    future: OpFuture, check: str, what: str, error_type: type[BaseException]
) -> None:
    error = await _resolve(future, check, what)
    if error is None:
        raise _fail(check, f"{what} succeeded; it must fail with {error_type.__name__}")
    if not isinstance(error, error_type):
        raise _fail(check, f"{what} failed with {error!r}; expected {error_type.__name__}")


def _expect_checkpoint(check: str, got: Checkpoint, want: Checkpoint, what: str) -> None:
    if not equivalent(got, want):
        raise _fail(check, f"{what}: restored checkpoint {got} but expected {want}")


def _expect_value(check: str, got: bytes | None, want: bytes | None, what: str) -> None:
    if got != want:
        raise _fail(check, f"{what}: user state is {got!r} but expected {want!r}")


# --- Checks ---------------------------------------------------------------------------------------


async def check_fresh_restore_is_empty(factory: StoreFactory, prefix: str) -> None:
    """A shard that never committed restores the empty checkpoint."""
    name = "fresh_restore_is_empty"
    shard = _shard(prefix, name)
    async with _opened(factory, shard) as store:
        got = await store.restore_checkpoint(shard)
    _expect_checkpoint(name, got, Checkpoint(), "fresh shard")


async def check_commit_then_restore(factory: StoreFactory, prefix: str) -> None:
    """A committed checkpoint, and user state staged in its transaction, are what a new
    instance restores."""
    name = "commit_then_restore"
    shard = _shard(prefix, name)
    key = f"{shard.fqn}/key"
    async with _opened(factory, shard) as store:
        await store.restore_checkpoint(shard)
        await factory.stage(store, key, b"one")
        await _expect_success(
            await store.start_commit(shard, sample_checkpoint(1), []), name, "commit 1"
        )
    checkpoint, (value,) = await _restored_state(factory, shard, key)
    _expect_checkpoint(name, checkpoint, sample_checkpoint(1), "after commit 1")
    _expect_value(name, value, b"one", "after commit 1")


async def check_failed_dependency_does_not_commit(factory: StoreFactory, prefix: str) -> None:
    """A commit whose `wait_for` fails applies neither its checkpoint nor its user state."""
    name = "failed_dependency_does_not_commit"
    shard = _shard(prefix, name)
    key = f"{shard.fqn}/key"
    async with _opened(factory, shard) as store:
        await store.restore_checkpoint(shard)
        await factory.stage(store, key, b"one")
        await _expect_success(
            await store.start_commit(shard, sample_checkpoint(1), []), name, "commit 1"
        )

        await factory.stage(store, key, b"two")
        dependency: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        doomed = await store.start_commit(shard, sample_checkpoint(2), [dependency])
        if doomed.done():
            raise _fail(name, "commit 2 resolved before its wait_for did")
        dependency.set_exception(RuntimeError("injected failure of a wait_for append"))
        await _expect_failure(doomed, name, "commit 2", CommitDependencyError)
    checkpoint, (value,) = await _restored_state(factory, shard, key)
    _expect_checkpoint(name, checkpoint, sample_checkpoint(1), "after failed commit 2")
    _expect_value(name, value, b"one", "after failed commit 2")


async def check_commit_behind_failed_commit_fails(factory: StoreFactory, prefix: str) -> None:
    """A commit queued behind one that fails fails too: applying it would record offsets past
    changes that never committed."""
    name = "commit_behind_failed_commit_fails"
    shard = _shard(prefix, name)
    # One key per transaction: a transaction writing a row the pending one wrote would wait
    # for that commit (a row lock), which here waits for the check itself.
    key2, key3 = f"{shard.fqn}/key2", f"{shard.fqn}/key3"
    async with _opened(factory, shard) as store:
        await store.restore_checkpoint(shard)
        await _expect_success(
            await store.start_commit(shard, sample_checkpoint(1), []), name, "commit 1"
        )

        await factory.stage(store, key2, b"two")
        dependency: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        doomed = await store.start_commit(shard, sample_checkpoint(2), [dependency])
        if factory.stages_while_committing:
            await factory.stage(store, key3, b"three")
        queued = await store.start_commit(shard, sample_checkpoint(3), [])
        dependency.set_exception(RuntimeError("injected failure of a wait_for append"))
        await _expect_failure(doomed, name, "commit 2", CommitDependencyError)
        await _expect_failure(queued, name, "commit 3 (queued behind 2)", PriorCommitFailedError)
    checkpoint, values = await _restored_state(factory, shard, key2, key3)
    _expect_checkpoint(name, checkpoint, sample_checkpoint(1), "after failed commits 2 and 3")
    _expect_value(name, values[0], None, "commit 2's key, after failed commits 2 and 3")
    _expect_value(name, values[1], None, "commit 3's key, after failed commits 2 and 3")


async def check_pipelined_commits_apply_in_order(factory: StoreFactory, prefix: str) -> None:
    """`start_commit` returns before its `wait_for` resolves; a commit started behind it
    waits for it, and they apply (and resolve) in the order they were started."""
    name = "pipelined_commits_apply_in_order"
    shard = _shard(prefix, name)
    key1, key2 = f"{shard.fqn}/key1", f"{shard.fqn}/key2"  # Distinct rows: see above.
    async with _opened(factory, shard) as store:
        await store.restore_checkpoint(shard)
        await factory.stage(store, key1, b"one")
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        first = await store.start_commit(shard, sample_checkpoint(1), [gate])
        if first.done():
            raise _fail(name, "commit 1 resolved before its wait_for did")

        want2 = None
        if factory.stages_while_committing:
            await factory.stage(store, key2, b"two")
            want2 = b"two"
        second = await store.start_commit(shard, sample_checkpoint(2), [])
        if second.done():
            raise _fail(name, "commit 2 resolved while commit 1 still waited on its wait_for")

        # Done-callbacks run in the order their futures complete. Registered before anything
        # awaits the futures, each runs before its future's waiters wake.
        resolved: list[int] = []
        first.add_done_callback(lambda _: resolved.append(1))
        second.add_done_callback(lambda _: resolved.append(2))
        gate.set_result(None)
        await _expect_success(first, name, "commit 1")
        await _expect_success(second, name, "commit 2")
        if resolved != [1, 2]:
            raise _fail(name, f"commits resolved in order {resolved}, expected [1, 2]")
    checkpoint, values = await _restored_state(factory, shard, key1, key2)
    _expect_checkpoint(name, checkpoint, sample_checkpoint(2), "after commits 1 and 2")
    _expect_value(name, values[0], b"one", "commit 1's key, after commits 1 and 2")
    _expect_value(name, values[1], want2, "commit 2's key, after commits 1 and 2")


async def check_zombie_is_fenced(factory: StoreFactory, prefix: str) -> None:
    """Once a newer instance restored the shard, an older one can no longer commit — neither
    its checkpoint nor its user state — while the newer one can (docs/architecture.md,
    Invariants)."""
    name = "zombie_is_fenced"
    shard = _shard(prefix, name)
    key = f"{shard.fqn}/key"
    async with _opened(factory, shard) as old, _opened(factory, shard) as new:
        await old.restore_checkpoint(shard)
        await new.restore_checkpoint(shard)

        await factory.stage(old, key, b"zombie")
        await _expect_failure(
            await old.start_commit(shard, sample_checkpoint(1), []),
            name,
            "the older instance's commit",
            FencedError,
        )
        # Read before the newer instance writes the same key, which would hide a leak.
        _expect_value(name, await factory.read(new, key), None, "after the zombie's commit")
        await factory.stage(new, key, b"primary")
        await _expect_success(
            await new.start_commit(shard, sample_checkpoint(2), []), name, "the newer's commit"
        )
    checkpoint, (value,) = await _restored_state(factory, shard, key)
    _expect_checkpoint(name, checkpoint, sample_checkpoint(2), "after the zombie's commit")
    _expect_value(name, value, b"primary", "after the zombie's commit")


async def check_destroy_discards_staged(factory: StoreFactory, prefix: str) -> None:
    """Changes staged but never committed are gone after `destroy`."""
    name = "destroy_discards_staged"
    shard = _shard(prefix, name)
    key = f"{shard.fqn}/key"
    async with _opened(factory, shard) as store:
        await store.restore_checkpoint(shard)
        await factory.stage(store, key, b"uncommitted")
    checkpoint, (value,) = await _restored_state(factory, shard, key)
    _expect_checkpoint(name, checkpoint, Checkpoint(), "after destroy")
    _expect_value(name, value, None, "after destroy")


CHECKS: tuple[Check, ...] = (
    check_fresh_restore_is_empty,
    check_commit_then_restore,
    check_failed_dependency_does_not_commit,
    check_commit_behind_failed_commit_fails,
    check_pipelined_commits_apply_in_order,
    check_zombie_is_fenced,
    check_destroy_discards_staged,
)


def fresh_prefix() -> str:
    """A shard-name prefix no earlier run used."""
    return f"conformance-{uuid.uuid4().hex[:12]}"


async def check_store(factory: StoreFactory, prefix: str | None = None) -> None:
    """Run every check against stores from `factory`; raise ConformanceError on the first
    failure."""
    prefix = prefix if prefix is not None else fresh_prefix()
    for check in CHECKS:
        await check(factory, prefix)
