"""Where a shard's recovery-log hints live: etcd keys under the ShardSpec's `hint_prefix`.

Hints (`FSMHints`) let a new primary skip the obsolete history of a recovery log: it plays only
the segments that still hold live files (recoverylog/fsm.py). As in Gazette, a shard keeps
them in etcd under the keys `shard_specs_api.hint_keys` names:

- `<hint_prefix>/<id>.primary`: *recorded* hints, which the primary stores every so often
  after its commits (`store_recorded`). The most recent, so the first tried.
- `<hint_prefix>/<id>.backup.<i>`: *recovered* hints, which a primary stores right after its
  recovery (`store_recovered`): the newest into `.backup.0`, each older one rotated to the next
  slot, the oldest dropped; all in one transaction guarded by each slot's mod revision. Should
  recorded hints turn out bad (a bug, an operator's mistake), the shard can still recover from
  a backup — an operator deletes the primary key.

`fetch` returns the first stored hints (primary, then the backups in order), or hints naming
just the log (play it whole) when none were stored. Hints of another log are refused: the spec
changed its `recovery_log_prefix`, and old hints would play the wrong journal.

Hints are advisory: stale hints are still correct (they name a prefix of the log's history,
which only grows), so a write that races another primary's loses nothing but skipped history.
This is why, unlike Gazette, the writes are not guarded by the writer's assignment (our
`ShardStart` does not carry it); a zombie's recorder is fenced, so it cannot build new hints
(building them appends to the log with the author register checked, even when nothing is to be
flushed: Recorder.build_hints).

Values are written as Gazette's consumers write and read them: Go's encoding/json of FSMHints
(`encode_hints_json`), so that a Go consumer taking a shard over recovers from our hints;
`decode_hints` also reads the binary FSMHints that earlier versions of ours wrote.
"""

from __future__ import annotations

from typing import Final

from broker.keyspace.backend import (
    Backend,
    Compare,
    CompareResult,
    CompareTarget,
    KeyValue,
    Op,
    OpGet,
    OpPut,
)
from broker.protocol import consumer_pb2 as cpb
from broker.protocol.recorded_op_pb2 import FSMHints
from gazette_consumer.recoverylog.fsm import FSM, FSMError
from gazette_consumer.shard_spec import recovery_log
from gazette_consumer.shard_specs_api import (
    HintsDecodeError,
    decode_hints,
    encode_hints_json,
    hint_keys,
)

__all__ = ["HintStore", "HintsError"]

ROTATE_ATTEMPTS_MAX: Final = 8
"""Rotations of the backup keys retried when another writer changed a slot in between."""


class HintsError(Exception):
    """Stored hints cannot be used (undecodable, invalid, or of another log); names the key."""


class HintStore:
    """A shard's hints in an etcd-like backend (see the module docstring)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    async def fetch(self, spec: cpb.ShardSpec) -> FSMHints:
        """The hints to recover `spec`'s shard from (see the module docstring)."""
        keys, stored = await self._read(spec)
        for key, kv in zip(keys, stored, strict=True):
            if kv is not None:
                return _checked(spec, key, kv.value)
        return FSMHints(log=recovery_log(spec))

    async def store_recorded(self, spec: cpb.ShardSpec, hints: FSMHints) -> None:
        """Store hints a primary recorded, as the shard's primary hints."""
        keys = _keys(spec, hints)
        await self.backend.txn([], [OpPut(keys[0].encode(), encode_hints_json(hints))])

    async def store_recovered(self, spec: cpb.ShardSpec, hints: FSMHints) -> None:
        """Store hints a primary recovered into `.backup.0`, rotating the older backups."""
        backups = _keys(spec, hints)[1:]
        for _ in range(ROTATE_ATTEMPTS_MAX):
            _, stored = await self._read(spec)
            compares: list[Compare] = []
            ops: list[Op] = []
            value: bytes | None = encode_hints_json(hints)
            for key, kv in zip(backups, stored[1:], strict=True):
                if value is None:
                    break  # Nothing to rotate into this slot (the one before was empty).
                ops.append(OpPut(key.encode(), value))
                revision = 0 if kv is None else kv.mod_revision
                compares.append(
                    Compare(key.encode(), CompareTarget.MOD, CompareResult.EQUAL, revision)
                )
                value = None if kv is None else kv.value
            if not ops:
                return  # The spec keeps no backups.
            if (await self.backend.txn(compares, ops)).succeeded:
                return
        raise HintsError(
            f"{spec.id}: backup hints kept changing; gave up after {ROTATE_ATTEMPTS_MAX} tries"
        )

    async def _read(self, spec: cpb.ShardSpec) -> tuple[list[str], list[KeyValue | None]]:
        keys = hint_keys(spec)
        response = await self.backend.txn([], [OpGet(key.encode()) for key in keys])
        stored: list[KeyValue | None] = []
        for result in response.results:
            stored.append(result[0] if isinstance(result, tuple) and result else None)
        return keys, stored


def _keys(spec: cpb.ShardSpec, hints: FSMHints) -> list[str]:
    keys = hint_keys(spec)
    if not keys:
        raise HintsError(f"{spec.id}: the shard has no recovery log, so no hints")
    if hints.log != recovery_log(spec):
        raise HintsError(
            f"{spec.id}: hints of log {hints.log!r} are not of its log {recovery_log(spec)!r}"
        )
    return keys


def _checked(spec: cpb.ShardSpec, key: str, value: bytes) -> FSMHints:
    try:
        hints = decode_hints(value)
        FSM.from_hints(hints)
    except (HintsDecodeError, FSMError, ValueError) as err:
        raise HintsError(f"hints at {key}: {err}") from err
    if hints.log != recovery_log(spec):
        raise HintsError(
            f"hints at {key}: log {hints.log!r} is not the shard's {recovery_log(spec)!r}"
        )
    return hints
