"""RecordedStore: what the stores recorded into a shard's recovery log share.

A recorded store keeps its state in files of a local directory, and records every change to
those files into the shard's recovery log (gazette_consumer/recoverylog) through a Recorder, so
that the next primary can play the log into a directory of its own and carry on. The stores
differ in what the files are (JSONFileStore: one JSON document; RocksDBStore: a database) and
in how a commit records them; this base holds the rest:

- two ways to open one: in a shard, whose runner played the log and handed it off before
  `Application.new_store` is called, as `Store.recorded(recorder)`; or standalone, where
  `restore_checkpoint` plays the log (from `hints`, if given) and hands it off itself;
- one restore per instance, and commits only after it, for the restored shard, and none after
  a failed one (the shard then restores a new instance, as it does after any failed commit);
- fencing: once a newer instance restored, this one's recorder is fenced, and its commits fail
  with FencedError (docs/architecture.md, Invariants);
- the CommitPipeline that applies commits in order once their `wait_for` resolved.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Self

from broker.client.route_cache import JournalClient
from broker.protocol.recorded_op_pb2 import FSMHints
from gazette_consumer.recoverylog.fsm import new_random_author
from gazette_consumer.recoverylog.player import play_and_handoff
from gazette_consumer.recoverylog.recorder import Recorder
from gazette_consumer.stores.base import (
    COMMITS_IN_FLIGHT_MAX,
    CommitPipeline,
    FencedError,
    ShardContext,
    StoreStateError,
)

__all__ = ["RecordedStore"]


class RecordedStore:
    """The shared part of a store recorded into a recovery log (see the module docstring).
    `log` is the shard's recovery log (`shard_spec.recovery_log(spec)`); `hints` let a
    standalone restore skip obsolete history (the last `build_hints()` of a previous
    primary); `author` is this instance's recorder author (random by default)."""

    def __init__(
        self,
        client: JournalClient,
        log: str,
        directory: str | os.PathLike[str],
        *,
        hints: FSMHints | None = None,
        author: int | None = None,
        commits_in_flight_max: int = COMMITS_IN_FLIGHT_MAX,
    ) -> None:
        self.client = client
        self.log = log
        self.directory = Path(directory)
        self.author = author if author is not None else new_random_author()
        self._hints = hints if hints is not None else FSMHints(log=log)
        if self._hints.log != log:
            raise ValueError(f"hints: log {self._hints.log!r} is not the store's log {log!r}")
        self._pipeline = CommitPipeline(commits_in_flight_max)
        self._recorder: Recorder | None = None
        self._fqn: str | None = None
        self._failed: BaseException | None = None
        self._destroyed = False
        self._played = False  # The directory was played by whoever built the recorder.

    @classmethod
    def recorded(cls, recorder: Recorder, **options: Any) -> Self:
        """A store over a directory already played and handed off to `recorder`'s author
        (what a shard passes to `Application.new_store`). `options` are the store's own
        keyword arguments (e.g. `commits_in_flight_max`)."""
        store = cls(
            recorder.client, recorder.log, recorder.directory, author=recorder.author, **options
        )
        store._recorder = recorder
        store._played = True
        return store

    @property
    def recorder(self) -> Recorder | None:
        return self._recorder

    async def build_hints(self) -> FSMHints:
        """Hints of the committed state, for the next primary's restore."""
        if self._recorder is None:
            raise StoreStateError("build_hints: restore_checkpoint must come first")
        return await self._recorder.build_hints()

    # --- For the stores -----------------------------------------------------------------------

    async def _take_over(self, shard: ShardContext) -> Recorder:
        """`restore_checkpoint`'s first part: play the log into the directory and hand it off
        to this instance's author (fencing the previous primary), unless the shard did."""
        self._check_usable("restore_checkpoint")
        if self._fqn is not None or (self._recorder is not None and not self._played):
            raise StoreStateError("restore_checkpoint: already restored; use a new store")
        if self._recorder is None:
            recovered = await play_and_handoff(
                self.client, self._hints, self.directory, self.author
            )
            self._recorder = Recorder(
                self.client,
                recovered.fsm,
                self.author,
                self.directory,
                write_head=recovered.write_head,
            )
        self._fqn = shard.fqn
        return self._recorder

    def _check_commit(self, shard: ShardContext) -> Recorder:
        """`start_commit`'s checks: restored, for this shard, no earlier commit failed."""
        self._check_usable("start_commit")
        if self._recorder is None:
            raise StoreStateError("start_commit: restore_checkpoint must come first")
        if shard.fqn != self._fqn:
            raise StoreStateError(
                f"start_commit: shard {shard.fqn!r} is not the restored shard {self._fqn!r}"
            )
        if self._failed is not None:
            raise StoreStateError("start_commit: an earlier commit failed; restore a new store")
        return self._recorder

    def _fenced(self, err: BaseException) -> FencedError:
        """The error of a commit whose recorder was fenced by a newer instance (raise it
        `from err`); the store refuses further commits."""
        self._failed = err
        return FencedError(
            f"{self._fqn}: another instance restored the shard (recovery log {self.log} "
            "was handed off): this commit was not recorded"
        )

    def _check_usable(self, operation: str) -> None:
        if self._destroyed:
            raise StoreStateError(f"{operation}: the store was destroyed")
