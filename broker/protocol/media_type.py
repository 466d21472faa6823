"""Validation of RFC 1521 media types, as Go's mime.ParseMediaType accepts them (the value of a
journal's content-type label)."""

from __future__ import annotations

from broker.protocol.validation_error import ValidationError
from broker.protocol.validation_error import quote as _quote

_TSPECIALS = frozenset('()<>@,;:\\"/[]?=')


def _is_token_char(ch: str) -> bool:
    return " " < ch < "\x7f" and ch not in _TSPECIALS


def _consume_token(text: str) -> tuple[str, str]:
    end = 0
    while end < len(text) and _is_token_char(text[end]):
        end += 1
    return text[:end], text[end:]


def _consume_param_value(text: str) -> tuple[str, str] | None:
    """A token or a quoted-string; None if neither is well-formed."""
    if not text.startswith('"'):
        token, rest = _consume_token(text)
        return (token, rest) if token else None
    index = 1
    out: list[str] = []
    while index < len(text):
        ch = text[index]
        if ch == '"':
            return "".join(out), text[index + 1 :]
        if ch == "\\" and index + 1 < len(text):
            index += 1
            ch = text[index]
        elif ch in "\r\n":
            return None
        out.append(ch)
        index += 1
    return None  # Unterminated.


def validate_media_type(text: str) -> None:
    """RFC 1521 media type with parameters, as Go's mime.ParseMediaType accepts it:
    `type[/subtype] *(; attribute=value)`, a trailing ';' tolerated, no duplicate attributes."""
    base, separator, params = text.partition(";")
    kind, rest = _consume_token(base.strip().lower())
    if not kind:
        raise ValidationError(f"must have a media type (got {_quote(text)})")
    if rest:
        if not rest.startswith("/"):
            raise ValidationError(f"expected '/' after the media type (got {_quote(text)})")
        subtype, rest = _consume_token(rest[1:])
        if not subtype:
            raise ValidationError(f"expected a subtype after '/' (got {_quote(text)})")
        if rest:
            raise ValidationError(f"unexpected text after the media subtype (got {_quote(text)})")
    _validate_media_params(text, separator + params)


def _validate_media_params(text: str, rest: str) -> None:
    seen: set[str] = set()
    while True:
        rest = rest.lstrip()
        if not rest:
            return
        if not rest.startswith(";"):
            raise ValidationError(f"has an invalid media parameter (got {_quote(text)})")
        key, after = _consume_token(rest[1:].lstrip())
        if not key:
            if rest.strip() == ";":
                return  # A trailing ';' is tolerated.
            raise ValidationError(f"has an invalid media parameter (got {_quote(text)})")
        after = after.lstrip()
        if not after.startswith("="):
            raise ValidationError(f"has an invalid media parameter (got {_quote(text)})")
        consumed = _consume_param_value(after[1:].lstrip())
        if consumed is None:
            raise ValidationError(f"has an invalid media parameter (got {_quote(text)})")
        if key.lower() in seen:
            raise ValidationError(f"has a duplicate parameter {_quote(key)} (got {_quote(text)})")
        seen.add(key.lower())
        rest = consumed[1]
