"""The Store interface every shard store implements, its errors, and a commit pipeline.

A Store holds a shard's state and its consumer checkpoint, and commits both in one atomic step
(docs/architecture.md, Invariants). The shard's transaction loop drives it:

1. `restore_checkpoint(shard)` once, when the shard becomes primary: returns the last committed
   checkpoint and *fences* every earlier instance of the same shard's store, so that a zombie
   primary can no longer commit (docs/architecture.md, Invariants).
2. While a transaction runs, the application stages changes through the store's own
   transaction handle (each implementation has one: a SQL connection, a write batch, ...).
3. `start_commit(shard, checkpoint, wait_for)` closes the transaction: it returns an `OpFuture`
   at once and commits in the background, after every awaitable in `wait_for` has succeeded
   (the appends of messages the transaction published: their ACK intents are in the checkpoint,
   so the checkpoint must not become durable before the messages themselves are).
   Meanwhile the next transaction may already run and stage changes, and even start its own
   commit: commits apply strictly in the order they were started, and one queued behind a
   failed commit fails too (applying it would record offsets past changes that never
   committed).
4. `destroy()` when the shard stops: abandons staged and pending work, releases resources.

`CommitPipeline` implements the ordering and dependency rules of step 3 once, for all stores.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from broker.protocol import consumer_pb2
from gazette_consumer.checkpoint import Checkpoint

OpFuture = asyncio.Future[None]
"""Resolves once a commit is durable; fails with the reason it did not commit.

A Future rather than a bare awaitable, so that callers can also poll `done()` or attach a
callback, as the transaction loop does when it waits on several things at once.
"""

COMMITS_IN_FLIGHT_MAX = 16
"""Bound on commits started but not finished. The transaction loop keeps at most two (the one
committing and the one being prepared); more means a caller is not waiting on its futures."""


class ShardContext(Protocol):
    """What a store needs to know about the shard it serves."""

    @property
    def fqn(self) -> str:
        """Fully-qualified shard name, unique across consumers sharing a database:
        ``<consumer etcd root>/items/<shard id>``."""
        ...

    @property
    def spec(self) -> consumer_pb2.ShardSpec:
        """The shard's current ShardSpec."""
        ...


class Store(Protocol):
    """A shard's store. See the module docstring for the protocol the shard follows."""

    async def restore_checkpoint(self, shard: ShardContext) -> Checkpoint:
        """Fence earlier instances of this shard's store and return its last checkpoint (the
        empty checkpoint for a shard that never committed)."""
        ...

    async def start_commit(
        self, shard: ShardContext, checkpoint: Checkpoint, wait_for: Sequence[Awaitable[object]]
    ) -> OpFuture:
        """Begin committing the current transaction with `checkpoint`; see the module
        docstring. Returns before the commit (and before `wait_for`) resolves."""
        ...

    async def destroy(self) -> None:
        """Roll back what is staged, abandon pending commits, release resources. The store is
        unusable afterwards."""
        ...


# --- Errors -------------------------------------------------------------------------------------


class StoreError(Exception):
    """Base of the errors stores raise."""


class FencedError(StoreError):
    """A newer instance of the shard's store has restored since this one did: this instance is
    a zombie and must not commit. Its staged changes were rolled back."""


class CommitDependencyError(StoreError):
    """An awaitable of a commit's `wait_for` failed, so the commit was rolled back. The
    awaitable's own exception is the `__cause__`."""


class PriorCommitFailedError(StoreError):
    """A commit ordered before this one failed, so this one was rolled back unapplied. The
    earlier commit's exception is the `__cause__`."""


class StoreIOError(StoreError):
    """The store's local files could not be written or read: its disk is full, or failed. Its
    message names the directory and how many bytes its file system has free. A shard starts
    over from its checkpoint (a transient failure): once the disk has room again, it recovers
    without an operator; a disk that stays full or broken gives up as FAILED after the retry
    policy's attempts."""


def free_bytes(directory: str | os.PathLike[str]) -> int | None:
    """Bytes free (to an unprivileged writer) on the file system of `directory`, or None if
    it cannot be told."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


class StoreStateError(StoreError):
    """The store was used out of protocol order (e.g. a commit before any restore, or any call
    after destroy)."""


# --- Commit pipeline ----------------------------------------------------------------------------


@dataclass
class _Commit:
    """One submitted commit, as the pipeline tracks it."""

    sequence: int
    dependencies: list[asyncio.Future[object]]
    wait_for: Sequence[Awaitable[object]]
    apply: Callable[[], Awaitable[None]]
    abort: Callable[[], Awaitable[None]]
    result: OpFuture
    started: bool = False


class CommitPipeline:
    """Applies commits one at a time, in submission order, each after its dependencies.

    A store submits each commit as two callbacks: `apply` makes it durable (and must itself
    undo everything if it fails); `abort` discards it when it must not be applied (a dependency
    or an earlier commit failed, or the pipeline was closed). Each commit runs as a task of the
    pipeline; `close()` cancels and reaps them all.

    The caller gets a future of its own, not the task: cancelling it (say, an
    `asyncio.wait_for` timing out) abandons the wait but not the commit, which later commits
    are ordered behind and must see through to its real outcome.
    """

    def __init__(self, commits_in_flight_max: int = COMMITS_IN_FLIGHT_MAX) -> None:
        if commits_in_flight_max < 1:
            raise ValueError(f"commits_in_flight_max: must be >= 1 (got {commits_in_flight_max})")
        self._commits_in_flight_max = commits_in_flight_max
        self._commits: dict[asyncio.Task[BaseException | None], _Commit] = {}
        self._last: asyncio.Task[BaseException | None] | None = None
        self._sequence = 0
        self._closed = False

    @property
    def in_flight(self) -> int:
        """Commits submitted and not yet finished."""
        return len(self._commits)

    def submit(
        self,
        wait_for: Sequence[Awaitable[object]],
        apply: Callable[[], Awaitable[None]],
        abort: Callable[[], Awaitable[None]],
    ) -> OpFuture:
        """Queue a commit behind every earlier one. Must be called from the event loop."""
        if self._closed:
            raise StoreStateError("commit pipeline: closed")
        if len(self._commits) >= self._commits_in_flight_max:
            raise StoreStateError(
                f"commit pipeline: {len(self._commits)} commits in flight, the maximum "
                f"(commits_in_flight_max={self._commits_in_flight_max})"
            )
        loop = asyncio.get_running_loop()
        self._sequence += 1
        commit = _Commit(
            sequence=self._sequence,
            # Wrap coroutines in tasks now rather than inside the commit task: a commit that
            # fails before reaching them would otherwise leave them never awaited.
            dependencies=[asyncio.ensure_future(dep) for dep in wait_for],
            wait_for=wait_for,
            apply=apply,
            abort=abort,
            result=loop.create_future(),
        )
        task = loop.create_task(
            self._run(commit, self._last), name=f"store-commit-{commit.sequence}"
        )
        self._commits[task] = commit
        task.add_done_callback(self._forget)
        self._last = task
        return commit.result

    async def settled(self) -> None:
        """Return once every commit submitted so far has finished (applied or failed)."""
        if self._commits:
            await asyncio.wait(set(self._commits))

    def _forget(self, task: asyncio.Task[BaseException | None]) -> None:
        self._commits.pop(task, None)

    async def close(self) -> None:
        """Cancel commits still pending, discard them, and wait until none runs. Idempotent."""
        self._closed = True
        commits = dict(self._commits)
        for task in commits:
            task.cancel()
        if commits:
            await asyncio.wait(set(commits))
        for commit in commits.values():
            if not commit.started:
                # Cancelled before its task ever ran, so _run's own clean-up never did.
                _cancel_owned(commit)
                await commit.abort()
                commit.result.cancel()

    async def _run(
        self, commit: _Commit, prior: asyncio.Task[BaseException | None] | None
    ) -> BaseException | None:
        """Run one commit; return (rather than raise) its error, for the next commit to see."""
        commit.started = True
        try:
            try:
                if prior is not None:
                    await _await_prior(commit.sequence, prior)
                await _await_dependencies(commit.sequence, commit.dependencies)
            except BaseException:
                _cancel_owned(commit)
                await commit.abort()
                raise
            await commit.apply()
        except asyncio.CancelledError:
            commit.result.cancel()
            raise
        except Exception as error:
            if not commit.result.done():
                commit.result.set_exception(error)
            return error
        if not commit.result.done():
            commit.result.set_result(None)
        return None


def _cancel_owned(commit: _Commit) -> None:
    # Only tasks we created from coroutines are ours to cancel; futures the caller passed
    # (e.g. appends other parties wait on too) are left alone.
    for future, original in zip(commit.dependencies, commit.wait_for, strict=True):
        if future is not original and not future.done():
            future.cancel()


async def _await_prior(sequence: int, prior: asyncio.Task[BaseException | None]) -> None:
    # asyncio.wait, not `await prior`: cancelling this commit must not cancel the one before.
    await asyncio.wait({prior})
    if prior.cancelled():
        raise PriorCommitFailedError(f"commit {sequence}: commit {sequence - 1} was cancelled")
    error = prior.result()
    if error is not None:
        raise PriorCommitFailedError(
            f"commit {sequence}: commit {sequence - 1} failed: {error}"
        ) from error


async def _await_dependencies(sequence: int, dependencies: list[asyncio.Future[object]]) -> None:
    if not dependencies:
        return
    # FIRST_EXCEPTION: a failed dependency dooms the commit; no need to wait for the rest.
    await asyncio.wait(dependencies, return_when=asyncio.FIRST_EXCEPTION)
    for index, future in enumerate(dependencies):
        if not future.done():
            continue
        if future.cancelled():
            raise CommitDependencyError(f"commit {sequence}: wait_for[{index}] was cancelled")
        error = future.exception()
        if error is not None:
            raise CommitDependencyError(
                f"commit {sequence}: wait_for[{index}] failed: {error!r}"
            ) from error
