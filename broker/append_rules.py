"""The rules of appends that need no machine: journal flags and replication, register updates,
content messages, the etcd update that advertises a synchronised route, and finishing a step
despite cancellation. The append machine (append_fsm.py) applies them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from broker.keyspace.backend import Backend, Compare, CompareResult, CompareTarget, OpPut
from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol.validate import ValidationError
from broker.resolver import Resolution
from broker.topology import advertised_value, assignment_of, routes_equivalent

T = TypeVar("T")


def may_write(spec: pb.JournalSpec) -> bool:
    """Whether the journal's flags allow appending content (NOT_SPECIFIED means read-write)."""
    flags = spec.flags
    return flags == pb.JournalSpec.NOT_SPECIFIED or bool(
        flags & (pb.JournalSpec.O_WRONLY | pb.JournalSpec.O_RDWR)
    )


def desired_replication(spec: pb.JournalSpec) -> int:
    """Replicas the journal should have: fewer while it is suspended."""
    level = spec.suspend.level
    if level == pb.JournalSpec.Suspend.FULL:
        return 0
    if level == pb.JournalSpec.Suspend.PARTIAL:
        return 1
    return spec.replication


def subtract_registers(registers: pb.LabelSet, subtract: pb.LabelSet) -> pb.LabelSet:
    """Gazette's SubtractLabelSet: drop every label of a name whose values in ``subtract`` are
    exactly its values in ``registers`` (so "owner=a" removes owner=a, but not owner=b)."""

    def groups(label_set: pb.LabelSet) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for label in label_set.labels:
            out.setdefault(label.name, []).append(label.value)
        return out

    theirs = groups(subtract)
    out = pb.LabelSet()
    for name, values in groups(registers).items():
        if theirs.get(name) != values:
            out.labels.extend(pb.Label(name=name, value=v) for v in values)
    return out


def apply_register_updates(registers: pb.LabelSet, req: pb.AppendRequest) -> pb.LabelSet:
    """The registers after a committed, non-empty append: subtract, then union (request values
    win on a shared name), as Gazette orders them."""
    out = pb.LabelSet()
    out.CopyFrom(registers)
    if req.HasField("subtract_registers"):
        out = subtract_registers(out, req.subtract_registers)
    if req.HasField("union_registers"):
        out = gl.union(req.union_registers, out)
    return out


def assignment_creations(resolved: Resolution) -> frozenset[tuple[bytes, int]]:
    return frozenset((e.kv.key, e.kv.create_revision) for e in resolved.assignments)


def has_register_updates(req: pb.AppendRequest) -> bool:
    return bool(req.union_registers.labels) or bool(req.subtract_registers.labels)


def validate_content_chunk(req: pb.AppendRequest) -> None:
    """A message after the first carries content only (or nothing: the commit marker)."""
    for name in ("header", "check_registers", "union_registers", "subtract_registers"):
        if req.HasField(name):
            raise ValidationError("unexpected after the first message", name)
    if req.journal:
        raise ValidationError("unexpected after the first message", "journal")
    if req.do_not_proxy:
        raise ValidationError("unexpected after the first message", "do_not_proxy")
    if req.offset:
        raise ValidationError("unexpected after the first message", "offset")


async def update_assignments(backend: Backend, resolved: Resolution) -> int:
    """Advertise ``resolved.route`` as the value of every assignment of the journal, in one
    transaction that holds only if none of them changed since the resolution. Returns the
    revision to read through (0 if nothing needed updating).

    The transaction may lose a race (e.g. with the allocator removing an assignment): that is
    normal, and re-resolving at the returned revision converges."""
    route = resolved.route
    value = advertised_value(route)
    compares: list[Compare] = []
    ops: list[OpPut] = []
    for entry in resolved.assignments:
        advertised = assignment_of(entry).route
        if advertised is None or not routes_equivalent(route, advertised):
            # Keep the key's lease: the assignment must still vanish with its member.
            ops.append(OpPut(entry.kv.key, value, lease=entry.kv.lease))
        compares.append(
            Compare(entry.kv.key, CompareTarget.MOD, CompareResult.EQUAL, entry.kv.mod_revision)
        )
    if not ops:
        return 0
    resp = await backend.txn(compares, ops)
    return resp.header.revision


async def complete_despite_cancellation(aw: Awaitable[T]) -> T:
    """Run ``aw`` to completion even if the caller is cancelled meanwhile, then re-raise the
    cancellation. For the steps that keep the pipeline consistent (a rollback, reading
    acknowledgements): abandoning them half-way would leave responses unread that the next
    append would then take for its own. Every wait inside them is bounded."""
    task = asyncio.ensure_future(aw)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError()
    return result
