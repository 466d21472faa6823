"""What a keyspace request may be: the checks the MVCC core runs before it changes anything.

Split from mvcc.py so that the core reads as the store it is; every check here is pure (it sees
the request and the limits, never the store's state), so a request that fails one changed
nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from broker.keyspace.backend import (
    Compare,
    CompareResult,
    CompareTarget,
    KeySpaceError,
    Op,
    OpDelete,
    OpGet,
    OpPut,
)


class InvalidRequestError(KeySpaceError):
    """The request is malformed (empty key, duplicate keys in a txn branch, too many operations,
    too large, wrong compare value type...). Nothing was changed."""


def in_range(candidate: bytes, key: bytes, range_end: bytes | None) -> bool:
    """Whether ``candidate`` lies in etcd's range [key, range_end): just ``key`` when range_end
    is None, everything from ``key`` on when it is ``b"\\x00"``."""
    if range_end is None:
        return candidate == key
    if range_end == b"\x00":
        return candidate >= key
    return key <= candidate < range_end


def check_key(what: str, key: bytes) -> None:
    if not key:
        raise InvalidRequestError(f"{what}: key is empty")


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """etcd's request limits: operations per txn branch, and key plus value bytes a request."""

    txn_ops_max: int
    request_bytes_max: int

    def check_put(self, op: OpPut) -> None:
        check_key("put", op.key)
        if op.lease < 0:
            raise InvalidRequestError(f"put {op.key!r}: lease must be >= 0 (got {op.lease})")
        size = len(op.key) + len(op.value)
        if size > self.request_bytes_max:
            raise InvalidRequestError(
                f"put {op.key!r}: request of {size} bytes exceeds {self.request_bytes_max}"
            )

    def check_txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op]
    ) -> None:
        for name, items in (("compares", compares), ("success", success), ("failure", failure)):
            if len(items) > self.txn_ops_max:
                raise InvalidRequestError(
                    f"txn {name}: {len(items)} operations exceed the limit of {self.txn_ops_max}"
                )
        for i, c in enumerate(compares):
            check_key(f"txn compares[{i}]", c.key)
            wants_bytes = c.target == CompareTarget.VALUE
            if isinstance(c.value, bytes) != wants_bytes or isinstance(c.value, bool):
                raise InvalidRequestError(
                    f"txn compares[{i}]: a {c.target.name} compare needs "
                    f"{'bytes' if wants_bytes else 'an int'} (got {type(c.value).__name__})"
                )
        size = sum(
            len(c.key) + (len(c.value) if isinstance(c.value, bytes) else 0) for c in compares
        )
        for name, ops in (("success", success), ("failure", failure)):
            size += self._check_branch(name, ops)
        if size > self.request_bytes_max:
            raise InvalidRequestError(
                f"txn: request of {size} bytes exceeds {self.request_bytes_max}"
            )

    def _check_branch(self, name: str, ops: Sequence[Op]) -> int:
        """Validate one branch; returns its key and value bytes. As etcd does, refuse a branch
        that writes one key twice (or puts a key it also deletes): the outcome would depend on
        op order within one revision, which watchers cannot see."""
        size = 0
        puts: set[bytes] = set()
        deletes: list[OpDelete] = []
        for i, op in enumerate(ops):
            what = f"txn {name}[{i}]"
            if isinstance(op, OpPut):
                self.check_put(op)
                if op.key in puts:
                    raise InvalidRequestError(f"{what}: duplicate key {op.key!r} in one branch")
                puts.add(op.key)
                size += len(op.key) + len(op.value)
            elif isinstance(op, OpDelete):
                check_key(what, op.key)
                deletes.append(op)
                size += len(op.key) + len(op.range_end or b"")
            elif isinstance(op, OpGet):
                check_key(what, op.key)
                size += len(op.key) + len(op.range_end or b"")
            else:
                raise InvalidRequestError(
                    f"{what}: expected OpPut, OpDelete or OpGet (got {type(op).__name__})"
                )
        for d in deletes:
            for k in puts:
                if in_range(k, d.key, d.range_end):
                    raise InvalidRequestError(
                        f"txn {name}: key {k!r} is both put and deleted in one branch"
                    )
        return size


def holds(actual: int | bytes, result: CompareResult, expected: int | bytes) -> bool:
    """Whether ``actual <result> expected`` (a txn compare's outcome)."""
    if isinstance(actual, bytes) and isinstance(expected, bytes):
        sign = (actual > expected) - (actual < expected)
    elif isinstance(actual, int) and isinstance(expected, int):
        sign = (actual > expected) - (actual < expected)
    else:  # The txn checks rule this out; keep the store's state safe if they are bypassed.
        raise InvalidRequestError(f"compare: cannot compare {actual!r} with {expected!r}")
    match result:
        case CompareResult.EQUAL:
            return sign == 0
        case CompareResult.NOT_EQUAL:
            return sign != 0
        case CompareResult.GREATER:
            return sign > 0
        case CompareResult.LESS:
            return sign < 0
    raise InvalidRequestError(f"compare: unknown result {result!r}")
