"""JSONFileStore: a shard's state as one JSON document, recorded into a recovery log.

The state is a dict (`store.state`) the application reads and changes freely during a
transaction. Each commit writes the document — the state and the checkpoint — to a new file
`state.json.next` in the store's directory, renames it over `state.json`, and records those
operations (create, write, rename) into the shard's recovery log through a Recorder; the commit
is durable once the recorder's flush returns. The rename is atomic locally, and its ops reach
the log in one append (a flush after them), so a restore sees the last committed document,
never a torn one.

Two ways to open one:

- In a shard (the usual way): the shard runner plays the recovery log and hands it off to a
  new author before `Application.new_store` is called (gazette_consumer/recovery.py), so the
  application builds the store over the recorder it is given: `JSONFileStore.recorded(recorder)`.
  `restore_checkpoint` then only reads the played document.
- Standalone: `JSONFileStore(client, log, directory)`; its `restore_checkpoint` plays the log
  into the (emptied) directory and hands it off to this instance's author itself.

Either way, once restored, the previous primary's recorder is fenced, so its commits fail with
FencedError (docs/architecture.md, Invariants).

The document is serialized when `start_commit` is called, so a pipelined next transaction may
change `state` while the commit waits on its `wait_for`. A failed commit leaves `state` holding
changes that never committed: the store refuses further commits, and the shard must restore a
new instance (which it does after any failed commit).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import os
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any, Final

from broker.client.route_cache import JournalClient
from broker.protocol.recorded_op_pb2 import FSMHints
from gazette_consumer.checkpoint import Checkpoint, decode_checkpoint, encode_checkpoint
from gazette_consumer.recoverylog.recorder import RecorderFencedError
from gazette_consumer.stores.base import (
    COMMITS_IN_FLIGHT_MAX,
    OpFuture,
    ShardContext,
    StoreError,
)
from gazette_consumer.stores.recorded import RecordedStore

__all__ = ["NEXT_FILE", "STATE_FILE", "JSONFileStore"]

STATE_FILE: Final = "state.json"
NEXT_FILE: Final = "state.json.next"


class JSONFileStore(RecordedStore):
    """A Store whose state is a JSON document in a recorded directory. See the module
    docstring, and RecordedStore for the arguments and what every recorded store does."""

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
        super().__init__(
            client,
            log,
            directory,
            hints=hints,
            author=author,
            commits_in_flight_max=commits_in_flight_max,
        )
        self.state: dict[str, Any] = {}

    # --- Store ---------------------------------------------------------------------------------

    async def restore_checkpoint(self, shard: ShardContext) -> Checkpoint:
        """Play the recovery log into the directory, take the log over (fencing the previous
        primary), and return the last committed checkpoint."""
        await self._take_over(shard)
        path = self.directory / STATE_FILE
        if not path.exists():
            return Checkpoint()
        try:
            document = json.loads(path.read_bytes())
            self.state = dict(document["state"])
            return decode_checkpoint(base64.b64decode(document["checkpoint"], validate=True))
        except (ValueError, KeyError, TypeError) as err:
            raise StoreError(f"restore_checkpoint: {path} is not a JSONFileStore document") from err

    async def start_commit(
        self, shard: ShardContext, checkpoint: Checkpoint, wait_for: Sequence[Awaitable[object]]
    ) -> OpFuture:
        self._check_commit(shard)
        # Serialized now: later changes to `state` belong to the next transaction.
        document = {
            "checkpoint": base64.b64encode(encode_checkpoint(checkpoint)).decode(),
            "state": self.state,
        }
        data = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
        return self._pipeline.submit(
            wait_for, apply=functools.partial(self._apply, data), abort=_nothing
        )

    async def destroy(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        await self._pipeline.close()

    # --- Commit --------------------------------------------------------------------------------

    async def _apply(self, data: bytes) -> None:
        recorder = self._recorder
        assert recorder is not None
        try:
            await asyncio.to_thread(_write_synced, self.directory / NEXT_FILE, data)
            fnode = await recorder.create(NEXT_FILE)
            await recorder.write_at(fnode, data, 0)
            os.replace(self.directory / NEXT_FILE, self.directory / STATE_FILE)
            await recorder.rename(NEXT_FILE, STATE_FILE)
            await recorder.flush()
        except RecorderFencedError as err:
            raise self._fenced(err) from err
        except BaseException as err:
            self._failed = err
            raise


async def _nothing() -> None:
    return None  # Nothing is staged outside `state`, which the next restore discards.


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
