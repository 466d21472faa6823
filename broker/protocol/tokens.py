"""Tokens and paths: the alphabets and lengths of names in Gazette (zones, suffixes, shard IDs,
label names and values, journal names), as Gazette's ValidateToken and ValidatePathComponent
check them (broker/protocol/validator.go).

Labels are validated by the thousand, so the alphabet is checked in one pass of C code (a
translate of ASCII text, a regular expression otherwise), and the character-by-character walk
runs only to name what is wrong.
"""

from __future__ import annotations

import functools
import re
import string
import unicodedata

from broker.protocol.validation_error import ValidationError
from broker.protocol.validation_error import quote as _quote

# Journal names (and the path postfixes appended to them) are path tokens of this length.
JOURNAL_NAME_LEN_MIN, JOURNAL_NAME_LEN_MAX = 4, 512

# Symbols allowed in tokens (zones, suffixes, shard IDs, label names) besides Unicode letters and
# numbers. Every rune <= '#' (35) is excluded on purpose: '#' separates the fields of allocator
# keys in etcd, so a token must never contain it, nor anything that sorts before it.
TOKEN_SYMBOLS = "-_+/."
# Path components (journal names, label values) also allow '=' (Hive-style "key=value" parts)
# and '%' (so that URL-encoded text is a valid value).
PATH_SYMBOLS = TOKEN_SYMBOLS + "=%"


def is_letter_or_number(ch: str) -> bool:
    # Go's unicode.IsLetter / unicode.IsNumber: general categories L* and N*.
    return unicodedata.category(ch)[0] in ("L", "N")


def validate_token(value: str, min_len: int, max_len: int, symbols: str = TOKEN_SYMBOLS) -> None:
    """A token is [min_len, max_len] UTF-8 bytes of Unicode letters, numbers and `symbols`.

    Length is in bytes, not characters, as Gazette measures it (Go's len of a string)."""
    size = utf8_len(value)
    if not min_len <= size <= max_len:
        raise ValidationError(
            f"length must be in [{min_len}, {max_len}] bytes (got {size}: {_quote(value)})"
        )
    if in_alphabet(value, symbols):
        return
    for index, ch in enumerate(value):
        if not is_letter_or_number(ch) and ch not in symbols:
            raise ValidationError(
                f"must be only letters, numbers and {_quote(symbols)}"
                f" (got {_quote(value)}: {ch!r} at index {index})"
            )


def utf8_len(value: str) -> int:
    # "surrogatepass": a lone surrogate (possible in text from YAML, never from the wire) is
    # then refused as a character, rather than failing the length with an encoding error.
    return len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass"))


@functools.cache
def _token_pattern(symbols: str) -> re.Pattern[str]:
    """The alphabet of tokens as one regular expression, so that a token is checked in one pass
    of C code rather than a Python call per character (labels are validated by the thousand).

    `\\w` of a str pattern is exactly the characters of is_letter_or_number, plus '_': both
    read Python's Unicode database (tests/broker/protocol/test_protocol_limits.py checks every
    code point). '_' is excluded unless `symbols` has it."""
    escaped = re.escape(symbols)
    if "_" in symbols:
        return re.compile(f"[\\w{escaped}]*")
    if not symbols:
        return re.compile("[^\\W_]*")
    return re.compile(f"(?:[^\\W_]|[{escaped}])*")


@functools.cache
def ascii_alphabet(symbols: str) -> bytes:
    # ASCII's letters and numbers are exactly its Unicode letters and numbers.
    return (string.ascii_letters + string.digits + symbols).encode("ascii")


def in_alphabet(value: str, symbols: str) -> bool:
    """Whether `value` holds only letters, numbers and `symbols`. ASCII text (nearly all) is
    checked by deleting its allowed bytes, several times faster than any pattern match."""
    if value.isascii():
        return not value.encode("ascii").translate(None, ascii_alphabet(symbols))
    return _token_pattern(symbols).fullmatch(value) is not None


def is_token(value: str, min_len: int, max_len: int, symbols: str) -> bool:
    """Whether validate_token would accept `value` (without building its error)."""
    return min_len <= utf8_len(value) <= max_len and in_alphabet(value, symbols)


def go_path_clean(path: str) -> str:
    """Go's path.Clean: the shortest lexically equivalent slash-separated path.

    posixpath.normpath differs in corner cases ("" is ".", a leading "//" is kept), so Gazette's
    rule "a name equals its cleaned form" needs Go's exact function."""
    if path == "":
        return "."
    rooted = path.startswith("/")
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts and parts[-1] != "..":
                parts.pop()
            elif not rooted:
                parts.append("..")
            continue
        parts.append(part)
    cleaned = ("/" if rooted else "") + "/".join(parts)
    return cleaned or "."


def validate_path_component(value: str, min_len: int, max_len: int) -> None:
    """A token over PATH_SYMBOLS which is a clean (path.Clean), non-rooted path.

    Note Gazette's rule admits a leading "../" (it survives cleaning); anything joining such a
    path under a root directory must guard against escaping it."""
    validate_token(value, min_len, max_len, PATH_SYMBOLS)
    if value == "":
        return
    cleaned = go_path_clean(value)
    if cleaned != value:
        raise ValidationError(
            f"must be a clean path, equal to its normalized form {_quote(cleaned)}"
            f" (got {_quote(value)})"
        )
    if value.startswith("/"):
        raise ValidationError(f"must not begin with '/' (got {_quote(value)})")
