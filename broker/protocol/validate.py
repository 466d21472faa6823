"""Boundary validation of names, labels and specs, with Gazette's exact rules.

Input from the wire, etcd or a user is validated once, here, and inner code trusts it
(DESIGN.md §3.10). Every failure is a `ValidationError` whose message starts with the path of the
offending field, then names the rule and the value that broke it:

    fragment.length: must be in [1024, 17179869184] (got 12)

Validators of nested messages raise with paths relative to their own message; callers prefix
their own field name with `at("fragment")` as the error bubbles out (Gazette's ExtendContext).

The bounds and alphabets are Gazette's (broker/protocol/validator.go, *_extensions.go,
fragment_store.go, endpoint.go and consumer/protocol/shard_spec_extensions.go), because a spec
one implementation accepts must be accepted by the other: they share etcd.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from broker.protocol import consumer_pb2 as cpb
from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb

# Symbols allowed in tokens (zones, suffixes, shard IDs, label names) besides Unicode letters and
# numbers. Every rune <= '#' (35) is excluded on purpose: '#' separates the fields of allocator
# keys in etcd, so a token must never contain it, nor anything that sorts before it.
TOKEN_SYMBOLS = "-_+/."
# Path components (journal names, label values) also allow '=' (Hive-style "key=value" parts)
# and '%' (so that URL-encoded text is a valid value).
PATH_SYMBOLS = TOKEN_SYMBOLS + "=%"

LABEL_NAME_LEN_MIN, LABEL_NAME_LEN_MAX = 2, 64
LABEL_VALUE_LEN_MAX = 1024
JOURNAL_NAME_LEN_MIN, JOURNAL_NAME_LEN_MAX = 4, 512
ZONE_LEN_MIN, ZONE_LEN_MAX = 1, 32
PROCESS_SUFFIX_LEN_MIN, PROCESS_SUFFIX_LEN_MAX = 4, 128
SHARD_ID_LEN_MIN, SHARD_ID_LEN_MAX = 4, 512

FRAGMENT_STORE_SCHEMES = ("s3", "gs", "azure", "azure-ad", "file")


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


@contextmanager
def at(segment: str) -> Iterator[None]:
    """Prefix `segment` to the path of any ValidationError raised inside the block."""
    try:
        yield
    except ValidationError as err:
        err.extend(segment)
        raise


def _quote(value: str) -> str:
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


# --- Tokens and paths ---------------------------------------------------------------------------


def is_letter_or_number(ch: str) -> bool:
    # Go's unicode.IsLetter / unicode.IsNumber: general categories L* and N*.
    return unicodedata.category(ch)[0] in ("L", "N")


def validate_token(value: str, min_len: int, max_len: int, symbols: str = TOKEN_SYMBOLS) -> None:
    """A token is [min_len, max_len] UTF-8 bytes of Unicode letters, numbers and `symbols`.

    Length is in bytes, not characters, as Gazette measures it (Go's len of a string)."""
    size = len(value.encode("utf-8"))
    if not min_len <= size <= max_len:
        raise ValidationError(
            f"length must be in [{min_len}, {max_len}] bytes (got {size}: {_quote(value)})"
        )
    for index, ch in enumerate(value):
        if not is_letter_or_number(ch) and ch not in symbols:
            raise ValidationError(
                f"must be only letters, numbers and {_quote(symbols)}"
                f" (got {_quote(value)}: {ch!r} at index {index})"
            )


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


def split_journal_meta(name: str) -> tuple[str, str]:
    """Split a journal name into (name, ";meta" suffix or "")."""
    index = name.find(";")
    if index == -1:
        return name, ""
    return name[:index], name[index:]


def validate_journal_name(name: str) -> None:
    """A journal name: a clean path of [4, 512] bytes, with an optional ";metadata" segment
    which is itself a clean path of [1, 512] bytes."""
    base, meta = split_journal_meta(name)
    validate_path_component(base, JOURNAL_NAME_LEN_MIN, JOURNAL_NAME_LEN_MAX)
    if meta:
        with at("metadata"):
            validate_path_component(meta[1:], 1, JOURNAL_NAME_LEN_MAX)


def validate_label_fields(name: str, value: str) -> None:
    """A label name is a token of [2, 64] bytes; its value a path-alphabet token of at most
    1024 bytes (it need not be a clean path: values like "a//b" are fine)."""
    with at("name"):
        validate_token(name, LABEL_NAME_LEN_MIN, LABEL_NAME_LEN_MAX)
    with at("value"):
        validate_token(value, 0, LABEL_VALUE_LEN_MAX, PATH_SYMBOLS)


def validate_shard_id(shard_id: str) -> None:
    validate_token(shard_id, SHARD_ID_LEN_MIN, SHARD_ID_LEN_MAX)


# --- URLs ---------------------------------------------------------------------------------------

_CONTROL_CHAR = re.compile(r"[\x00-\x1f\x7f]")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def _parse_url(url: str) -> tuple[str, str, str]:
    """(scheme, host, path) of an absolute URL, refusing what Go's url.Parse refuses and
    urlsplit would let through: control characters and malformed %-escapes."""
    if _CONTROL_CHAR.search(url):
        raise ValidationError(f"must not contain control characters (got {_quote(url)})")
    # Go validates escapes of everything but the raw query; check up to the query.
    if _BAD_ESCAPE.search(url.split("?", 1)[0]):
        raise ValidationError(f"has an invalid %-escape (got {_quote(url)})")
    try:
        parts = urlsplit(url)
    except ValueError as err:  # An unbalanced '[' or ']' of an IPv6 host, for one.
        raise ValidationError(f"must be a valid URL: {err} (got {_quote(url)})") from None
    try:
        parts.port  # noqa: B018 -- evaluated for the ValueError of a malformed port.
    except ValueError:
        raise ValidationError(
            f"must have a numeric port in [0, 65535] (got {_quote(url)})"
        ) from None
    if not parts.scheme:
        raise ValidationError(f"must be an absolute URL with a scheme (got {_quote(url)})")
    host = parts.netloc.rpartition("@")[2]
    return parts.scheme, host, parts.path


def validate_fragment_store(url: str) -> None:
    """A fragment store is an absolute URL of a known scheme whose path ends in '/'."""
    scheme, host, path = _parse_url(url)
    if scheme in ("s3", "gs", "azure"):
        if not host:
            raise ValidationError(f"must name a bucket as the URL host (got {_quote(url)})")
    elif scheme == "azure-ad":
        # azure-ad://<tenant-id>/<storage-account>/<container>/<prefix...>/
        segments = path[1:].split("/")
        if not host:
            raise ValidationError(f"must name a tenant ID as the URL host (got {_quote(url)})")
        if segments[0] == "":
            raise ValidationError(
                f"must name a storage account as the first path segment (got {_quote(url)})"
            )
        if len(segments) < 2 or segments[1] == "":
            raise ValidationError(
                f"must name a storage container as the second path segment (got {_quote(url)})"
            )
    elif scheme == "file":
        if host:
            raise ValidationError(f"must not have a host with the file scheme (got {_quote(url)})")
    else:
        raise ValidationError(
            f"scheme must be one of {', '.join(FRAGMENT_STORE_SCHEMES)} (got {_quote(scheme)})"
        )
    if not path.endswith("/"):
        raise ValidationError(f"path must end in '/' (got {_quote(path)})")


def validate_endpoint(url: str) -> None:
    """An endpoint is an absolute URL with a host (http://host:port, unix://host/path)."""
    _, host, _ = _parse_url(url)
    if not host:
        raise ValidationError(f"must have a host (got {_quote(url)})")


# --- Media types (Go's mime.ParseMediaType) -----------------------------------------------------

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


# --- Labels -------------------------------------------------------------------------------------


def validate_label(label: pb.Label, *, in_selector: bool = False) -> None:
    validate_label_fields(label.name, label.value)
    if label.prefix and not in_selector:
        # A prefix flag only means something to a selector; stored in a spec it would be silently
        # ignored by matching, so refuse it where it cannot apply.
        raise ValidationError("may be set only within a LabelSelector (got true)", "prefix")


def validate_label_set(label_set: pb.LabelSet, *, in_selector: bool = False) -> None:
    """Labels are valid and strictly increasing over (name, value); a name never carries both
    the empty value (which a selector reads as "any value") and a non-empty one."""
    previous: pb.Label | None = None
    for index, label in enumerate(label_set.labels):
        with at(f"labels[{index}]"):
            validate_label(label, in_selector=in_selector)
            if previous is not None:
                _check_label_order(previous, label)
        previous = label


def _check_label_order(previous: pb.Label, label: pb.Label) -> None:
    if (previous.name, previous.value) >= (label.name, label.value):
        raise ValidationError(
            "must be in unique, sorted order over (name, value)"
            f" (got {_quote(label.name)}={_quote(label.value)}"
            f" after {_quote(previous.name)}={_quote(previous.value)})"
        )
    if previous.name == label.name and previous.value == "":
        raise ValidationError(
            "must not mix the empty value with non-empty values of one name"
            f' (got {_quote(label.name)}={_quote(label.value)} after {_quote(label.name)}="")'
        )


def validate_single_value_labels(label_set: pb.LabelSet) -> None:
    """Well-known labels that may have only one value (labels.SINGLE_VALUE_LABELS)."""
    labels = label_set.labels
    for index in range(1, len(labels)):
        label = labels[index]
        if label.name == labels[index - 1].name and label.name in gl.SINGLE_VALUE_LABELS:
            raise ValidationError(
                f"label {_quote(label.name)} may have only one value"
                f" (got {_quote(label.value)} after {_quote(labels[index - 1].value)})",
                f"labels[{index}]",
            )


def validate_label_selector(selector: pb.LabelSelector) -> None:
    with at("include"):
        validate_label_set(selector.include, in_selector=True)
    with at("exclude"):
        validate_label_set(selector.exclude, in_selector=True)


def _check_reserved_labels(label_set: pb.LabelSet, reserved: tuple[str, ...]) -> None:
    for index, label in enumerate(label_set.labels):
        if label.name in reserved:
            raise ValidationError(
                f"must not use reserved label name {_quote(label.name)}",
                f"labels[{index}]",
                "name",
            )


def _first_index(label_set: pb.LabelSet, name: str) -> int | None:
    for index, label in enumerate(label_set.labels):
        if label.name == name:
            return index
    return None


def _validate_journal_label_constraints(label_set: pb.LabelSet) -> None:
    """content-type parses as a media type; message-type requires content-type; message-subtype
    requires message-type (readers pick a framing from content-type, then a decoder from the
    message type, so a type without its framing is unusable)."""
    validate_single_value_labels(label_set)
    content_type = _first_index(label_set, gl.CONTENT_TYPE)
    message_type = _first_index(label_set, gl.MESSAGE_TYPE)
    sub_type = _first_index(label_set, gl.MESSAGE_SUB_TYPE)
    if content_type is not None:
        with at(f"labels[{content_type}]"), at("value"):
            validate_media_type(label_set.labels[content_type].value)
    if message_type is not None:
        if content_type is None:
            raise ValidationError(
                f"label {_quote(gl.MESSAGE_TYPE)} requires label {_quote(gl.CONTENT_TYPE)}",
                f"labels[{message_type}]",
            )
    elif sub_type is not None:
        raise ValidationError(
            f"label {_quote(gl.MESSAGE_SUB_TYPE)} requires label {_quote(gl.MESSAGE_TYPE)}",
            f"labels[{sub_type}]",
        )


# --- Journals and fragments ---------------------------------------------------------------------

JOURNAL_REPLICATION_MAX = 5
FRAGMENT_LENGTH_MIN, FRAGMENT_LENGTH_MAX = 1 << 10, 1 << 34  # 1 KiB .. 16 GiB.
REFRESH_INTERVAL_MIN_NS, REFRESH_INTERVAL_MAX_NS = 1_000_000_000, 86_400_000_000_000  # 1s .. 24h.
FLUSH_INTERVAL_MIN_NS = 60_000_000_000  # 1 minute.
BROKER_JOURNAL_LIMIT_MAX = 1 << 17

_FLAG_VALUES = (
    pb.JournalSpec.NOT_SPECIFIED,
    pb.JournalSpec.O_RDONLY,
    pb.JournalSpec.O_WRONLY,
    pb.JournalSpec.O_RDWR,
)


def _fmt_duration(nanos: int) -> str:
    seconds, fraction = divmod(abs(nanos), 1_000_000_000)
    text = f"{seconds}.{fraction:09d}".rstrip("0").rstrip(".")
    return ("-" if nanos < 0 else "") + text + "s"


def validate_compression_codec(codec: int) -> None:
    codecs = dict(pb.CompressionCodec.items())
    if codec == pb.INVALID or codec not in codecs.values():
        names = ", ".join(name for name in codecs if name != "INVALID")
        shown = next((name for name, value in codecs.items() if value == codec), str(codec))
        raise ValidationError(f"must be one of {names} (got {shown})")


def validate_flags(flags: int) -> None:
    """Exactly one of the access modes, or none (which the broker reads as O_RDWR)."""
    if flags not in _FLAG_VALUES:
        raise ValidationError(
            "must be one of NOT_SPECIFIED (0), O_RDONLY (1), O_WRONLY (2), O_RDWR (4)"
            f" (got {flags})"
        )


def validate_fragment_config(
    fragment: pb.JournalSpec.Fragment, *, check_postfix_template: bool = True
) -> None:
    with at("length"):
        check_range(fragment.length, FRAGMENT_LENGTH_MIN, FRAGMENT_LENGTH_MAX)
    with at("compression_codec"):
        validate_compression_codec(fragment.compression_codec)
    for index, store in enumerate(fragment.stores):
        with at(f"stores[{index}]"):
            validate_fragment_store(store)
            # Offloaded decompression relies on the store honouring Content-Encoding, which a
            # local file system cannot do; only the first store matters, as only it is written.
            if (
                index == 0
                and urlsplit(store).scheme == "file"
                and fragment.compression_codec == pb.GZIP_OFFLOAD_DECOMPRESSION
            ):
                raise ValidationError(
                    f"a file:// store cannot be used with GZIP_OFFLOAD_DECOMPRESSION (got {_quote(store)})"
                )
    refresh_ns = fragment.refresh_interval.ToNanoseconds()
    if not REFRESH_INTERVAL_MIN_NS <= refresh_ns <= REFRESH_INTERVAL_MAX_NS:
        raise ValidationError(
            f"must be in [{_fmt_duration(REFRESH_INTERVAL_MIN_NS)}, {_fmt_duration(REFRESH_INTERVAL_MAX_NS)}]"
            f" (got {_fmt_duration(refresh_ns)})",
            "refresh_interval",
        )
    flush_ns = fragment.flush_interval.ToNanoseconds()
    if flush_ns != 0 and flush_ns < FLUSH_INTERVAL_MIN_NS:
        raise ValidationError(
            f"must be zero (disabled) or >= {_fmt_duration(FLUSH_INTERVAL_MIN_NS)}"
            f" (got {_fmt_duration(flush_ns)})",
            "flush_interval",
        )
    if check_postfix_template:
        with at("path_postfix_template"):
            validate_path_postfix_template(fragment.path_postfix_template)
    # Retention needs no check: every value is meaningful (<= 0 keeps fragments forever).


def validate_journal_spec(spec: pb.JournalSpec, *, check_postfix_template: bool = True) -> None:
    """Gazette's JournalSpec rules. `check_postfix_template=False` is for specs read back from
    etcd: one written by Go's gazctl may use template constructs outside the subset we
    evaluate, and such a journal must still be served (only persisting it fails, loudly)."""
    with at("name"):
        validate_journal_name(spec.name)
        _, meta = split_journal_meta(spec.name)
        if meta:
            raise ValidationError(f"must not have a metadata segment (got {_quote(meta)})")
    with at("replication"):
        check_range(spec.replication, 1, JOURNAL_REPLICATION_MAX)
    with at("labels"):
        validate_label_set(spec.labels)
        # "name" and "prefix" are meta-labels the broker derives from the journal name for
        # selectors; a user label of the same name would shadow them.
        _check_reserved_labels(spec.labels, gl.JOURNAL_RESERVED_LABELS)
        _validate_journal_label_constraints(spec.labels)
    with at("fragment"):
        validate_fragment_config(spec.fragment, check_postfix_template=check_postfix_template)
    with at("flags"):
        validate_flags(spec.flags)
    with at("max_append_rate"):
        check_min(spec.max_append_rate, 0)
    with at("suspend"):
        _validate_suspend(spec.suspend)


def _validate_suspend(suspend: pb.JournalSpec.Suspend) -> None:
    levels = pb.JournalSpec.Suspend.Level
    if suspend.level not in levels.values():
        raise ValidationError(
            f"must be one of {', '.join(levels.keys())} (got {suspend.level})", "level"
        )
    with at("offset"):
        check_min(suspend.offset, 0)


def validate_fragment(fragment: pb.Fragment) -> None:
    with at("journal"):
        validate_journal_name(fragment.journal)
    if fragment.begin > fragment.end:
        raise ValidationError(
            f"must be >= begin (got begin={fragment.begin}, end={fragment.end})", "end"
        )
    with at("compression_codec"):
        validate_compression_codec(fragment.compression_codec)


def validate_offsets(offsets: Mapping[str, int]) -> None:
    """A map of journal to offset (read_through and the like): valid names, offsets >= 0."""
    for journal, offset in offsets.items():
        with at(f"[{journal}]"):
            validate_journal_name(journal)
            check_min(offset, 0)


# --- Path postfix templates ---------------------------------------------------------------------


def validate_path_postfix_template(template: str) -> None:
    """A Go text/template of the subset brokers evaluate (`broker/fragment/postfix.py`), that
    evaluates over Go's zero values, as Gazette checks, to text allowed in a path. Templates
    outside the subset (functions, pipelines, range / with, ...) are refused here, when a spec
    is applied, rather than failing every persist of the journal's fragments later."""
    # Imported here: broker.fragment modules import this one.
    from broker.fragment.postfix import check_template

    check_template(template)


# --- Processes and shards -----------------------------------------------------------------------


def validate_process_spec(spec: pb.ProcessSpec) -> None:
    with at("id"):
        with at("zone"):
            validate_token(spec.id.zone, ZONE_LEN_MIN, ZONE_LEN_MAX)
        with at("suffix"):
            validate_token(spec.id.suffix, PROCESS_SUFFIX_LEN_MIN, PROCESS_SUFFIX_LEN_MAX)
    with at("endpoint"):
        validate_endpoint(spec.endpoint)


def validate_broker_spec(spec: pb.BrokerSpec) -> None:
    with at("process_spec"):
        validate_process_spec(spec.process_spec)
    if spec.journal_limit > BROKER_JOURNAL_LIMIT_MAX:
        raise ValidationError(
            f"must be <= {BROKER_JOURNAL_LIMIT_MAX} (got {spec.journal_limit})", "journal_limit"
        )


def validate_consumer_spec(spec: cpb.ConsumerSpec) -> None:
    with at("process_spec"):
        validate_process_spec(spec.process_spec)
    # shard_limit needs no check: every uint32 is a meaningful limit.


def _is_absolute_clean_path(path: str) -> bool:
    return path.startswith("/") and go_path_clean(path) == path


def validate_shard_spec(spec: cpb.ShardSpec) -> None:
    """Gazette's ShardSpec rules, in Gazette's order (the first failure is reported).

    Note Gazette requires neither a source nor min_txn_duration <= max_txn_duration: a shard
    may serve without reading, and the transaction loop caps its duration at the max anyway."""
    with at("id"):
        validate_shard_id(spec.id)
    if spec.recovery_log_prefix:
        with at("recovery_log_prefix"):
            validate_journal_name(spec.recovery_log_prefix + "/" + spec.id)
        if not _is_absolute_clean_path(spec.hint_prefix):
            raise ValidationError(
                "must be an absolute, clean path when recovery_log_prefix is set"
                f" (got {_quote(spec.hint_prefix)})",
                "hint_prefix",
            )
    elif spec.hint_prefix:
        raise ValidationError(
            f"must be empty when recovery_log_prefix is empty (got {_quote(spec.hint_prefix)})",
            "hint_prefix",
        )
    with at("hint_backups"):
        check_min(spec.hint_backups, 0)
    min_txn_ns = spec.min_txn_duration.ToNanoseconds()
    if min_txn_ns < 0:
        raise ValidationError(
            f"must be >= 0s (got {_fmt_duration(min_txn_ns)})", "min_txn_duration"
        )
    max_txn_ns = spec.max_txn_duration.ToNanoseconds()
    if max_txn_ns <= 0:
        raise ValidationError(f"must be > 0s (got {_fmt_duration(max_txn_ns)})", "max_txn_duration")
    with at("labels"):
        validate_label_set(spec.labels)
        validate_single_value_labels(spec.labels)
        # "id" is the meta-label selectors use to pick a shard by ID.
        _check_reserved_labels(spec.labels, gl.SHARD_RESERVED_LABELS)
    for index, source in enumerate(spec.sources):
        with at(f"sources[{index}]"):
            with at("journal"):
                validate_journal_name(source.journal)
                if index and source.journal <= spec.sources[index - 1].journal:
                    raise ValidationError(
                        "must be in unique, sorted order over sources"
                        f" (got {_quote(source.journal)} after {_quote(spec.sources[index - 1].journal)})"
                    )
            with at("min_offset"):
                check_min(source.min_offset, 0)
    # hot_standbys, disable, disable_wait_for_ack, ring_buffer_size and read_channel_size need
    # no check: every value is meaningful (zero sizes select the defaults).
