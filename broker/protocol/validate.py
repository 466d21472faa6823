"""Boundary validation of names, labels and specs, with Gazette's exact rules.

Input from the wire, etcd or a user is validated once, here, and inner code trusts it
(docs/architecture.md, Invariants). Every failure is a `ValidationError` (validation_error.py)
whose message
starts with the path of the offending field, then names the rule and the value that broke it:

    fragment.length: must be in [1024, 17179869184] (got 12)

The bounds and alphabets are Gazette's (broker/protocol/validator.go, *_extensions.go,
fragment_store.go, endpoint.go and consumer/protocol/shard_spec_extensions.go), because a spec
one implementation accepts must be accepted by the other: they share etcd. On top of them, the
counts a request controls (labels per set, sources per shard, ...) are bounded by the named
limits of limits.py, chosen far above any real use of Gazette, so that no one request can make
a broker spend seconds on it (docs/limits.md).

Tokens and paths (tokens.py), URLs (urls.py) and media types (media_type.py) have modules of
their own; their validators are re-exported here, where callers have always found them.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Mapping, Sequence
from typing import Final
from urllib.parse import urlsplit

from google.protobuf.duration_pb2 import Duration

from broker.protocol import consumer_pb2 as cpb
from broker.protocol import labels as gl
from broker.protocol import limits
from broker.protocol import protocol_pb2 as pb
from broker.protocol.media_type import validate_media_type as validate_media_type
from broker.protocol.path_postfix import check_template
from broker.protocol.tokens import JOURNAL_NAME_LEN_MAX as JOURNAL_NAME_LEN_MAX
from broker.protocol.tokens import JOURNAL_NAME_LEN_MIN as JOURNAL_NAME_LEN_MIN
from broker.protocol.tokens import PATH_SYMBOLS as PATH_SYMBOLS
from broker.protocol.tokens import TOKEN_SYMBOLS as TOKEN_SYMBOLS
from broker.protocol.tokens import ascii_alphabet, is_token
from broker.protocol.tokens import go_path_clean as go_path_clean
from broker.protocol.tokens import is_letter_or_number as is_letter_or_number
from broker.protocol.tokens import validate_path_component as validate_path_component
from broker.protocol.tokens import validate_token as validate_token
from broker.protocol.urls import FRAGMENT_STORE_SCHEMES as FRAGMENT_STORE_SCHEMES
from broker.protocol.urls import validate_endpoint as validate_endpoint
from broker.protocol.urls import validate_fragment_store as validate_fragment_store
from broker.protocol.validation_error import ValidationError as ValidationError
from broker.protocol.validation_error import at as at
from broker.protocol.validation_error import check_count as check_count
from broker.protocol.validation_error import check_min as check_min
from broker.protocol.validation_error import check_range as check_range
from broker.protocol.validation_error import quote as _quote

LABEL_NAME_LEN_MIN, LABEL_NAME_LEN_MAX = 2, 64
LABEL_VALUE_LEN_MAX = 1024
ZONE_LEN_MIN, ZONE_LEN_MAX = 1, 32
PROCESS_SUFFIX_LEN_MIN, PROCESS_SUFFIX_LEN_MAX = 4, 128
SHARD_ID_LEN_MIN, SHARD_ID_LEN_MAX = 4, 512


# --- Names --------------------------------------------------------------------------------------


def split_journal_meta(name: str) -> tuple[str, str]:
    """Split a journal name into (name, ";meta" suffix or "")."""
    index = name.find(";")
    if index == -1:
        return name, ""
    return name[:index], name[index:]


def validate_journal_name(name: str) -> None:
    """A journal name: a clean path of [4, 512] bytes, with an optional ";metadata" segment
    which is itself a clean path of [1, 512] bytes."""
    _validate_journal_name(name)


# Valid names are remembered (a bounded LRU; an invalid name raises, which is not cached, so it
# is checked again each time): every append checks its journal's name, and a broker serves a
# bounded set of journals. Checking one costs ~10 us; a hit, a dictionary lookup.
journal_names_remembered_max: Final = 4096


@functools.lru_cache(maxsize=journal_names_remembered_max)
def _validate_journal_name(name: str) -> None:
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


# --- Labels -------------------------------------------------------------------------------------


def validate_label(label: pb.Label, *, in_selector: bool = False) -> None:
    validate_label_fields(label.name, label.value)
    if label.prefix and not in_selector:
        # A prefix flag only means something to a selector; stored in a spec it would be silently
        # ignored by matching, so refuse it where it cannot apply.
        raise ValidationError("may be set only within a LabelSelector (got true)", "prefix")


def validate_label_set(label_set: pb.LabelSet, *, in_selector: bool = False) -> None:
    """At most `labels_per_set_max` labels, valid and strictly increasing over (name, value); a
    name never carries both the empty value (which a selector reads as "any value") and a
    non-empty one.

    Sets of thousands of labels arrive with requests and specs, so the usual case (every label
    ASCII and valid) is checked in bulk, a few passes of C code over all names and values; the
    label-by-label walk, which builds the message naming the first bad one, runs only when the
    bulk check fails."""
    labels = label_set.labels
    check_count(len(labels), "labels", "labels_per_set_max", limits.labels_per_set_max)
    if _is_valid_ascii_label_set(labels, in_selector):
        return
    previous: pb.Label | None = None
    previous_name = previous_value = ""
    for index, label in enumerate(labels):
        name, value = label.name, label.value
        if (
            not is_token(name, LABEL_NAME_LEN_MIN, LABEL_NAME_LEN_MAX, TOKEN_SYMBOLS)
            or not is_token(value, 0, LABEL_VALUE_LEN_MAX, PATH_SYMBOLS)
            or (label.prefix and not in_selector)
        ):
            with at(f"labels[{index}]"):
                validate_label(label, in_selector=in_selector)
        if previous is not None and (
            (previous_name, previous_value) >= (name, value)
            or (previous_name == name and previous_value == "")
        ):
            with at(f"labels[{index}]"):
                _check_label_order(previous, label)
        previous, previous_name, previous_value = label, name, value


def _is_valid_ascii_label_set(labels: Sequence[pb.Label], in_selector: bool) -> bool:
    """Whether every label is ASCII and valid, in order (False: something is not, or is not
    ASCII; validate_label_set then finds what). NUL, which no token may hold, joins the names
    and the values so that one translate() checks each alphabet."""
    if not labels:
        return True
    if not in_selector and any(label.prefix for label in labels):
        return False
    pairs = [(label.name, label.value) for label in labels]
    names = [name for name, _ in pairs]
    values = [value for _, value in pairs]
    joined_names, joined_values = "\0".join(names), "\0".join(values)
    if not (joined_names.isascii() and joined_values.isascii()):
        return False
    separators = len(labels) - 1  # Any other NUL is a label's own: not in any alphabet.
    if joined_names.count("\0") != separators or joined_values.count("\0") != separators:
        return False
    if joined_names.encode("ascii").translate(None, ascii_alphabet(TOKEN_SYMBOLS + "\0")):
        return False
    if joined_values.encode("ascii").translate(None, ascii_alphabet(PATH_SYMBOLS + "\0")):
        return False
    if not (
        LABEL_NAME_LEN_MIN <= min(map(len, names))
        and max(map(len, names)) <= LABEL_NAME_LEN_MAX
        and max(map(len, values)) <= LABEL_VALUE_LEN_MAX
    ):
        return False
    if not all(map(operator.lt, pairs, itertools.islice(pairs, 1, None))):  # Strictly sorted.
        return False
    # In sorted order a name's empty value comes first: a mix is "" followed by the same name.
    return "" not in values or not any(
        value == "" and name == following[0]
        for (name, value), following in itertools.pairwise(pairs)
    )


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


def _check_label_value(label_set: pb.LabelSet, name: str, allowed: tuple[str, ...]) -> None:
    """A well-known label whose value must be one of `allowed`, if present."""
    index = _first_index(label_set, name)
    if index is not None and label_set.labels[index].value not in allowed:
        raise ValidationError(
            f"label {_quote(name)} must be one of "
            f"{', '.join(_quote(value) for value in allowed)}"
            f" (got {_quote(label_set.labels[index].value)})",
            f"labels[{index}]",
            "value",
        )


def _validate_journal_label_constraints(label_set: pb.LabelSet) -> None:
    """replication-mode is a known mode; content-type parses as a media type; message-type requires content-type; message-subtype
    requires message-type (readers pick a framing from content-type, then a decoder from the
    message type, so a type without its framing is unusable)."""
    validate_single_value_labels(label_set)
    _check_label_value(label_set, gl.REPLICATION_MODE, gl.REPLICATION_MODES)
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


# google.protobuf.Duration's own range, +/- 10,000 years (duration.proto).
DURATION_SECONDS_MAX: Final = 315_576_000_000
DURATION_NANOS_MAX: Final = 999_999_999
# Go's time.Duration, an int64 of nanoseconds (about +/- 292 years): every Duration of Gazette's
# protocol is a gogoproto stdduration, which Go decodes into one and refuses if it does not fit.
GO_DURATION_NS_MIN: Final = -(1 << 63)
GO_DURATION_NS_MAX: Final = (1 << 63) - 1


def validate_duration(duration: Duration) -> None:
    """A google.protobuf.Duration Go would decode (gogo types.DurationFromProto): seconds within
    +/- 315576000000, nanos within +/- 999999999 and of the same sign as seconds (or zero), and
    the whole within Go's time.Duration. Anything else is not a duration at all (it does not
    even render as JSON), so it is refused before any check of the value's meaning."""
    seconds, nanos = duration.seconds, duration.nanos
    got = f"(got seconds={seconds}, nanos={nanos})"
    if not -DURATION_SECONDS_MAX <= seconds <= DURATION_SECONDS_MAX:
        raise ValidationError(
            f"seconds must be in [-{DURATION_SECONDS_MAX}, {DURATION_SECONDS_MAX}] {got}"
        )
    if not -DURATION_NANOS_MAX <= nanos <= DURATION_NANOS_MAX:
        raise ValidationError(
            f"nanos must be in [-{DURATION_NANOS_MAX}, {DURATION_NANOS_MAX}] {got}"
        )
    if (seconds < 0 < nanos) or (nanos < 0 < seconds):
        raise ValidationError(f"seconds and nanos must have the same sign {got}")
    total_ns = seconds * 1_000_000_000 + nanos
    if not GO_DURATION_NS_MIN <= total_ns <= GO_DURATION_NS_MAX:
        raise ValidationError(
            f"must be in [{_fmt_duration(GO_DURATION_NS_MIN)}, {_fmt_duration(GO_DURATION_NS_MAX)}]"
            f" (Go's time.Duration) (got {_fmt_duration(total_ns)})"
        )


# Every codec but INVALID; fixed by the protocol (built once: this is on the append path).
_CODECS: Final = frozenset(v for _, v in pb.CompressionCodec.items() if v != pb.INVALID)


def validate_compression_codec(codec: int) -> None:
    if codec not in _CODECS:
        codecs = dict(pb.CompressionCodec.items())
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
    for name in ("refresh_interval", "retention", "flush_interval"):
        with at(name):
            validate_duration(getattr(fragment, name))
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
    # Retention needs no check beyond being a duration: every value is meaningful (<= 0 keeps
    # fragments forever).


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
    # Gazette's rule; a postfix is also parsed back from store listings (fragment/naming.py).
    with at("path_postfix"):
        validate_path_component(fragment.path_postfix, 0, JOURNAL_NAME_LEN_MAX)


def validate_offsets(offsets: Mapping[str, int]) -> None:
    """A map of journal to offset (read_through and the like): valid names, offsets >= 0."""
    for journal, offset in offsets.items():
        with at(f"[{journal}]"):
            validate_journal_name(journal)
            check_min(offset, 0)


# --- Path postfix templates ---------------------------------------------------------------------


def validate_path_postfix_template(template: str) -> None:
    """A Go text/template of the subset brokers evaluate (`broker/protocol/path_postfix.py`), that
    evaluates over Go's zero values, as Gazette checks, to text allowed in a path. Templates
    outside the subset (functions, pipelines, range / with, ...) are refused here, when a spec
    is applied, rather than failing every persist of the journal's fragments later."""
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
        check_count(spec.hint_backups, "hint backups", "hint_backups_max", limits.hint_backups_max)
    with at("max_txn_duration"):
        validate_duration(spec.max_txn_duration)
    with at("min_txn_duration"):
        validate_duration(spec.min_txn_duration)
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
        _check_label_value(spec.labels, gl.CHECKPOINT_AHEAD, gl.CHECKPOINT_AHEAD_POLICIES)
        # "id" is the meta-label selectors use to pick a shard by ID.
        _check_reserved_labels(spec.labels, gl.SHARD_RESERVED_LABELS)
    with at("sources"):
        check_count(len(spec.sources), "sources", "shard_sources_max", limits.shard_sources_max)
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
