"""ValidationError: bad input, with the path of the offending field.

Every validator of the protocol raises it (broker/protocol/validate.py and the modules it draws
on): the message starts with the path of the field, then names the rule and the value that broke
it, so that a user can find what to fix:

    fragment.length: must be in [1024, 17179869184] (got 12)

Validators of nested messages raise with paths relative to their own message; callers prefix
their own field name with `at("fragment")` as the error bubbles out (Gazette's ExtendContext).
"""

from __future__ import annotations

from types import TracebackType
from typing import Any


class ValidationError(ValueError):
    """Bad input. `context` is the field path from the validated message down to the offending
    field; `rule` says what was required and what was found."""

    def __init__(self, rule: str, *context: str) -> None:
        self.rule = rule
        self.context: tuple[str, ...] = context
        super().__init__(self._render())

    def _render(self) -> str:
        if not self.context:
            return self.rule
        return _join_path(self.context) + ": " + self.rule

    def __str__(self) -> str:
        return self._render()

    @property
    def path(self) -> str:
        return _join_path(self.context)

    def extend(self, segment: str) -> ValidationError:
        """Prefix `segment` to the context path (in place), and return self for re-raising."""
        self.context = (segment, *self.context)
        self.args = (self._render(),)
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception pickling replays __init__(*args); ours would lose the context. Rebuild from
        # the instance state instead, so errors survive a trip across processes (Spark workers).
        return (_restore_error, (type(self), dict(self.__dict__)))


def _restore_error(cls: type[ValidationError], state: dict[str, Any]) -> ValidationError:
    err = cls.__new__(cls)
    err.__dict__.update(state)
    err.args = (err._render(),)
    return err


def _join_path(context: tuple[str, ...]) -> str:
    # Index segments ("[3]") attach to the field before them without a dot: "labels[3].name".
    out = ""
    for segment in context:
        if out and not segment.startswith("["):
            out += "."
        out += segment
    return out


class at:  # Lower case: used as a function, `with at("fragment"):`.
    """Prefix `segment` to the path of any ValidationError raised inside the block.

    A class rather than a @contextmanager generator: validators of the append path enter
    several per request, and a generator-based one costs a few microseconds each."""

    __slots__ = ("_segment",)

    def __init__(self, segment: str) -> None:
        self._segment = segment

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Returning None re-raises the error, its path extended.
        if isinstance(exc, ValidationError):
            exc.extend(self._segment)


def quote(value: str) -> str:
    # Long values are cut so a message stays readable; the head is what a user recognizes.
    shown_chars_max = 80
    if len(value) > shown_chars_max:
        value = value[:shown_chars_max] + "..."
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def check_range(value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise ValidationError(f"must be in [{low}, {high}] (got {value})")


def check_min(value: int, low: int) -> None:
    if value < low:
        raise ValidationError(f"must be >= {low} (got {value})")


def check_count(count: int, what: str, limit_name: str, limit: int) -> None:
    """A count a request controls, within its named limit (broker/protocol/limits.py): the
    message names the limit, so that a user knows which documented bound was hit."""
    if count > limit:
        raise ValidationError(f"{count} {what} exceed {limit_name} ({limit})")
