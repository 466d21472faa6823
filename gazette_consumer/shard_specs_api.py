"""The Shard RPCs over specs and assignments: List, Apply, Unassign and GetHints.

List. The shards whose labels (plus the meta-label ``id``) match the selector, each with its
spec, the spec's etcd mod and create revisions, its Route (with endpoints) and one ReplicaStatus
per route member, read from the member's KeySpace mirror.

Apply. Upserts and deletions of ShardSpecs in one etcd transaction, each guarded by its
``expect_mod_revision`` (0: the shard must not exist; -1: no check). Every change is validated
first, and a bad one fails the whole request with INVALID_ARGUMENT naming the change and the
field (``ApplyRequest.changes[1].upsert.max_txn_duration: must be > 0s``): nothing is written. A
failed guard answers ETCD_TRANSACTION_FAILED, again with nothing written. A successful Apply
answers once this process's mirror reflects it, so a List that follows sees it. An upsert may
carry ``primary_hints`` (Gazette's field 4): recovery-log hints stored, in the same
transaction, as the shard's primary hints (``<hint_prefix>/<id>.primary``), in the JSON form
Gazette's consumers read. They must be hints of the shard's own recovery log that a player can
use (``recoverylog.fsm.FSM.from_hints``); the shard must have a recovery log.

Unassign. Removes assignments so that the allocator re-assigns (Gazette's rules): always a
FAILED one, and the primary's unless ``only_failed``. All removals are one transaction guarded
by each assignment's mod revision. Unlike Gazette (which ignores them), an unknown shard ID is
answered with SHARD_NOT_FOUND, and nothing is removed: a typo should not pass silently.

GetHints. The recovery-log hints stored under the shard's ``hint_prefix`` (primary, then the
backups, newest first), in either encoding Gazette writes (binary or JSON). Primaries write
them (``hints.py``: recorded hints after commits, recovered hints rotated into the backups); a
shard without a recovery log has none, and the answer is then empty.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Final

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from broker.apply_txn import apply_txn
from broker.keyspace.backend import (
    Backend,
    Compare,
    CompareResult,
    CompareTarget,
    KeySpaceError,
    OpDelete,
    OpGet,
    OpPut,
)
from broker.keyspace.keyspace import KeySpace
from broker.loop_slices import LoopSlices
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol import recorded_op_pb2 as rpb
from broker.protocol.apply_changes import apply_changes_max as apply_changes_max
from broker.protocol.apply_changes import (
    is_upsert,
    validate_changes,
    validate_expect_mod_revision,
)
from broker.protocol.selector import matches
from broker.protocol.validate import (
    ValidationError,
    at,
    validate_label_selector,
    validate_shard_id,
    validate_shard_spec,
)
from broker.read_api import Context
from broker.topology import etcd_header
from gazette_consumer.recoverylog.fsm import FSM, FSMError
from gazette_consumer.shard_spec import recovery_log
from gazette_consumer.topology import (
    FAILED,
    Decoded,
    ShardItem,
    assignment_of,
    lookup_shard,
    shard_assignments,
    shard_items,
    shard_key,
    shard_route,
)

# Assignments one Unassign may remove, for the same reason.
unassign_ops_max: Final = 128
# How long Apply and Unassign wait for the mirror to reflect their own transaction.
apply_revision_wait_s: Final = 10.0


class HintsDecodeError(ValueError):
    """Stored hints that decode neither as binary nor as JSON FSMHints."""


# --- Validation -------------------------------------------------------------------------------


def validate_list_request(request: cpb.ListRequest) -> None:
    with at("selector"):
        validate_label_selector(request.selector)


def validate_apply_request(request: cpb.ApplyRequest) -> None:
    for _ in _validate_apply_changes(request):
        pass


async def validate_apply_request_sliced(request: cpb.ApplyRequest) -> None:
    """validate_apply_request, yielding the event loop between changes now and then: an Apply
    of many large specs is many milliseconds of validation (broker/loop_slices.py)."""
    slices = LoopSlices()
    for _ in _validate_apply_changes(request):
        await slices.next_item()


def _validate_apply_changes(request: cpb.ApplyRequest) -> Iterator[None]:
    """Validates the request's changes, one per step."""
    return validate_changes(request.changes, _validate_change, item="shard")


def _validate_change(change: cpb.ApplyRequest.Change) -> str:
    """Gazette's rules for one change; returns the shard it is about."""
    if not change.HasField("upsert") and change.HasField("primary_hints"):
        raise ValidationError("may be set only with an upsert, not a delete", "primary_hints")
    if is_upsert(change):
        with at("upsert"):
            validate_shard_spec(change.upsert)
        validate_expect_mod_revision(change, upsert=True)
        if change.HasField("primary_hints"):
            with at("primary_hints"):
                _validate_primary_hints(change.upsert, change.primary_hints)
        return change.upsert.id
    with at("delete"):
        validate_shard_id(change.delete)
    validate_expect_mod_revision(change, upsert=False)
    return change.delete


def _validate_primary_hints(spec: cpb.ShardSpec, hints: rpb.FSMHints) -> None:
    """Hints a new primary of ``spec`` can recover from (hints.py would refuse others when the
    shard starts: better to refuse them here, with nothing written)."""
    if not spec.recovery_log_prefix:
        raise ValidationError("the shard has no recovery log (recovery_log_prefix), so no hints")
    if hints.log != recovery_log(spec):
        raise ValidationError(
            f"must be hints of the shard's recovery log {recovery_log(spec)!r} (got {hints.log!r})",
            "log",
        )
    for node in hints.live_nodes:
        for segment in node.segments:
            if segment.log == hints.log:
                # Gazette's rule: a segment of the hints' own log leaves its log implied.
                raise ValidationError("a segment repeats the hints' log (leave it empty)")
    try:
        FSM.from_hints(hints)
    except (FSMError, ValueError) as err:
        raise ValidationError(str(err)) from None


def encode_hints_json(hints: rpb.FSMHints) -> bytes:
    """FSMHints as Gazette's consumers store and read them (Go's encoding/json of the generated
    struct: snake_case names, integers as numbers, zero scalars omitted, empty lists null)."""

    def segment(s: rpb.Segment) -> dict[str, object]:
        fields = (
            ("author", s.author),
            ("first_seq_no", s.first_seq_no),
            ("first_offset", s.first_offset),
            ("first_checksum", s.first_checksum),
            ("last_seq_no", s.last_seq_no),
            ("last_offset", s.last_offset),
            ("log", s.log),
        )
        return {name: value for name, value in fields if value}

    out: dict[str, object] = {}
    if hints.log:
        out["log"] = hints.log
    out["live_nodes"] = [
        {
            **({"fnode": node.fnode} if node.fnode else {}),
            "segments": [segment(s) for s in node.segments] or None,
        }
        for node in hints.live_nodes
    ] or None
    out["properties"] = [
        {name: value for name, value in (("path", p.path), ("content", p.content)) if value}
        for p in hints.properties
    ] or None
    return json.dumps(out, separators=(",", ":"), ensure_ascii=False).encode()


def validate_unassign_request(request: cpb.UnassignRequest) -> None:
    if not request.shards:
        raise ValidationError("must name at least one shard", "shards")
    if len(request.shards) > unassign_ops_max:
        raise ValidationError(
            f"must name at most {unassign_ops_max} shards (got {len(request.shards)})", "shards"
        )
    for index, shard in enumerate(request.shards):
        with at(f"shards[{index}]"):
            validate_shard_id(shard)


def validate_get_hints_request(request: cpb.GetHintsRequest) -> None:
    with at("shard"):
        validate_shard_id(request.shard)


# --- The handlers -----------------------------------------------------------------------------


class ShardSpecsAPI:
    """List, Apply, Unassign and GetHints over a member's KeySpace mirror (kept current by the
    member's watch) and its etcd backend. ``process_id`` is this member's, for headers."""

    def __init__(
        self,
        ks: KeySpace[Decoded],
        backend: Backend,
        root: str,
        process_id: pb.ProcessSpec.ID,
        *,
        revision_wait_s: float = apply_revision_wait_s,
    ) -> None:
        self._ks = ks
        self._backend = backend
        self._root = root
        self._process_id = process_id
        self._revision_wait_s = revision_wait_s

    def _header(self, revision: int | None = None) -> pb.Header:
        # Not about one shard: no route (Gazette's "unrouted" header).
        header = pb.Header(route=pb.Route(primary=-1), etcd=etcd_header(self._ks.header))
        header.process_id.CopyFrom(self._process_id)
        if revision is not None:
            header.etcd.revision = revision
        return header

    # --- List ---

    def snapshot(self, selector: pb.LabelSelector) -> list[cpb.ListResponse.Shard]:
        """The shards ``selector`` matches now, in ID order."""
        out: list[cpb.ListResponse.Shard] = []
        for entry in shard_items(self._ks, self._root):
            item = entry.decoded
            assert isinstance(item, ShardItem)
            if not matches(selector, item.spec.labels, meta=gl.shard_meta_labels(item.id)):
                continue
            route, statuses = shard_route(self._ks, self._root, item.id)
            out.append(
                cpb.ListResponse.Shard(
                    spec=item.spec,
                    mod_revision=entry.kv.mod_revision,
                    create_revision=entry.kv.create_revision,
                    route=route,
                    status=statuses,
                )
            )
        return out

    async def list_shards(self, request: cpb.ListRequest, context: Context) -> cpb.ListResponse:
        try:
            validate_list_request(request)
        except ValidationError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"ListRequest.{err}")
        return cpb.ListResponse(
            status=cpb.OK, header=self._header(), shards=self.snapshot(request.selector)
        )

    # --- Apply ---

    async def apply(self, request: cpb.ApplyRequest, context: Context) -> cpb.ApplyResponse:
        try:
            await validate_apply_request_sliced(request)
        except ValidationError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"ApplyRequest.{err}")
        compares: list[Compare] = []
        ops: list[OpPut | OpDelete] = []
        for change in request.changes:
            if change.HasField("upsert"):
                key = shard_key(self._root, change.upsert.id).encode()
                ops.append(OpPut(key, change.upsert.SerializeToString()))
                if change.HasField("primary_hints"):
                    hints_key = hint_keys(change.upsert)[0].encode()
                    ops.append(OpPut(hints_key, encode_hints_json(change.primary_hints)))
            else:
                key = shard_key(self._root, change.delete).encode()
                ops.append(OpDelete(key))
            if change.expect_mod_revision != -1:
                compares.append(
                    Compare(key, CompareTarget.MOD, CompareResult.EQUAL, change.expect_mod_revision)
                )
        succeeded, revision = await self._transact(compares, ops, context)
        status = cpb.OK if succeeded else cpb.ETCD_TRANSACTION_FAILED
        return cpb.ApplyResponse(status=status, header=self._header(revision))

    async def _transact(
        self, compares: list[Compare], ops: list[OpPut | OpDelete], context: Context
    ) -> tuple[bool, int]:
        """Run one guarded transaction; once it applied, wait until the mirror shows it."""
        return await apply_txn(
            self._backend, self._ks, compares, ops, context,
            revision_wait_s=self._revision_wait_s, viewer="this consumer",
        )  # fmt: skip

    # --- Unassign ---

    async def unassign(
        self, request: cpb.UnassignRequest, context: Context
    ) -> cpb.UnassignResponse:
        try:
            validate_unassign_request(request)
        except ValidationError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"UnassignRequest.{err}")
        compares: list[Compare] = []
        ops: list[OpPut | OpDelete] = []
        unassigned: list[str] = []
        for shard in dict.fromkeys(request.shards):
            if lookup_shard(self._ks, self._root, shard) is None:
                return cpb.UnassignResponse(status=cpb.SHARD_NOT_FOUND, shards=[shard])
            for entry in shard_assignments(self._ks, self._root, shard):
                a = assignment_of(entry)
                if a.status.code != FAILED and (request.only_failed or a.slot != 0):
                    continue
                compares.append(
                    Compare(
                        entry.kv.key, CompareTarget.MOD, CompareResult.EQUAL, entry.kv.mod_revision
                    )
                )
                ops.append(OpDelete(entry.kv.key))
                if not unassigned or unassigned[-1] != shard:
                    unassigned.append(shard)
        if len(ops) > unassign_ops_max:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"UnassignRequest.shards: would remove {len(ops)} assignments, more than"
                f" {unassign_ops_max} in one transaction; unassign fewer shards at once",
            )
        if request.dry_run or not ops:
            return cpb.UnassignResponse(status=cpb.OK, shards=unassigned)
        succeeded, _ = await self._transact(compares, ops, context)
        if not succeeded:
            return cpb.UnassignResponse(status=cpb.ETCD_TRANSACTION_FAILED)
        return cpb.UnassignResponse(status=cpb.OK, shards=unassigned)

    # --- GetHints ---

    async def get_hints(
        self, request: cpb.GetHintsRequest, context: Context
    ) -> cpb.GetHintsResponse:
        try:
            validate_get_hints_request(request)
        except ValidationError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"GetHintsRequest.{err}")
        entry = lookup_shard(self._ks, self._root, request.shard)
        if entry is None or not isinstance(entry.decoded, ShardItem):
            return cpb.GetHintsResponse(status=cpb.SHARD_NOT_FOUND, header=self._header())
        spec = entry.decoded.spec
        response = cpb.GetHintsResponse(status=cpb.OK, header=self._header())
        keys = hint_keys(spec)
        if not keys:
            return response  # No recovery log: no hints.
        try:
            txn = await self._backend.txn([], [OpGet(k.encode()) for k in keys])
        except KeySpaceError as err:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"reading hints: {err}")
        found: list[cpb.GetHintsResponse.ResponseHints] = []
        for key, result in zip(keys, txn.results, strict=True):
            hints = cpb.GetHintsResponse.ResponseHints()
            if isinstance(result, tuple) and result:
                try:
                    hints.hints.CopyFrom(decode_hints(result[0].value))
                except HintsDecodeError as err:
                    await context.abort(grpc.StatusCode.DATA_LOSS, f"hints at {key}: {err}")
            found.append(hints)
        response.primary_hints.CopyFrom(found[0])
        response.backup_hints.extend(found[1:])
        response.header.etcd.revision = txn.header.revision
        return response


def hint_keys(spec: cpb.ShardSpec) -> list[str]:
    """Gazette's etcd keys of a shard's hints: primary, then each backup (newest first); none
    without a recovery log."""
    if not spec.recovery_log_prefix:
        return []
    base = f"{spec.hint_prefix}/{spec.id}"
    return [f"{base}.primary"] + [f"{base}.backup.{i}" for i in range(spec.hint_backups)]


def decode_hints(value: bytes) -> rpb.FSMHints:
    """FSMHints as Gazette stores them: JSON if the value opens with '{', else binary."""
    hints = rpb.FSMHints()
    try:
        if value[:1] == b"{":
            json_format.Parse(value.decode(), hints)
        else:
            hints.MergeFromString(value)
    except (DecodeError, json_format.ParseError, UnicodeDecodeError) as err:
        raise HintsDecodeError(f"not FSMHints: {err}") from err
    return hints
