"""Gazette's label-selector strings: parse, format and match.

A selector is a comma-separated list of terms, each constraining one label name:

    name=value   name==value      include: the label has this value
    name!=value                   exclude: the label does not have this value
    name in (v1, v2)              include: the label has one of these values
    name notin (v1, v2)           exclude: the label has none of them ("not in" also works)
    name                          include: the label exists, with any value
    !name                         exclude: the label does not exist
    name:prefix=v, name:prefix in (...), ...   as above, matching values beginning with v

It parses into a LabelSelector message: `include` and `exclude` LabelSets, where an empty value
means "any value" and `prefix` marks a prefix match. A LabelSet is selected when it matches
every name of `include` (any one value of a name suffices) and nothing of `exclude`.

Gazette's grammar is a set of regular expressions tolerant of single spaces; this parser accepts
any whitespace between tokens, and values of one character, so it reads every string Gazette
reads. `format_selector` writes the canonical form: terms without spaces, in label order.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable
from itertools import groupby
from typing import NamedTuple

from broker.protocol import limits
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import PREFIX_SUFFIX, values_of
from broker.protocol.validate import (
    PATH_SYMBOLS,
    TOKEN_SYMBOLS,
    ValidationError,
    check_count,
    is_letter_or_number,
    validate_label_selector,
)


class SelectorError(ValidationError):
    """A selector string that does not parse, or parses into an invalid LabelSelector.

    `position` is the offset in the string where parsing failed (None for validation failures,
    whose context path names the offending label instead)."""

    def __init__(self, rule: str, *context: str, position: int | None = None) -> None:
        self.position = position
        super().__init__(rule, *context)


class _Label(NamedTuple):
    name: str
    value: str
    prefix: bool


def _is_name_char(ch: str) -> bool:
    return is_letter_or_number(ch) or ch in TOKEN_SYMBOLS


def _is_value_char(ch: str) -> bool:
    return is_letter_or_number(ch) or ch in PATH_SYMBOLS


class _Scanner:
    """A cursor over the selector string; every error names the offset and what was expected."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def at_end(self) -> bool:
        return self.pos >= len(self.text)

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def skip_space(self) -> bool:
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1
        return self.pos != start

    def take(self, literal: str) -> bool:
        if self.text.startswith(literal, self.pos):
            self.pos += len(literal)
            return True
        return False

    def take_keyword(self, word: str) -> bool:
        """`word`, when not followed by more name characters (so "inner" is not "in")."""
        end = self.pos + len(word)
        if self.text.startswith(word, self.pos) and not (
            end < len(self.text) and _is_name_char(self.text[end])
        ):
            self.pos = end
            return True
        return False

    def take_run(self, accept: Callable[[str], bool], expected: str) -> str:
        start = self.pos
        while self.pos < len(self.text) and accept(self.text[self.pos]):
            self.pos += 1
        if self.pos == start:
            raise self.error(expected)
        return self.text[start : self.pos]

    def error(self, expected: str) -> SelectorError:
        if self.at_end():
            got = "end of selector"
        else:
            shown_chars_max = 16
            rest = self.text[self.pos : self.pos + shown_chars_max]
            got = repr(rest + ("..." if len(self.text) - self.pos > shown_chars_max else ""))
        return SelectorError(
            f"expected {expected} at offset {self.pos} (got {got})", position=self.pos
        )


_NAME = "a label name"
_VALUE = "a label value"


def _parse_set(scan: _Scanner, name: str, prefix: bool) -> list[_Label]:
    """The parenthesized value list of `in` / `notin`; a trailing comma is tolerated."""
    scan.skip_space()
    if not scan.take("("):
        raise scan.error("'('")
    out: list[_Label] = []
    while True:
        scan.skip_space()
        out.append(_Label(name, scan.take_run(_is_value_char, _VALUE), prefix))
        scan.skip_space()
        if scan.take(")"):
            return out
        if not scan.take(","):
            raise scan.error("',' or ')'")
        scan.skip_space()
        if scan.take(")"):
            return out


def _parse_term(scan: _Scanner, include: list[_Label], exclude: list[_Label]) -> None:
    if scan.take("!"):
        scan.skip_space()
        exclude.append(_Label(scan.take_run(_is_name_char, _NAME), "", False))
        return

    name = scan.take_run(_is_name_char, _NAME)
    prefix = scan.take(PREFIX_SUFFIX)
    spaced = scan.skip_space()

    if scan.take("!="):
        scan.skip_space()
        exclude.append(_Label(name, scan.take_run(_is_value_char, _VALUE), prefix))
    elif scan.take("="):
        scan.take("=")  # "==" is a synonym of "=".
        scan.skip_space()
        include.append(_Label(name, scan.take_run(_is_value_char, _VALUE), prefix))
    elif spaced and scan.take_keyword("in"):
        include.extend(_parse_set(scan, name, prefix))
    elif spaced and scan.take_keyword("notin"):
        exclude.extend(_parse_set(scan, name, prefix))
    elif spaced and scan.take_keyword("not"):
        scan.skip_space()
        if not scan.take_keyword("in"):
            raise scan.error("'in' after 'not'")
        exclude.extend(_parse_set(scan, name, prefix))
    elif prefix:
        raise scan.error("'=', '!=', 'in' or 'notin' after ':prefix'")
    elif scan.at_end() or scan.peek() == ",":
        include.append(_Label(name, "", False))  # Existence.
    else:
        raise scan.error("'=', '==', '!=', 'in', 'notin', ',' or end of selector")


def _to_label_set(labels: Iterable[_Label]) -> pb.LabelSet:
    # Sorted over (name, value) as a LabelSet must be; duplicates are kept so that validation
    # reports them rather than silently merging a user's repeated term.
    ordered = sorted(labels)
    return pb.LabelSet(
        labels=[pb.Label(name=lb.name, value=lb.value, prefix=lb.prefix) for lb in ordered]
    )


def parse_selector(text: str) -> pb.LabelSelector:
    """Parse a selector string into a validated LabelSelector, or raise SelectorError. A string
    longer than `selector_chars_max` is refused before parsing."""
    try:
        check_count(len(text), "characters", "selector_chars_max", limits.selector_chars_max)
    except ValidationError as err:
        raise SelectorError(err.rule, position=limits.selector_chars_max) from None
    scan = _Scanner(text)
    include: list[_Label] = []
    exclude: list[_Label] = []
    scan.skip_space()
    while not scan.at_end():
        _parse_term(scan, include, exclude)
        scan.skip_space()
        if scan.at_end():
            break
        if not scan.take(","):
            raise scan.error("',' or end of selector")
        scan.skip_space()

    selector = pb.LabelSelector(include=_to_label_set(include), exclude=_to_label_set(exclude))
    try:
        validate_label_selector(selector)
    except ValidationError as err:
        raise SelectorError(err.rule, *err.context) from err
    return selector


def _format_labels(labels: Iterable[pb.Label], exclude: bool) -> list[str]:
    terms: list[str] = []
    for name, group in groupby(labels, key=lambda label: label.name):
        members = list(group)
        if len(members) == 1 and members[0].value == "":
            # The empty value means "any value", with or without a prefix flag.
            terms.append(("!" if exclude else "") + name)
            continue
        for prefix in (False, True):
            values = [label.value for label in members if label.prefix == prefix]
            key = name + (PREFIX_SUFFIX if prefix else "")
            # "k==v" is a synonym of "k=v", so an included value beginning with '=' must be
            # written in set form to survive a round trip ("k in (=v)", not "k==v").
            if len(values) == 1 and (exclude or not values[0].startswith("=")):
                terms.append(key + ("!=" if exclude else "=") + values[0])
            elif values:
                terms.append(f"{key} {'notin' if exclude else 'in'} ({','.join(values)})")
    return terms


def format_selector(selector: pb.LabelSelector) -> str:
    """The canonical string of a selector: parse_selector(format_selector(s)) == s for every
    valid selector whose prefix labels have non-empty values."""
    terms = _format_labels(selector.include.labels, exclude=False)
    terms += _format_labels(selector.exclude.labels, exclude=True)
    return ",".join(terms)


def _name_matches(wanted: Iterable[pb.Label], values: list[str]) -> bool:
    """Whether any of the selector labels `wanted` (all of one name) matches one of `values`
    (that name's values in the set, sorted)."""
    if not values:
        return False
    for label in wanted:
        if label.value == "":
            return True  # Any value.
        if label.prefix:
            index = bisect_left(values, label.value)
            if index < len(values) and values[index].startswith(label.value):
                return True
        elif label.value in values:
            return True
    return False


def _bisected_matches(selector: pb.LabelSelector, sets: list[pb.LabelSet]) -> bool:
    """`matches` for a selector of few labels: each name's values found by bisecting the sets
    (the first set that has the name gives them), whatever their size."""

    def values(name: str) -> list[str]:
        for labels in sets:
            found = values_of(labels, name)
            if found:
                return found
        return []

    for name, group in groupby(selector.exclude.labels, key=lambda label: label.name):
        if _name_matches(group, values(name)):
            return False
    for name, group in groupby(selector.include.labels, key=lambda label: label.name):
        if not _name_matches(group, values(name)):
            return False
    return True


class _Indexed:
    """The labels of the sets (the first that has a name gives its values), indexed in one pass
    for a selector of many labels: exact values and names by hashing, prefixes by bisecting
    the (sorted) values of their name."""

    def __init__(self, sets: list[pb.LabelSet]) -> None:
        pairs: list[tuple[str, str]] = []
        seen: set[str] = set()
        for labels in sets:
            these = [(label.name, label.value) for label in labels.labels]
            pairs += [pair for pair in these if pair[0] not in seen] if seen else these
            seen.update(name for name, _ in these)
        self._pairs = set(pairs)
        self._names = seen
        self._ordered = pairs
        self._by_name: dict[str, list[str]] | None = None

    def hit(self, name: str, value: str, prefix: bool) -> bool:
        if value == "":
            return name in self._names
        if not prefix:
            return (name, value) in self._pairs
        if self._by_name is None:
            self._by_name = {}
            for pair_name, pair_value in self._ordered:
                self._by_name.setdefault(pair_name, []).append(pair_value)
        values = self._by_name.get(name, [])
        index = bisect_left(values, value)
        return index < len(values) and values[index].startswith(value)


def _indexed_matches(selector: pb.LabelSelector, sets: list[pb.LabelSet]) -> bool:
    index = _Indexed(sets)
    for label in selector.exclude.labels:
        if index.hit(label.name, label.value, label.prefix):
            return False
    wanted: set[str] = set()
    found: set[str] = set()
    for label in selector.include.labels:
        name = label.name
        wanted.add(name)
        if name not in found and index.hit(name, label.value, label.prefix):
            found.add(name)
    return found == wanted


def matches(
    selector: pb.LabelSelector, label_set: pb.LabelSet, meta: pb.LabelSet | None = None
) -> bool:
    """Whether `label_set` is selected: every included name is matched by at least one of its
    selector values, and no excluded label is matched.

    `meta` are meta-labels (labels.journal_meta_labels, shard_meta_labels): where `meta` has a
    name, its values are those matched, as if matching `labels.union(meta, label_set)`, without
    building that union. Both sets must be valid (sorted). The cost is near-linear in the sizes
    of the selector and the sets, and follows the selector's alone when it is much the smaller
    (a List matching many journals' labels)."""
    sets = [label_set] if meta is None else [meta, label_set]
    terms = len(selector.include.labels) + len(selector.exclude.labels)
    size = sum(len(labels.labels) for labels in sets)
    if terms * max(1, size.bit_length()) <= size:
        return _bisected_matches(selector, sets)
    return _indexed_matches(selector, sets)
