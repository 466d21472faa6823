"""Limits on the sizes a request controls (broker/protocol/limits.py): each refused with a
message naming the limit and the field path, each boundary value still accepted; and label and
register operations that stay near-linear, so that sets at the limits cost a broker nothing.

Tables of malformed inputs go through every validator a request meets on its way in: journal
and shard specs, List / Apply requests (journals and shards), Append's register sets, selectors
as strings and as messages.
"""

from __future__ import annotations

import re
import string
import sys
import time
from collections.abc import Callable

import pytest
from google.protobuf.duration_pb2 import Duration
from hypothesis import example, given, settings
from hypothesis import strategies as st

from broker.append_api import validate_append_request
from broker.list_apply_api import validate_apply_request, validate_list_request
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol.limits import (
    hint_backups_max,
    labels_per_set_max,
    selector_chars_max,
    shard_sources_max,
)
from broker.protocol.selector import SelectorError, matches, parse_selector
from broker.protocol.validate import (
    LABEL_NAME_LEN_MAX,
    LABEL_VALUE_LEN_MAX,
    PATH_SYMBOLS,
    TOKEN_SYMBOLS,
    ValidationError,
    at,
    is_letter_or_number,
    validate_journal_spec,
    validate_label,
    validate_label_selector,
    validate_label_set,
    validate_shard_spec,
    validate_token,
)
from gazette_consumer import shard_specs_api


def _labels(count: int, name: str = "tag", value_len: int = 8) -> pb.LabelSet:
    """`count` distinct, sorted labels (valid on their own)."""
    return pb.LabelSet(
        labels=[pb.Label(name=f"{name}-{i:06d}", value="v" * value_len) for i in range(count)]
    )


def _journal(labels: pb.LabelSet | None = None) -> pb.JournalSpec:
    spec = pb.JournalSpec(
        name="limits/journal",
        replication=1,
        fragment=pb.JournalSpec.Fragment(
            length=1 << 20, compression_codec=pb.NONE, refresh_interval=Duration(seconds=30)
        ),
    )
    if labels is not None:
        spec.labels.CopyFrom(labels)
    return spec


def _shard(**fields: object) -> cpb.ShardSpec:
    spec = cpb.ShardSpec(id="shard-000", max_txn_duration=Duration(seconds=1))
    spec.MergeFrom(cpb.ShardSpec(**fields))  # type: ignore[arg-type]
    return spec


def _sources(count: int) -> list[cpb.ShardSpec.Source]:
    return [cpb.ShardSpec.Source(journal=f"limits/source-{i:06d}") for i in range(count)]


OVER = labels_per_set_max + 1
OVER_LABELS = f"{OVER} labels exceed labels_per_set_max ({labels_per_set_max})"


# Each case: what is validated, and the exact message (the path, the count, the named limit).
REFUSED: list[tuple[str, Callable[[], object], str]] = [
    (
        "journal labels",
        lambda: validate_journal_spec(_journal(_labels(OVER))),
        f"labels: {OVER_LABELS}",
    ),
    (
        "journal labels, ten thousand",
        lambda: validate_journal_spec(_journal(_labels(10_000))),
        f"labels: 10000 labels exceed labels_per_set_max ({labels_per_set_max})",
    ),
    (
        "shard labels",
        lambda: validate_shard_spec(_shard(labels=_labels(OVER))),
        f"labels: {OVER_LABELS}",
    ),
    (
        "shard sources",
        lambda: validate_shard_spec(_shard(sources=_sources(shard_sources_max + 1))),
        f"sources: {shard_sources_max + 1} sources exceed shard_sources_max ({shard_sources_max})",
    ),
    (
        "shard hint backups",
        lambda: validate_shard_spec(
            _shard(
                recovery_log_prefix="limits/recovery",
                hint_prefix="/limits/hints",
                hint_backups=hint_backups_max + 1,
            )
        ),
        f"hint_backups: {hint_backups_max + 1} hint backups exceed hint_backups_max"
        f" ({hint_backups_max})",
    ),
    (
        "selector include",
        lambda: validate_label_selector(pb.LabelSelector(include=_labels(OVER))),
        f"include: {OVER_LABELS}",
    ),
    (
        "selector exclude",
        lambda: validate_label_selector(pb.LabelSelector(exclude=_labels(OVER))),
        f"exclude: {OVER_LABELS}",
    ),
    (
        "List selector",
        lambda: validate_list_request(
            pb.ListRequest(selector=pb.LabelSelector(include=_labels(OVER)))
        ),
        f"selector.include: {OVER_LABELS}",
    ),
    (
        "Apply upsert",
        lambda: validate_apply_request(
            pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=_journal(_labels(OVER)))])
        ),
        f"changes[0].upsert.labels: {OVER_LABELS}",
    ),
    (
        "shard List selector",
        lambda: shard_specs_api.validate_list_request(
            cpb.ListRequest(selector=pb.LabelSelector(exclude=_labels(OVER)))
        ),
        f"selector.exclude: {OVER_LABELS}",
    ),
    (
        "shard Apply upsert",
        lambda: shard_specs_api.validate_apply_request(
            cpb.ApplyRequest(changes=[cpb.ApplyRequest.Change(upsert=_shard(labels=_labels(OVER)))])
        ),
        f"changes[0].upsert.labels: {OVER_LABELS}",
    ),
    (
        "Append union_registers",
        lambda: validate_append_request(
            pb.AppendRequest(journal="limits/journal", union_registers=_labels(10_000))
        ),
        f"union_registers: 10000 labels exceed labels_per_set_max ({labels_per_set_max})",
    ),
    (
        "Append subtract_registers",
        lambda: validate_append_request(
            pb.AppendRequest(journal="limits/journal", subtract_registers=_labels(OVER))
        ),
        f"subtract_registers: {OVER_LABELS}",
    ),
    (
        "Append check_registers",
        lambda: validate_append_request(
            pb.AppendRequest(
                journal="limits/journal",
                check_registers=pb.LabelSelector(include=_labels(OVER)),
            )
        ),
        f"check_registers.include: {OVER_LABELS}",
    ),
    (
        "label name length (Gazette's)",
        lambda: validate_label_set(
            pb.LabelSet(labels=[pb.Label(name="n" * (LABEL_NAME_LEN_MAX + 1), value="v")])
        ),
        f'labels[0].name: length must be in [2, 64] bytes (got 65: "{"n" * 65}")',
    ),
    (
        "label value length (Gazette's)",
        lambda: validate_label_set(
            pb.LabelSet(labels=[pb.Label(name="nn", value="v" * (LABEL_VALUE_LEN_MAX + 1))])
        ),
        f'labels[0].value: length must be in [0, 1024] bytes (got 1025: "{"v" * 80}...")',
    ),
]


@pytest.mark.parametrize(("what", "call", "message"), REFUSED, ids=[c[0] for c in REFUSED])
def test_over_a_limit_is_refused_naming_the_limit_and_field(
    what: str, call: Callable[[], object], message: str
) -> None:
    with pytest.raises(ValidationError) as info:
        call()
    assert str(info.value) == message, what


def test_values_at_the_limits_are_accepted() -> None:
    big = _labels(labels_per_set_max, value_len=LABEL_VALUE_LEN_MAX)
    validate_journal_spec(_journal(big))
    validate_shard_spec(_shard(labels=big, sources=_sources(shard_sources_max)))
    validate_shard_spec(
        _shard(
            recovery_log_prefix="limits/recovery",
            hint_prefix="/limits/hints",
            hint_backups=hint_backups_max,
        )
    )
    validate_label_selector(pb.LabelSelector(include=big, exclude=big))
    validate_append_request(
        pb.AppendRequest(
            journal="limits/journal",
            check_registers=pb.LabelSelector(include=big, exclude=big),
            union_registers=big,
            subtract_registers=big,
        )
    )


def test_a_selector_string_over_its_limit_is_refused_before_parsing() -> None:
    text = "a" * (selector_chars_max + 1)
    with pytest.raises(SelectorError) as info:
        parse_selector(text)
    assert str(info.value) == (
        f"{selector_chars_max + 1} characters exceed selector_chars_max ({selector_chars_max})"
    )
    # At the limit it parses (here: one existence term of a long name, refused as a name).
    with pytest.raises(SelectorError, match=r"include\.labels\[0\]\.name: length must be"):
        parse_selector("a" * selector_chars_max)


def test_the_token_alphabet_is_unicode_letters_numbers_and_symbols_exactly() -> None:
    """The regular expression that validates tokens in one pass agrees with the per-character
    rule (Go's unicode.IsLetter / IsNumber) on every code point."""
    everything = "".join(map(chr, range(sys.maxunicode + 1)))
    accepted = "".join(ch for ch in everything if is_letter_or_number(ch))
    for symbols in (TOKEN_SYMBOLS, PATH_SYMBOLS):
        kept = [ch for ch in everything if is_letter_or_number(ch) or ch in symbols]
        # One token of every accepted character: accepted in chunks of the maximum length.
        for start in range(0, len(kept), 256):
            validate_token("".join(kept[start : start + 256]), 0, 1 << 20, symbols)
    rejected = [
        ch
        for ch in everything[:0x3000] + everything[0xF900:0x10000]
        if not is_letter_or_number(ch) and ch not in PATH_SYMBOLS
    ]
    for ch in rejected:
        with pytest.raises(ValidationError, match="must be only letters"):
            validate_token("ab" + ch, 0, 16, PATH_SYMBOLS)
    assert accepted  # The sweep covered letters and numbers.
    ascii_token = string.ascii_letters + string.digits + PATH_SYMBOLS
    validate_token(ascii_token, 0, 1024, PATH_SYMBOLS)
    for ch in map(chr, range(128)):
        if ch not in ascii_token:
            with pytest.raises(ValidationError, match="must be only letters"):
                validate_token(ascii_token + ch, 0, 1024, PATH_SYMBOLS)


# --- Label and register operations stay near-linear -----------------------------------------


def test_label_operations_on_large_sets_are_near_linear() -> None:
    """Building, uniting and matching sets of thousands of labels takes milliseconds: with a
    per-element insert (quadratic) the same work took tens of seconds. The bound is 100 times
    what near-linear work needs here, so it is not a timing-sensitive test."""
    count = 8192
    pairs = [(f"name-{(i * 7919) % count:06d}", f"value-{i % 3}") for i in range(count)]
    started = time.perf_counter()
    built = gl.label_set(pairs)
    other = gl.label_set((f"other-{i:06d}", "x") for i in range(count))
    united = gl.union(built, other)
    selector = parse_selector("name-004096, other-000001=x, !missing")
    selected = sum(matches(selector, united) for _ in range(1000))
    elapsed = time.perf_counter() - started
    assert len(built.labels) == len(set(pairs))
    assert len(united.labels) == len(built.labels) + count
    assert selected == 1000
    assert elapsed < 2.0, f"{elapsed:.2f}s"


_NAMES = st.sampled_from(["aa", "bb", "cc", "Zz", "name", "prefix"])
_VALUES = st.text("xy=%", max_size=3)


def _reference_union(
    lhs: list[tuple[str, str]], rhs: list[tuple[str, str]]
) -> list[tuple[str, str]]:
    names = {name for name, _ in lhs}
    return sorted(set(lhs) | {(n, v) for n, v in rhs if n not in names})


@settings(max_examples=200)
@given(st.lists(st.tuples(_NAMES, _VALUES)), st.lists(st.tuples(_NAMES, _VALUES)))
def test_union_is_the_reference_union(
    lhs: list[tuple[str, str]], rhs: list[tuple[str, str]]
) -> None:
    left, right = gl.label_set(lhs), gl.label_set(rhs)
    united = gl.union(left, right)
    assert [(lb.name, lb.value) for lb in united.labels] == _reference_union(lhs, rhs)


@settings(max_examples=200)
@given(st.lists(st.tuples(_NAMES, _VALUES)), st.lists(st.tuples(_NAMES, _VALUES)))
def test_matching_with_meta_labels_is_matching_their_union(
    labels: list[tuple[str, str]], meta: list[tuple[str, str]]
) -> None:
    label_set, meta_set = gl.label_set(labels), gl.label_set(meta)
    united = gl.union(meta_set, label_set)
    for text in ("aa", "!bb", "name=x", "prefix:prefix=x", "cc in (x, y)", "Zz notin (x)"):
        selector = parse_selector(text)
        assert matches(selector, label_set, meta=meta_set) == matches(selector, united), text


def _reference_matches(
    include: list[tuple[str, str, bool]],
    exclude: list[tuple[str, str, bool]],
    pairs: list[tuple[str, str]],
) -> bool:
    """Selector semantics, naively: a label (name, value, prefix) matches a set when the set
    has the name with that value (any value if empty; a value it begins, if prefix)."""

    def hit(name: str, value: str, prefix: bool) -> bool:
        return any(
            n == name and (value == "" or (v.startswith(value) if prefix else v == value))
            for n, v in pairs
        )

    if any(hit(*label) for label in exclude):
        return False
    names = {name for name, _, _ in include}
    return all(any(hit(*label) for label in include if label[0] == name) for name in names)


_SELECTOR_LABELS = st.lists(
    st.tuples(_NAMES, st.text("xy=%", min_size=1, max_size=3), st.booleans()), max_size=40
)


@settings(max_examples=200)
@given(
    st.lists(st.tuples(_NAMES, _VALUES), max_size=60),
    _SELECTOR_LABELS,
    _SELECTOR_LABELS,
    st.lists(_NAMES, max_size=2),
)
def test_matching_is_the_reference_for_selectors_and_sets_of_any_size(
    pairs: list[tuple[str, str]],
    include: list[tuple[str, str, bool]],
    exclude: list[tuple[str, str, bool]],
    any_value: list[str],
) -> None:
    """Small and large selectors against small and large sets: both ways of looking values
    up (bisection, one-pass index), exact values and prefixes, agree with the naive rule."""
    include = include + [(name, "", False) for name in any_value]

    def side(labels: list[tuple[str, str, bool]]) -> pb.LabelSet:
        unique = {(n, v): p for n, v, p in labels}
        return pb.LabelSet(
            labels=[pb.Label(name=n, value=v, prefix=p) for (n, v), p in sorted(unique.items())]
        )

    selector = pb.LabelSelector(include=side(include), exclude=side(exclude))
    kept_include = [(lb.name, lb.value, lb.prefix) for lb in selector.include.labels]
    kept_exclude = [(lb.name, lb.value, lb.prefix) for lb in selector.exclude.labels]
    label_set = gl.label_set(pairs)
    expected = _reference_matches(kept_include, kept_exclude, sorted(set(pairs)))
    assert matches(selector, label_set) == expected


def _label_by_label(labels: list[pb.Label], in_selector: bool) -> str | None:
    """The first error of `labels` checked one by one (None if valid): validate_label_set's
    rules, written the plain way."""
    for index, label in enumerate(labels):
        try:
            with at(f"labels[{index}]"):
                validate_label(label, in_selector=in_selector)
                if index:
                    previous = labels[index - 1]
                    if (previous.name, previous.value) >= (label.name, label.value) or (
                        previous.name == label.name and previous.value == ""
                    ):
                        raise ValidationError("out of order or mixed")
        except ValidationError as err:
            return str(err)
    return None


_LABEL_TEXT = st.text("ab9-_+/.=%:#é \x00", max_size=6) | st.sampled_from(
    ["a" * 63, "a" * 64, "a" * 65, "é" * 32, "é" * 33]
)
_LONG_VALUES = st.sampled_from(["v" * 1024, "v" * 1025, "é" * 512, "é" * 513, "v" * 1023 + "#"])


@settings(max_examples=200)
@given(
    st.lists(st.tuples(_LABEL_TEXT, _LABEL_TEXT | _LONG_VALUES, st.booleans()), max_size=8),
    st.booleans(),
    st.booleans(),
)
# A NUL inside a name or value (the bulk check joins them with NUL): found by this test.
@example(triples=[("9\x00", "", False)], ordered=False, in_selector=False)
@example(triples=[("aa", "x", False), ("bb", "\x00y", False)], ordered=True, in_selector=False)
def test_bulk_label_validation_agrees_with_label_by_label(
    triples: list[tuple[str, str, bool]], ordered: bool, in_selector: bool
) -> None:
    """The bulk check of validate_label_set (ASCII sets, in a few passes) accepts exactly the
    sets the label-by-label rules accept, and a refused set gets the label-by-label message."""
    if ordered:
        unique = {(name, value): prefix for name, value, prefix in triples}
        triples = [(name, value, prefix) for (name, value), prefix in sorted(unique.items())]
    labels = [pb.Label(name=n, value=v, prefix=p) for n, v, p in triples]
    expected = _label_by_label(labels, in_selector)
    try:
        validate_label_set(pb.LabelSet(labels=labels), in_selector=in_selector)
    except ValidationError as err:
        assert expected is not None, str(err)
        if "out of order or mixed" not in expected:
            assert str(err) == expected
    else:
        assert expected is None


def test_error_messages_never_echo_a_whole_huge_value() -> None:
    value = "v" * (LABEL_VALUE_LEN_MAX * 4)
    with pytest.raises(ValidationError) as info:
        validate_label_set(pb.LabelSet(labels=[pb.Label(name="nn", value=value)]))
    assert len(str(info.value)) < 200
    assert re.search(r"got 4096", str(info.value))
