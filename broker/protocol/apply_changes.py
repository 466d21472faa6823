"""The rules every Apply request follows, of journals (broker/list_apply_api.py) and of shards
(gazette_consumer/shard_specs_api.py), as Gazette's: at most ``apply_changes_max`` changes;
each an upsert or a delete of one item, never both nor neither; no item changed twice; an
upsert's ``expect_mod_revision`` >= 0 (0: must not exist) or -1 (any), a delete's > 0 or -1.
What an item is, and how its spec or name is checked, is each service's ``validate_change``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Final, Protocol, TypeVar

from broker.protocol.validate import ValidationError, at

# Changes of one Apply request (etcd refuses transactions of more than 128 operations).
apply_changes_max: Final = 128


class Change(Protocol):
    """What the rules read of a journal's or a shard's ApplyRequest.Change."""

    @property
    def expect_mod_revision(self) -> int: ...

    @property
    def delete(self) -> str: ...

    def HasField(self, field_name: str) -> bool: ...


C = TypeVar("C", bound=Change)


def validate_changes(
    changes: Sequence[C], validate_change: Callable[[C], str], *, item: str
) -> Iterator[None]:
    """Validate ``changes`` one per step (so that a caller may yield the event loop between
    them); ``validate_change`` validates one and returns the ``item`` ("journal", "shard") it
    is about."""
    if len(changes) > apply_changes_max:
        raise ValidationError(
            f"must hold at most {apply_changes_max} changes (got {len(changes)});"
            " apply them in batches",
            "changes",
        )
    seen: dict[str, int] = {}
    for index, change in enumerate(changes):
        with at(f"changes[{index}]"):
            name = validate_change(change)
            if name in seen:
                raise ValidationError(
                    f"must not change {item} {name!r} twice (also changes[{seen[name]}])"
                )
            seen[name] = index
        yield


def is_upsert(change: Change) -> bool:
    """Whether ``change`` is an upsert (else a delete); raises unless it is exactly one."""
    if change.HasField("upsert"):
        if change.delete:
            raise ValidationError("both upsert and delete are set (expected exactly one)")
        return True
    if change.delete:
        return False
    raise ValidationError("neither upsert nor delete is set (expected exactly one)")


def validate_expect_mod_revision(change: Change, *, upsert: bool) -> None:
    revision = change.expect_mod_revision
    if upsert and revision < -1:
        raise ValidationError(f"must be >= 0 or -1 (got {revision})", "expect_mod_revision")
    if not upsert and revision <= 0 and revision != -1:
        raise ValidationError(f"must be > 0 or -1 (got {revision})", "expect_mod_revision")
