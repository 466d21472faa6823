"""A shard replica's recovery log: playback, hand-off, recorder, hints (docs/architecture.md,
Invariants).

A shard whose ShardSpec has a `recovery_log_prefix` keeps its store's files in a local
directory recorded into the journal `<recovery_log_prefix>/<id>` (`shard_spec.recovery_log`).
Each replica of the shard — primary or hot standby — has a `ShardRecovery`:

1. `start()`: fetch the stored hints (hints.py; none: play the whole log), check the log
   journal exists, and start a `Player` as a task, playing the log into a fresh directory of
   the replica's own (under the process's data directory). A standby's player keeps tailing
   the log once caught up (`tailing` is set): it applies each commit of the primary as it
   lands, so that a promotion need not replay the history.
2. `complete()` (when the replica becomes primary): ask the player to inject a hand-off to a
   new random author — an append that sets the log's `author` register, which fences the
   recorder of any older primary — wait for it to reach the head, and return a `Recorder`
   over the played directory. The shard passes it to `Application.new_store`.
3. After the store's checkpoint is restored, `store_recovered_hints()` stores the hints of
   the recovered state as the newest backup; while the primary serves, `store_recorded_hints()`
   stores the recorder's hints as the primary hints (the shard does it after commits, at most
   every `hints_interval_s`).
4. `close()`: stop the player and remove the directory.

The log journal is not created here. As in Gazette, operators create it, with the shard
(e.g. `gazctl journals apply`, labelled `content-type: application/x-gazette-recoverylog`
as Gazette requires); a shard whose log does not exist fails with `RecoveryLogMissingError`,
naming the journal, rather than creating one on a guess of its replication and fragment
settings. A journal labelled with another content type (a source journal named by mistake)
is refused too (`RecoveryLogError`); an unlabelled one is accepted.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path

from broker.client.list_apply import get_journal
from broker.client.route_cache import JournalClient
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import labels
from broker.protocol.recorded_op_pb2 import FSMHints
from broker.protocol.status import JournalNotFoundError
from gazette_consumer.hints import HintStore
from gazette_consumer.recoverylog.fsm import new_random_author
from gazette_consumer.recoverylog.player import Player, Recovered
from gazette_consumer.recoverylog.recorder import Recorder
from gazette_consumer.shard_spec import recovery_log

__all__ = ["RecoveryLogError", "RecoveryLogMissingError", "ShardRecovery"]


class RecoveryLogError(Exception):
    """The shard's recovery log journal cannot serve as one (names the journal)."""


class RecoveryLogMissingError(RecoveryLogError):
    """The shard's recovery log journal does not exist (operators create it)."""


class ShardRecovery:
    """The recovery log of one replica of a shard. See the module docstring.

    `data_dir` is where the replica's directory is made (None: the system's temporary
    directory); `hints` is where hints are kept (None: nowhere, every recovery plays the whole
    log)."""

    def __init__(
        self,
        client: JournalClient,
        spec: cpb.ShardSpec,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        hints: HintStore | None = None,
    ) -> None:
        self.log = recovery_log(spec)
        if not self.log:
            raise ValueError(f"shard {spec.id}: its spec has no recovery_log_prefix")
        self._client = client
        self._spec = spec
        self._data_dir = data_dir
        self._hints = hints
        self.directory: Path | None = None
        self.player: Player | None = None
        self._play: asyncio.Task[Recovered] | None = None
        self.recorder: Recorder | None = None
        self.recovered_hints: FSMHints | None = None
        # The log offset the player had read through when the hand-off was requested: how
        # much of the history a standby had played before its promotion.
        self.played_before_handoff = 0

    @property
    def tailing(self) -> asyncio.Event:
        """Set once the player has read through the log's head (the replica can take over)."""
        if self.player is None:
            raise RuntimeError(f"{self.log}: the recovery was not started")
        return self.player.tailing

    async def start(self) -> None:
        """Fetch hints, check the log exists, and start playing (see the module docstring)."""
        if self.player is not None:
            raise RuntimeError(f"{self.log}: the recovery was already started")
        hints = FSMHints(log=self.log)
        if self._hints is not None:
            hints = await self._hints.fetch(self._spec)
        await self._check_log()
        if self._data_dir is not None:
            os.makedirs(self._data_dir, exist_ok=True)
        prefix = self._spec.id.replace("/", "_") + "-"
        self.directory = Path(tempfile.mkdtemp(prefix=prefix, dir=self._data_dir))
        self.player = Player(self._client, hints, self.directory)
        self._play = asyncio.ensure_future(self.player.play())

    async def _check_log(self) -> None:
        try:
            spec = await get_journal(self._client, self.log)
        except JournalNotFoundError:
            raise RecoveryLogMissingError(
                f"shard {self._spec.id}: its recovery log journal {self.log!r} does not exist; "
                "create it (gazctl journals apply) before running the shard"
            ) from None
        types = {x.value for x in spec.labels.labels if x.name == labels.CONTENT_TYPE}
        if types and types != {labels.CONTENT_TYPE_RECOVERY_LOG}:
            raise RecoveryLogError(
                f"shard {self._spec.id}: journal {self.log!r} is labelled "
                f"{labels.CONTENT_TYPE}={sorted(types)}, not {labels.CONTENT_TYPE_RECOVERY_LOG}"
            )

    async def wait_tailing(self) -> None:
        """Return once the player tails the log; raise if playback failed first."""
        await self.wait_playing(self.tailing)

    async def wait_playing(self, event: asyncio.Event) -> None:
        """Return once `event` is set (a promotion, say); raise if playback failed first."""
        assert self._play is not None
        waiting = asyncio.ensure_future(event.wait())
        try:
            await asyncio.wait((waiting, self._play), return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiting.cancel()
        if not event.is_set():
            self._play.result()  # Raises its error.
            raise RuntimeError(f"{self.log}: playback completed before a hand-off was asked")

    async def complete(self) -> Recorder:
        """Hand the log off to a new author and return its Recorder (see the docstring)."""
        if self.player is None or self._play is None:
            raise RuntimeError(f"{self.log}: the recovery was not started")
        author = new_random_author()
        self.played_before_handoff = self.player.played_through
        self.player.inject_handoff(author)
        recovered = await self._play
        # Snapshot now: the recorder takes the FSM over and changes it as the store records.
        self.recovered_hints = recovered.fsm.build_hints()
        self.recorder = Recorder(
            self._client,
            recovered.fsm,
            author,
            recovered.directory,
            write_head=recovered.write_head,
        )
        return self.recorder

    async def store_recovered_hints(self) -> None:
        if self._hints is not None and self.recovered_hints is not None:
            await self._hints.store_recovered(self._spec, self.recovered_hints)

    async def store_recorded_hints(self) -> FSMHints:
        """Build the recorder's hints (once the ops they name are durable) and store them."""
        if self.recorder is None:
            raise RuntimeError(f"{self.log}: no recorder yet")
        hints = await self.recorder.build_hints()
        if self._hints is not None:
            await self._hints.store_recorded(self._spec, hints)
        return hints

    async def close(self) -> None:
        """Stop playing (if still) and remove the replica's directory. Idempotent."""
        task, self._play = self._play, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])
            if not task.cancelled():
                task.exception()  # Retrieved: a failure was already reported by its waiter.
        if self.directory is not None:
            await asyncio.to_thread(shutil.rmtree, self.directory, True)
